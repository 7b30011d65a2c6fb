#include "harness/parallel/threads.h"

#include <dlfcn.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>

namespace optcc {

void set_cpu_threads(int64_t n) {
  const int threads = static_cast<int>(std::max<int64_t>(1, n));
  at::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto* set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_blas(threads);
  }
}

void ensure_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);
  // execv failed (no /proc?): carry on with spinning workers; only speed is affected.
}

}  // namespace optcc

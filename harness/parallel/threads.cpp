#include "harness/parallel/threads.h"

#include "harness/parallel/stop_signal.h"

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

void ensure_process_start(char** argv) {
  const bool omp_set = std::getenv("OMP_WAIT_POLICY") != nullptr;
  if (omp_set && stop_signals_blocked()) return;
  if (!omp_set) setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  block_stop_signals();  // kept through execv: the new image's library threads start with it
  execv("/proc/self/exe", argv);
  // execv failed (no /proc?): carry on. Workers may spin; a thread a library started before main()
  // may take a stop signal, which then only records it (stop_signal.h).
}

}  // namespace optcc

#include "harness/parallel/allocator.h"

#include <fmt/format.h>

#include <sys/types.h>

#ifdef OPTCC_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>

// Read by jemalloc when it initialises (allocator.h says why these values).
extern "C" {
const char* malloc_conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0";
}
#endif

namespace optcc {

std::string cpu_allocator() {
#ifdef OPTCC_HAVE_JEMALLOC
  const char* version = nullptr;
  size_t size = sizeof(version);
  if (mallctl("version", &version, &size, nullptr, 0) != 0 || version == nullptr) return "jemalloc (version unknown)";
  std::string v = version;
  if (const auto dash = v.find('-'); dash != std::string::npos) v.resize(dash);
  ssize_t decay = 0;
  size = sizeof(decay);
  if (mallctl("opt.dirty_decay_ms", &decay, &size, nullptr, 0) == 0 && decay >= 0) {
    return fmt::format("jemalloc {} (freed pages purged after {} ms: MALLOC_CONF)", v, decay);
  }
  return "jemalloc " + v + " (freed pages kept for reuse)";
#else
  return "glibc malloc";
#endif
}

}  // namespace optcc

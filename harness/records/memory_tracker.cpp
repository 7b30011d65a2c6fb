// Tensor memory from LibTorch's allocation reports (see memory_tracker.h).
#include "harness/records/memory_tracker.h"

namespace optcc {

std::unique_ptr<c10::DebugInfoGuard> MemoryTracker::install(const std::shared_ptr<MemoryTracker>& tracker) {
  return std::make_unique<c10::DebugInfoGuard>(c10::DebugInfoKind::PROFILER_STATE, tracker);
}

void MemoryTracker::reportMemoryUsage(void*, int64_t, AllocatorTotal total_allocated, AllocatorTotal, c10::Device device) {
  // The allocators report their own totals: keep CPU and accelerator apart, sum them.
  (device.is_cpu() ? cpu_ : accelerator_).store(static_cast<int64_t>(total_allocated));
  const int64_t now = cpu_.load() + accelerator_.load();
  allocated_.store(now);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace optcc

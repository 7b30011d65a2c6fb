// MemoryTracker: bytes of tensor memory this process holds, and the peak, from LibTorch's own
// allocation reports (c10::MemoryReportingInfoBase, the hook the autograd profiler uses), so that
// Fig. 12 style numbers (docs/design.md §8.3: memory per rank by component) are measured, not estimated.
//
// Who calls what: one tracker per rank, installed on the training thread with install() before
// the model is built; LibTorch propagates it to its intra-op and autograd threads. CPU tensors
// report through the default CPU allocator; CUDA tensors through the caching allocator (its
// "allocated" figure). Memory allocated before install() is not seen (a warning from LibTorch
// may say so once, when such a block is freed). Caveat, measured on CPU: a block allocated on a
// reporting thread but freed on a thread without the reporter (e.g. a Gloo worker after an async
// send) is never subtracted, so allocated() drifts upward over a run and absolute peaks are upper
// bounds; differences over a short window (the activation peak of one schedule) are reliable. Not thread-safe across ranks-as-threads: the CPU
// allocator keeps one process-wide total, so tests with several ranks in one process see the sum.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "compat/torch_compat.h"

namespace optcc {

class MemoryTracker : public c10::MemoryReportingInfoBase {
 public:
  /// Makes `tracker` the current thread's memory reporter until the returned guard dies.
  static std::unique_ptr<c10::DebugInfoGuard> install(const std::shared_ptr<MemoryTracker>& tracker);

  /// LibTorch's hook, called on every allocation and free (alloc_size < 0) with the allocator's
  /// totals in bytes (AllocatorTotal: int64_t in LibTorch 1.13, size_t in 2.x; compat/torch_compat.h).
  void reportMemoryUsage(void* ptr, int64_t alloc_size, AllocatorTotal total_allocated, AllocatorTotal total_reserved,
                         c10::Device device) override;
  bool memoryProfilingEnabled() const override { return true; }

  /// Bytes currently allocated (CPU plus accelerator allocator totals at their last reports), and
  /// the peak since the last reset_peak(), in bytes.
  int64_t allocated() const { return allocated_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(allocated_.load()); }

 private:
  std::atomic<int64_t> cpu_{0};
  std::atomic<int64_t> accelerator_{0};
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace optcc

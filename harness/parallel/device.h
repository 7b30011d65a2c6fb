// The accelerator side of the parallel layer: NCCL process groups and CUDA-event timing. Declared in
// every build; defined for real in device_cuda.cpp, which CMake compiles only when OPTCC_CUDA is on
// (compat/torch_compat.h: kBuiltWithCuda), and by device_cpu.cpp otherwise, whose functions throw a
// std::logic_error naming the build instead of attempting what it cannot run. Config validation
// refuses parallel.backend: nccl in a CPU build before any rank starts, so the CPU definitions are a
// second line, never reached by a valid run.
//
// CUDA-only sources are named *_cuda.cpp: scripts/cuda/compile_check.sh compiles each of them against
// a CUDA LibTorch's headers on machines without a GPU, so they cannot rot.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "compat/torch_compat.h"

namespace optcc {

/// A ProcessGroupNCCL over the ranks that share `store` under `prefix`, on GPU `device_index` of this
/// process (its local rank on a node of several GPUs). `rank`/`size` are group ranks; every member
/// calls it with the same prefix. Collectives and point-to-point operations then run on NCCL's own
/// streams, ordered after the work queued on the caller's current stream (c10d's contract), so compute
/// and communication overlap as in Megatron-LM. NCCL takes one rank per GPU: two ranks of one group
/// on one GPU are refused by NCCL at the first operation (use parallel.backend: gloo for that).
/// Throws std::runtime_error naming the group and GPU when NCCL cannot start, and
/// std::logic_error in a build without CUDA.
ProcessGroupPtr make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                                int size, int device_index, std::chrono::milliseconds timeout);

/// Number of CUDA devices this process sees (0 in a build without CUDA or on a machine without a GPU).
int cuda_device_count();

/// Times a span of work queued on a CUDA stream, from two CUDA events: start() records the first on
/// the current stream of `device_index`, stop() the second; seconds() waits for the second and
/// returns the GPU time between them, in seconds. Host clocks would time the launch, not the work.
/// In a build without CUDA, constructing one throws std::logic_error.
class DeviceTimer {
 public:
  explicit DeviceTimer(int device_index);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;
  void start();
  void stop();
  double seconds();  // blocks until stop()'s event has completed

 private:
  struct Events;
  std::unique_ptr<Events> events_;
};

}  // namespace optcc

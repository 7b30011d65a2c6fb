// The accelerator side of the parallel layer: where a rank's tensors live (Placement), NCCL process
// groups and CUDA-event timing. Placement is decided here in every build; the rest is declared in
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
#include <stdexcept>
#include <string>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "compat/torch_compat.h"

namespace optcc {

/// Where one rank's tensors live (model, optimizer state, micro-batches, stage-link buffers,
/// compressor state) and which c10d backend carries them: parallel.device and parallel.backend
/// with "auto" decided.
struct Placement {
  c10::Device device = c10::Device(c10::DeviceType::CPU);  // cpu, or cuda:<GPU index on this node>
  std::string backend = "gloo";                           // "gloo" | "nccl"
  std::string decided;  // one line for the start-up log: what was chosen and why
  bool on_gpu() const { return device.is_cuda(); }
};

/// A placement this build or machine cannot run; its text reads "config error: <key> = <value>:
/// <rule>. Fix: <fix>." (the CLI prints it as a config error, exit code 2).
class PlacementError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Decides parallel.device (auto | cpu | cuda) and parallel.backend (auto | gloo | nccl) for the
/// process with `local_rank` among `local_world_size` processes of its node, which sees
/// `gpus_visible` GPUs, in a build that has CUDA or not. Pure, so its rules are tested in every
/// build; this_rank_placement() feeds it the real build and GPU count. Rules:
///   device auto  -> cuda when the build has CUDA and a GPU is visible, else cpu;
///   device cuda  -> GPU local_rank % gpus_visible (several ranks may share a GPU);
///   backend auto -> nccl when the device is cuda and every local rank has its own GPU, else gloo
///                   (Gloo carries CUDA tensors through host memory; NCCL takes one rank per GPU).
/// Throws PlacementError naming the key, the value, the rule and the fix for an unknown
/// value, cuda or nccl in a build without CUDA, cuda without a visible GPU, nccl on cpu, and nccl
/// with more local ranks than GPUs.
Placement resolve_placement(const std::string& device, const std::string& backend, int local_rank,
                            int local_world_size, int gpus_visible, bool built_with_cuda);

/// resolve_placement for this process: this build (kBuiltWithCuda) and cuda_device_count().
Placement this_rank_placement(const std::string& device, const std::string& backend, int local_rank,
                              int local_world_size);

/// Makes `device` CUDA's current device in this process (ProcessGroupNCCL and CUDA work launched
/// without an explicit device use it); nothing for a CPU device. Throws std::logic_error for a
/// CUDA device in a build without CUDA.
void use_device(const c10::Device& device);

/// Blocks the host until every kernel and copy queued on `device` has finished; nothing on CPU.
/// Host clocks read after it time the GPU's work, not its launch (the Communicator's and the
/// step's seconds on CUDA).
void synchronize(const c10::Device& device);

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

/// Seconds of one span of work on `device`: on a GPU, CUDA events recorded on the current stream
/// (a DeviceTimer), so the host need not drain the device before the span starts and waits only for
/// the span's own end; on the CPU, the steady clock. For work that stays on the current stream
/// (compression kernels, GEMMs). A step or a communication, whose work also runs on NCCL's streams,
/// is timed by synchronize() and the host clock instead, as Megatron-LM's timers do: an event on the
/// current stream does not wait for the other streams.
class SpanTimer {
 public:
  explicit SpanTimer(const c10::Device& device);  // starts the span
  double seconds();                               // ends it; call once

 private:
  std::unique_ptr<DeviceTimer> gpu_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace optcc

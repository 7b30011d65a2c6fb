// device.h's placement rules, in every build (the NCCL groups and CUDA events are in
// device_cuda.cpp / device_cpu.cpp).
#include "harness/parallel/device.h"

#include <torch/cuda.h>

#include <fmt/format.h>

#include <stdexcept>

namespace optcc {
namespace {

[[noreturn]] void refuse(const std::string& key, const std::string& value, const std::string& rule,
                         const std::string& fix) {
  throw PlacementError(fmt::format("config error: {} = {}: {}. Fix: {}.", key, value, rule, fix));
}

}  // namespace

Placement resolve_placement(const std::string& device, const std::string& backend, int local_rank,
                            int local_world_size, int gpus_visible, bool built_with_cuda) {
  if (device != "auto" && device != "cpu" && device != "cuda") {
    refuse("parallel.device", "'" + device + "'", "must be auto, cpu or cuda", "use auto (cuda when this build and "
           "machine have a GPU, else cpu)");
  }
  if (backend != "auto" && backend != "gloo" && backend != "nccl") {
    refuse("parallel.backend", "'" + backend + "'", "must be auto, gloo or nccl",
           "use auto (nccl on GPUs with one rank each, else gloo)");
  }
  const std::string build = build_description(built_with_cuda);
  if (!built_with_cuda && (device == "cuda" || backend == "nccl")) {
    const bool dev = device == "cuda";
    refuse(dev ? "parallel.device" : "parallel.backend", dev ? "'cuda'" : "'nccl'",
           "needs GPUs and optcc's CUDA path, which this binary does not have (" + build + ")",
           std::string(dev ? "set parallel.device: cpu (or auto)" : "set parallel.backend: gloo (or auto)") +
               " to train on CPU ranks; GPUs need optcc built against a CUDA LibTorch (docs/builds.md)");
  }
  Placement p;
  const bool gpu = device == "cuda" || (device == "auto" && built_with_cuda && gpus_visible > 0);
  if (gpu && gpus_visible <= 0) {
    refuse("parallel.device", "'cuda'", "this process sees no GPU (CUDA_VISIBLE_DEVICES, the driver, or Slurm's "
           "--gpus-per-task)", "run on a machine with a visible GPU, or set parallel.device: cpu");
  }
  if (backend == "nccl" && !gpu) {
    refuse("parallel.backend", "'nccl'", "NCCL carries CUDA tensors only, and parallel.device is " + device +
           (device == "auto" ? " (decided: cpu)" : ""), "set parallel.device: cuda, or parallel.backend: gloo");
  }
  const bool own_gpu = gpu && local_world_size <= gpus_visible;
  if (backend == "nccl" && !own_gpu) {
    refuse("parallel.backend", "'nccl'",
           fmt::format("NCCL takes one rank per GPU, and {} ranks on this node share {} GPU(s)", local_world_size,
                       gpus_visible),
           "launch at most one rank per GPU, or set parallel.backend: gloo (Gloo carries CUDA tensors through host "
           "memory)");
  }
  if (gpu) p.device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(local_rank % gpus_visible));
  p.backend = backend == "auto" ? (own_gpu ? "nccl" : "gloo") : backend;
  p.decided = fmt::format("device {}{}, backend {}{}", p.device.str(), device == "auto" ? " (auto)" : "", p.backend,
                          backend == "auto" ? " (auto)" : "");
  if (gpu && !own_gpu) p.decided += fmt::format("; {} local ranks share {} GPU(s)", local_world_size, gpus_visible);
  return p;
}

Placement this_rank_placement(const std::string& device, const std::string& backend, int local_rank,
                              int local_world_size) {
  return resolve_placement(device, backend, local_rank, local_world_size, cuda_device_count(), kBuiltWithCuda);
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

SpanTimer::SpanTimer(const c10::Device& device) {
  if (device.is_cuda()) {
    gpu_ = std::make_unique<DeviceTimer>(device.has_index() ? device.index() : 0);
    gpu_->start();
  } else {
    t0_ = std::chrono::steady_clock::now();
  }
}

double SpanTimer::seconds() {
  if (gpu_) {
    gpu_->stop();
    return gpu_->seconds();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

}  // namespace optcc

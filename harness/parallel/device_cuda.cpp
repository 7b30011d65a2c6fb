// device.h in a CUDA build (OPTCC_CUDA on): ProcessGroupNCCL and CUDA events.
#include "harness/parallel/device.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#ifndef USE_C10D_NCCL  // the header declares ProcessGroupNCCL only under it (LibTorch's CMake targets usually set it)
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <fmt/format.h>

#include <stdexcept>

namespace optcc {

ProcessGroupPtr make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                                int size, int device_index, std::chrono::milliseconds timeout) {
  const int devices = cuda_device_count();
  if (device_index < 0 || device_index >= devices) {
    throw std::runtime_error(fmt::format("NCCL group '{}' (rank {} of {}): GPU {} does not exist, this process sees {} "
                                         "(CUDA_VISIBLE_DEVICES, Slurm's --gpus-per-task)",
                                         prefix, rank, size, device_index, devices));
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));  // NCCL binds the communicator to it
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, opts);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("creating NCCL group '{}' (rank {} of {}, GPU {}) failed: {}", prefix, rank,
                                         size, device_index, e.what()));
  }
}

int cuda_device_count() { return static_cast<int>(c10::cuda::device_count()); }

void use_device(const c10::Device& device) {
  if (device.is_cuda()) c10::cuda::set_device(device.index());
}

struct DeviceTimer::Events {
  explicit Events(int device) : device(device) {}
  int device;
  at::cuda::CUDAEvent begin{cudaEventDefault};  // timing enabled (the default CUDAEvent disables it)
  at::cuda::CUDAEvent end{cudaEventDefault};
};

DeviceTimer::DeviceTimer(int device_index) : events_(std::make_unique<Events>(device_index)) {}
DeviceTimer::~DeviceTimer() = default;

void DeviceTimer::start() {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(events_->device));
  events_->begin.record(at::cuda::getCurrentCUDAStream());
}

void DeviceTimer::stop() {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(events_->device));
  events_->end.record(at::cuda::getCurrentCUDAStream());
}

double DeviceTimer::seconds() {
  events_->end.synchronize();
  return static_cast<double>(events_->begin.elapsed_time(events_->end)) / 1000.0;
}

}  // namespace optcc

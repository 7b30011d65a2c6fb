// device.h in a build without CUDA: nothing here can run, so each entry point says so.
#include "harness/parallel/device.h"

#include <stdexcept>

namespace optcc {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw std::logic_error(std::string(what) + " needs optcc built with CUDA; this binary is " + build_description() +
                         ". Fix: build against a CUDA LibTorch (OPTCC_CUDA on), or set parallel.device: cpu and parallel.backend: gloo");
}
}  // namespace

struct DeviceTimer::Events {};

ProcessGroupPtr make_nccl_group(const c10::intrusive_ptr<c10d::Store>&, const std::string&, int, int, int,
                                std::chrono::milliseconds) {
  no_cuda("an NCCL process group");
}

int cuda_device_count() { return 0; }

void use_device(const c10::Device& device) {
  if (device.is_cuda()) no_cuda("a CUDA device");
}

DeviceTimer::DeviceTimer(int) { no_cuda("a CUDA event timer"); }
DeviceTimer::~DeviceTimer() = default;
void DeviceTimer::start() {}
void DeviceTimer::stop() {}
double DeviceTimer::seconds() { return 0.0; }

}  // namespace optcc

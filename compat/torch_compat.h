// What differs between the LibTorch versions optcc builds against (Debian 12's 1.13, Debian 13's 2.6,
// a cluster's CUDA 2.x), and what this build can run. Every `#if TORCH_VERSION_MAJOR` of the project
// lives here or in compat/fused_attention.h; the rest of the code names the aliases below. The bottom layer: any folder may include
// it (cmake/check_layers.cmake), and it includes only LibTorch.
//
// Tested: `make test` builds against 1.13; scripts/debian13/test.sh builds and runs the suite against
// Debian 13's 2.6 (.ci/run runs both).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/TensorImpl.h>
#include <torch/version.h>

#include <cstdint>
#include <cstddef>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace optcc {

// --- LibTorch API differences --------------------------------------------------------------------

/// The c10d object that holds a backend's collectives and point-to-point operations. 1.13: the
/// ProcessGroup itself (ProcessGroupGloo derives from it). 2.x: c10d::Backend (a ProcessGroup became a
/// dispatcher over per-device backends; ProcessGroupGloo / ProcessGroupNCCL derive from Backend), with
/// the same allreduce / send / recv / barrier calls.
#if TORCH_VERSION_MAJOR >= 2
using ProcessGroupPtr = c10::intrusive_ptr<c10d::Backend>;
#else
using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
#endif

/// The type of the allocator totals in c10::MemoryReportingInfoBase::reportMemoryUsage(ptr,
/// alloc_size, total_allocated, total_reserved, device), bytes: int64_t in 1.13, size_t in 2.x.
#if TORCH_VERSION_MAJOR >= 2
using AllocatorTotal = std::size_t;
#else
using AllocatorTotal = int64_t;
#endif

/// The TCPStore server's implementation. LibTorch 2.x added a libuv one (TCPStoreOptions::useLibUV)
/// and made it the default, but a LibTorch built without libuv (Debian 13's 2.6) then fails every
/// rendezvous ("use_libuv was requested but PyTorch was build without libuv support"). optcc asks for
/// the classic socket server, which every version has; where the option does not exist (1.13) this
/// does nothing.
template <class Options, class = void>
struct HasUseLibUv : std::false_type {};
template <class Options>
struct HasUseLibUv<Options, std::void_t<decltype(std::declval<Options&>().useLibUV)>> : std::true_type {};
template <class Options>  // c10d::TCPStoreOptions; a template so that 1.13 never sees the member
void use_classic_tcpstore(Options& opts) {
  if constexpr (HasUseLibUv<Options>::value) opts.useLibUV = false;
}

/// The key an optimizer's state map (torch::optim::Optimizer::state()) files a parameter under: its
/// TensorImpl's address, as text in 1.13 (what `ostream << pointer` prints) and as the pointer in 2.x.
template <typename StateMap>
typename StateMap::key_type optimizer_state_key(const StateMap&, c10::TensorImpl* impl) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << impl;
    return text.str();
  } else {
    return static_cast<Key>(impl);
  }
}

// --- what this build can run ---------------------------------------------------------------------

/// True when optcc was compiled with its CUDA/NCCL path (CMake option OPTCC_CUDA, on by default when
/// the LibTorch found has CUDA). Settings that need a GPU (parallel.backend: nccl, a Slurm scale that
/// asks for GPUs) are refused by builds where this is false.
#ifdef OPTCC_WITH_CUDA
inline constexpr bool kBuiltWithCuda = true;
#else
inline constexpr bool kBuiltWithCuda = false;
#endif

/// "LibTorch 1.13.1, CPU only (built without CUDA)" or "LibTorch 2.6.0, CUDA": what error messages
/// and `optcc --version` print about this binary.
/// The LibTorch version this binary was compiled against, "1.13.1" (results record it: run_info.h).
inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

/// Whether ATen has fp16 GEMMs on the CPU: LibTorch 1.13 has none ("addmm_impl_cpu_" not
/// implemented for 'Half'), 2.x has. train.precision: fp16 on CPU ranks needs it.
#if TORCH_VERSION_MAJOR >= 2
inline constexpr bool kCpuFp16Gemm = true;
#else
inline constexpr bool kCpuFp16Gemm = false;
#endif

/// with_cuda: what to say of CUDA (this build's kBuiltWithCuda; tests of the refusals pass the other).
inline std::string build_description(bool with_cuda = kBuiltWithCuda) {
  return "LibTorch " + torch_version() + (with_cuda ? ", CUDA" : ", CPU only (built without CUDA)");
}

}  // namespace optcc

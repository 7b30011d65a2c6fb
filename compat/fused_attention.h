// ATen's fused attention kernel where the LibTorch in use has one (2.x), beside compat/torch_compat.h:
// the one other place of the project with an `#if TORCH_VERSION_MAJOR`. Kept apart from that header,
// which every file includes, so that only the attention and its callers see ATen's operator list.
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <stdexcept>

namespace optcc {

/// Whether ATen has a fused attention kernel (at::scaled_dot_product_attention, LibTorch >= 2.0: on
/// CUDA the flash / memory-efficient kernels, which never write the [s, s] score matrix to memory).
#if TORCH_VERSION_MAJOR >= 2
inline constexpr bool kHasFusedAttention = true;
#else
inline constexpr bool kHasFusedAttention = false;
#endif

/// softmax(q k^T / sqrt(head_dim) + causal mask) v through ATen's fused kernel, without dropout.
/// q, k, v: [b, heads, s, head_dim], one dtype, on one device; returns [b, heads, s, head_dim] in
/// that dtype. Throws std::logic_error where kHasFusedAttention is false (config validation refuses
/// model.attention: fused there first).
inline at::Tensor fused_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  (void)q, (void)k, (void)v;
  throw std::logic_error("fused attention needs LibTorch >= 2.0 (at::scaled_dot_product_attention)");
#endif
}

}  // namespace optcc

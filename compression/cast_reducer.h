// `fp16` / `bf16`: the baseline all-reduce with a 16-bit wire (half the bytes of fp32).
// Gradients (any float dtype) are flattened into fp32, cast to the wire type, summed over DP, and
// cast back to fp32 before ÷ dp and the copy into the gradients (cast out). Options: none.
//   fp16: one all-reduce in fp16 (Gloo and NCCL sum in fp16; |Σ| > 65504 overflows to inf).
//   bf16: CUDA tensors: one all-reduce in bf16. CPU: Gloo in LibTorch 1.13 has no bf16 sum, so
//         the bf16 bits are all-gathered (as fp16, a plain copy) and summed in fp32 in rank order (identical on all ranks;
//         a fp32 accumulation, BR-01); payload = numel · 2 either way, wire bytes (n−1)·payload.
// A group of one rank returns at once (no rounding).
#pragma once

#include "compression/grad_reducer.h"

namespace optcc {

class CastReducer : public GradReducer {
 public:
  /// `wire`: torch::kHalf or torch::kBFloat16.
  explicit CastReducer(torch::ScalarType wire);
  std::string name() const override;
  void reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) override;
  /// The casts (read fp32, write 16 bits, read them back: 6 bytes per element) and one collective
  /// of Σ numel · 2 bytes: an all-reduce, or for bf16 on the CPU (ctx.host_gloo) an all-gather.
  ReducerPlan plan(const std::vector<std::vector<int64_t>>& shapes, const PlanContext& ctx) const override;

 private:
  torch::ScalarType wire_;
};

}  // namespace optcc

// Model FLOPs: the one place the simulator (harness/perfmodel/simulator.h), the calibration
// (harness/perfmodel/calibrate.h) and the benchmark (gpt_train_flops, models/gpt.h) take them from.
// Pure arithmetic, no LibTorch.
//
// Megatron's count (Narayanan et al., SC'21, appendix; a multiply-add is 2 FLOPs), for one
// micro-batch of b sequences of s tokens, hidden size h, the WHOLE layer (a tensor-parallel rank
// does 1/t of it):
//   transformer layer, forward   24·b·s·h² + 4·b·s²·h
//       QKV projection 6bsh², attention scores QKᵀ 2bs²h, scores × V 2bs²h, output projection
//       2bsh², MLP 16bsh² (h -> 4h -> h). The attention terms count the full s×s matrix, as
//       Megatron-LM and the paper do (no causal halving). LayerNorm, softmax, GeLU, dropout and the
//       residual adds are element-wise and not counted.
//   output layer (logits), forward   2·b·s·h·V   (V: the padded vocabulary)
//   backward = 2 × forward (the gradients with respect to the input and to the weights are each a
//   GEMM of the forward's size); with full activation recomputation (the paper's runs) the
//   backward pass also repeats the forward: 3 × forward.
#pragma once

#include <cstdint>

namespace optcc {

/// Backward FLOPs per forward FLOP (input gradient + weight gradient).
constexpr double kBackwardFlopsPerForward = 2.0;

/// Forward FLOPs of one transformer layer (all TP ranks together) for one micro-batch.
constexpr double layer_forward_flops(int64_t h, int64_t s, int64_t b) {
  return 24.0 * double(b) * double(s) * double(h) * double(h) + 4.0 * double(b) * double(s) * double(s) * double(h);
}

/// Forward FLOPs of the output layer (logits against the tied embedding) for one micro-batch.
constexpr double logits_forward_flops(int64_t h, int64_t s, int64_t b, int64_t vocab) {
  return 2.0 * double(b) * double(s) * double(h) * double(vocab);
}

/// The part of one transformer layer's backward that computes weight gradients (W of the
/// zero-bubble schedules): one GEMM of each linear layer's forward size, 24·b·s·h². The rest of
/// backward_flops(layer_forward_flops()) is the input gradient (B), the attention's included.
constexpr double layer_weight_grad_flops(int64_t h, int64_t s, int64_t b) {
  return 24.0 * double(b) * double(s) * double(h) * double(h);
}

/// Backward FLOPs for `forward` forward FLOPs; `recompute` adds the repeated forward.
constexpr double backward_flops(double forward, bool recompute = false) {
  return (kBackwardFlopsPerForward + (recompute ? 1.0 : 0.0)) * forward;
}

}  // namespace optcc

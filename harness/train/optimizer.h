// AdamW with decoupled weight decay (biases and LayerNorm excluded), warm-up + cosine LR, and
// clipping by global gradient norm. Megatron-LM's recipe (docs/design.md §1.2 step 5-6).
#pragma once

#include <torch/torch.h>

#include <memory>

#include "harness/config/config.h"

namespace optcc {

/// Learning rate of a step: linear warm-up 0 -> lr over `warmup` steps (step 0 gets lr/warmup),
/// then cosine decay to min_lr over `decay` steps, then min_lr. Pure; unit-tested.
struct LrSchedule {
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup = 0, decay = 1;
  static LrSchedule from(const TrainConfig& t);
  double at(int64_t step) const;  // step is 0-based: the step about to run
};

/// torch::optim::AdamW whose step() updates each parameter group with multi-tensor operations
/// (ATen's _foreach_ ops: a handful of calls for all of a group's parameters instead of about ten
/// per parameter; on CUDA each is a few fused launches over many tensors, on CPU a loop of the same
/// per-tensor ops). Same arithmetic in the same order as AdamW::step of LibTorch (decoupled decay
/// p·(1 − lr·wd), moments, denominator √v/√(1 − β₂ᵗ) + eps, p −= lr/(1 − β₁ᵗ)·m/denom), on the
/// same per-parameter state (AdamWParamState: step, exp_avg, exp_avg_sq), so checkpoints are
/// AdamW's: bit for bit equal to AdamW on CPU (a test holds them together). Parameters are grouped
/// by their step count (one group in a run; several only after parameters joined late). amsgrad and
/// sparse gradients take AdamW's own step.
class MultiTensorAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

/// AdamW (MultiTensorAdamW) over two parameter groups: group 0 decays (weights, embeddings), group 1
/// does not (biases, LayerNorm; by parameter name, see is_no_decay_parameter).
std::unique_ptr<torch::optim::AdamW> make_adamw(torch::nn::Module& model, const TrainConfig& t);

/// Sets the learning rate of every parameter group.
void set_lr(torch::optim::Optimizer& opt, double lr);

/// Global L2 norm of all gradients in `params` (fp32 accumulation; parameters without a gradient
/// count as zero). If max_norm > 0 and the norm exceeds it, scales every gradient by
/// max_norm / (norm + 1e-6). Returns the norm before clipping.
double clip_grad_global_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace optcc

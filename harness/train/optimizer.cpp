#include "harness/train/optimizer.h"

#include <cmath>

#include "harness/train/grad_sync.h"
#include "models/gpt.h"

namespace optcc {

LrSchedule LrSchedule::from(const TrainConfig& t) {
  LrSchedule s;
  s.lr = t.lr;
  s.min_lr = t.min_lr;
  s.warmup = t.warmup_steps;
  s.decay = t.decay_steps > 0 ? t.decay_steps : std::max<int64_t>(1, t.train_steps - t.warmup_steps);
  return s;
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay));
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

std::unique_ptr<torch::optim::AdamW> make_adamw(torch::nn::Module& model, const TrainConfig& t) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& item : model.named_parameters()) {
    (is_no_decay_parameter(item.key()) ? no_decay : decay).push_back(item.value());
  }
  auto opts = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(t.lr).betas({t.adam_beta1, t.adam_beta2}).eps(t.adam_eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, opts(t.weight_decay));
  groups.emplace_back(no_decay, opts(0.0));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(t.lr));
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

double clip_grad_global_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  double sum_sq = 0.0;
  for (const auto& p : params) {
    if (p.grad().defined()) sum_sq += p.grad().pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(sum_sq);
  clip_grads_to(params, norm, max_norm);
  return norm;
}

}  // namespace optcc

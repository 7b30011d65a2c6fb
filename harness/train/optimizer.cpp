#include "harness/train/optimizer.h"

#include <cmath>
#include <map>
#include <vector>

#include "compat/torch_compat.h"
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
  return std::make_unique<MultiTensorAdamW>(groups, torch::optim::AdamWOptions(t.lr));
}

torch::Tensor MultiTensorAdamW::step(LossClosure closure) {
  for (auto& group : param_groups_) {
    bool plain = !static_cast<torch::optim::AdamWOptions&>(group.options()).amsgrad();
    for (const auto& p : group.params()) plain = plain && (!p.grad().defined() || !p.grad().is_sparse());
    if (!plain) return torch::optim::AdamW::step(closure);  // AdamW's own loop
  }
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    const double lr = options.lr(), wd = options.weight_decay(), eps = options.eps();
    const double beta1 = std::get<0>(options.betas()), beta2 = std::get<1>(options.betas());
    // The parameters with a gradient, by their step count after this step (AdamW's state key:
    // the TensorImpl's address as a string).
    std::map<int64_t, std::vector<torch::Tensor>> params, grads, exp_avgs, exp_avg_sqs;
    std::vector<torch::Tensor> decayed;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto key = optimizer_state_key(state_, p.unsafeGetTensorImpl());
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key, std::move(fresh)).first;
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*it->second);
      state.step(state.step() + 1);
      params[state.step()].push_back(p);
      grads[state.step()].push_back(p.grad());
      exp_avgs[state.step()].push_back(state.exp_avg());
      exp_avg_sqs[state.step()].push_back(state.exp_avg_sq());
      decayed.push_back(p);
    }
    if (wd != 0 && !decayed.empty()) at::_foreach_mul_(decayed, 1 - lr * wd);  // decoupled decay first
    for (auto& [step, ps] : params) {
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
      auto& m = exp_avgs[step];
      auto& v = exp_avg_sqs[step];
      const auto& g = grads[step];
      at::_foreach_mul_(m, beta1);
      at::_foreach_add_(m, g, 1 - beta1);
      at::_foreach_mul_(v, beta2);
      at::_foreach_addcmul_(v, g, g, 1 - beta2);
      auto denom = at::_foreach_sqrt(v);
      at::_foreach_div_(denom, std::sqrt(bias_correction2));
      at::_foreach_add_(denom, eps);
      at::_foreach_addcdiv_(ps, m, denom, -lr / bias_correction1);
    }
  }
  return loss;
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

double clip_grad_global_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  const double norm = std::sqrt(sum_of_squares(grads));  // one host sync
  clip_grads_to(params, norm, max_norm);
  return norm;
}

}  // namespace optcc

#include "harness/train/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace optcc {

bool has_local_overflow(const std::vector<torch::Tensor>& grads, double wire_limit) {
  const bool limited = std::isfinite(wire_limit);
  for (const auto& g : grads) {
    if (!torch::isfinite(g).all().item<bool>()) return true;
    if (limited && g.numel() > 0 && g.abs().max().item<double>() > wire_limit) return true;
  }
  return false;
}

DynamicLossScaler::DynamicLossScaler(bool enabled, LossScaleOptions options)
    : enabled_(enabled), o_(options), scale_(enabled ? options.initial : 1.0) {}

void DynamicLossScaler::update(bool overflow) {
  if (overflow) {
    skipped_in_a_row_ += 1;
    clean_steps_ = 0;
    if (enabled_) scale_ = std::max(o_.min_scale, scale_ * o_.backoff);
    return;
  }
  skipped_in_a_row_ = 0;
  if (!enabled_) return;
  clean_steps_ += 1;
  if (clean_steps_ >= o_.growth_interval) {
    scale_ = std::min(o_.max_scale, scale_ * 2.0);
    clean_steps_ = 0;
  }
}

void DynamicLossScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", torch::tensor({scale_}, torch::kDouble));
  archive.write("clean_steps", torch::tensor({clean_steps_}, torch::kLong));
  archive.write("skipped_in_a_row", torch::tensor({skipped_in_a_row_}, torch::kLong));
}

void DynamicLossScaler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor s, c, k;
  archive.read("scale", s);
  archive.read("clean_steps", c);
  archive.read("skipped_in_a_row", k);
  scale_ = s.item<double>();
  clean_steps_ = c.item<int64_t>();
  skipped_in_a_row_ = k.item<int64_t>();
}

}  // namespace optcc

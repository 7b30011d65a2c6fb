#include "compression/grad_reducer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "compression/cast_reducer.h"
#include "compression/powersgd.h"
#include "compression/qsgd_reducer.h"
#include "compression/randomk_reducer.h"
#include "compression/signsgd_reducer.h"
#include "compression/topk_reducer.h"

namespace optcc {

int64_t GradReducer::raw_bytes() const {
  int64_t s = 0;
  for (const auto& r : records_) s += r.raw_bytes;
  return s;
}

int64_t GradReducer::payload_bytes() const {
  int64_t s = 0;
  for (const auto& r : records_) s += r.sent_bytes;
  return s;
}

void GradReducer::begin_records(const std::vector<torch::Tensor>& grads) {
  records_.clear();
  for (size_t i = 0; i < grads.size(); ++i) {
    TensorRecord r;
    r.name = i < names_.size() ? names_[i] : "grad[" + std::to_string(i) + "]";
    r.shape = grads[i].sizes().vec();
    r.raw_bytes = grads[i].numel() * static_cast<int64_t>(grads[i].element_size());
    records_.push_back(std::move(r));
  }
}

void GradReducer::set_tensors(std::vector<TensorSpec> tensors) {
  names_.clear();
  for (const auto& t : tensors) names_.push_back(t.name);
  tensors_ = std::move(tensors);
  tensors_bound_ = tensors_declared_ = true;
}

void GradReducer::bind_tensors(const std::vector<torch::Tensor>& grads) {
  std::vector<TensorSpec> now;
  for (size_t i = 0; i < grads.size(); ++i) {
    now.push_back({i < names_.size() ? names_[i] : "grad[" + std::to_string(i) + "]", grads[i].sizes().vec()});
  }
  if (!tensors_bound_) {
    tensors_ = std::move(now);
    tensors_bound_ = true;
    return;
  }
  const std::string diff = first_difference(tensors_, now, /*names=*/false, {"in the state's list", "in this call"});
  if (!diff.empty()) {
    throw std::invalid_argument(fmt::format("{}: reduce() got other tensors than its state belongs to: {} "
                                            "(every call must pass the same list; state left untouched)",
                                            name(), diff));
  }
}

void GradReducer::save_tensors(torch::serialize::OutputArchive& archive, const std::string& key) const {
  if (tensors_bound_) write_tensor_specs(archive, key, tensors_);
}

void GradReducer::load_tensors(torch::serialize::InputArchive& archive, const std::string& key, bool has_state) {
  auto saved = read_tensor_specs(archive, key);
  if (!saved) {
    if (!has_state) return;
    throw StateMismatch(fmt::format("the saved state lists no tensors ('{}' missing)", key));
  }
  if (!tensors_bound_) {
    tensors_ = std::move(*saved);
    tensors_bound_ = true;
    return;
  }
  const std::string diff = first_difference(*saved, tensors_, tensors_declared_);
  if (!diff.empty()) {
    throw StateMismatch("the saved state belongs to other tensors: " + diff);
  }
}

void NoneReducer::reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) {
  torch::NoGradGuard no_grad;
  begin_records(grads);
  if (dp.size() == 1 || grads.empty()) return;
  // Exactly reduce_data_parallel_grads: cat, ÷ dp, sum-all-reduce, copy back.
  std::vector<torch::Tensor> flat;
  for (const auto& g : grads) flat.push_back(g.reshape({-1}));
  auto buffer = torch::cat(flat);
  int64_t element_bytes = buffer.element_size();
  if (wire_ != torch::kFloat) {  // 16 bits on the wire, summed in fp32 (header)
    auto wire = buffer.to(torch::kFloat).mul_(wire_scale_ / static_cast<double>(dp.size())).to(wire_);
    dp.all_reduce_summing_in_fp32(wire, traffic_class());
    buffer = wire.to(torch::kFloat).mul_(1.0 / wire_scale_);
    element_bytes = wire.element_size();
  } else {
    buffer.div_(dp.size());
    dp.all_reduce(buffer, traffic_class());
  }
  int64_t offset = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    grads[i].copy_(buffer.narrow(0, offset, grads[i].numel()).view_as(grads[i]));
    offset += grads[i].numel();
    records_[i].sent_bytes = grads[i].numel() * element_bytes;
  }
}

ReducerPlan NoneReducer::plan(const std::vector<std::vector<int64_t>>& shapes, const PlanContext& ctx) const {
  ReducerPlan plan;
  if (shapes.empty()) return plan;  // reduce() returns at once
  const int64_t numel = total_numel(shapes);
  if (wire_ != torch::kFloat && ctx.element_bytes == 0) {
    // all_reduce_summing_in_fp32 pads the buffer to group_size equal chunks: X is the padded tensor.
    const int64_t n = std::max<int64_t>(1, ctx.group_size), chunk = (numel + n - 1) / n;
    const int64_t element = static_cast<int64_t>(c10::elementSize(wire_));
    plan.steps.push_back(collective_step(CollectiveKind::kAllReduce, chunk * n * element,
                                         "gradient all-reduce (16-bit wire, fp32 sum)"));
    return plan;
  }
  const int64_t beta = ctx.element_bytes > 0 ? ctx.element_bytes : 4;
  plan.steps.push_back(collective_step(CollectiveKind::kAllReduce, numel * beta, "gradient all-reduce"));
  return plan;
}

int64_t total_numel(const std::vector<std::vector<int64_t>>& shapes) {
  int64_t sum = 0;
  for (const auto& s : shapes) {
    int64_t n = 1;
    for (auto v : s) n *= v;
    sum += n;
  }
  return sum;
}

NoneReducer::NoneReducer(torch::ScalarType wire) : wire_(wire) {
  if (wire != torch::kFloat && wire != torch::kHalf && wire != torch::kBFloat16) {
    throw std::invalid_argument(fmt::format("NoneReducer: wire dtype {} is not fp32, fp16 or bf16", c10::toString(wire)));
  }
}

void NoneReducer::set_wire_scale(double scale) {
  if (!(scale > 0) || !std::isfinite(scale)) {
    throw std::invalid_argument(fmt::format("NoneReducer: wire scale {} must be finite and > 0", scale));
  }
  wire_scale_ = scale;
}

double NoneReducer::wire_overflow_limit(int64_t dp) const {
  if (wire_ != torch::kHalf) return std::numeric_limits<double>::infinity();
  return 65504.0 * static_cast<double>(dp);
}

torch::Tensor flatten_fp32(const std::vector<torch::Tensor>& grads) {
  std::vector<torch::Tensor> flat;
  for (const auto& g : grads) flat.push_back(g.reshape({-1}).to(torch::kFloat));
  if (flat.empty()) return torch::empty({0}, torch::kFloat);
  return torch::cat(flat);
}

void unflatten_into(const torch::Tensor& flat, std::vector<torch::Tensor>& grads) {
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

void register_builtin_grad_reducers(Registry<GradReducer>& registry) {
  registry.add("none", "uncompressed baseline: one all-reduce of the flattened gradients ÷ dp",
               [](const YAML::Node& o) -> std::unique_ptr<GradReducer> {
                 check_option_keys(o, "none", {});
                 return std::make_unique<NoneReducer>();
               });
  registry.add("fp16", "all-reduce in fp16 (cast in/out, ÷ dp in fp32)",
               [](const YAML::Node& o) -> std::unique_ptr<GradReducer> {
                 check_option_keys(o, "fp16", {});
                 return std::make_unique<CastReducer>(torch::kHalf);
               });
  registry.add("bf16", "all-reduce in bf16 (cast in/out, accumulate and ÷ dp in fp32)",
               [](const YAML::Node& o) -> std::unique_ptr<GradReducer> {
                 check_option_keys(o, "bf16", {});
                 return std::make_unique<CastReducer>(torch::kBFloat16);
               });
  registry.add("powersgd",
               "rank-r PowerSGD with error feedback (options: rank, min_compression_rate, warmup_steps, "
               "error_feedback, ef_residual, orthogonalize, warm_start, seed)",
               [](const YAML::Node& o) -> std::unique_ptr<GradReducer> {
                 return std::make_unique<PowerSgdReducer>(PowerSgdOptions::from_yaml(o));
               });
  registry.add("topk",
               "top-k sparsification with error feedback; values + int32 indices all-gathered "
               "(options: fraction, count, error_feedback, min_numel)",
               [](const YAML::Node& o) -> std::unique_ptr<GradReducer> {
                 return std::make_unique<TopKReducer>(TopKOptions::from_yaml(o));
               });
  registry.add("randomk",
               "random-k sparsification with error feedback; indices from a shared seed, values all-reduced "
               "(options: fraction, count, error_feedback, min_numel, seed)",
               [](const YAML::Node& o) -> std::unique_ptr<GradReducer> {
                 return std::make_unique<RandomKReducer>(RandomKOptions::from_yaml(o));
               });
  registry.add("qsgd",
               "QSGD stochastic quantisation per bucket; int8 codes + fp32 norms all-gathered "
               "(options: levels, bucket_size, error_feedback, min_numel, seed)",
               [](const YAML::Node& o) -> std::unique_ptr<GradReducer> {
                 return std::make_unique<QsgdReducer>(QsgdOptions::from_yaml(o));
               });
  registry.add("signsgd",
               "scaled sign (EF-SignSGD): 1 bit per entry + one fp32 scale per tensor, all-gathered "
               "(options: error_feedback, min_numel)",
               [](const YAML::Node& o) -> std::unique_ptr<GradReducer> {
                 return std::make_unique<SignSgdReducer>(SignSgdOptions::from_yaml(o));
               });
}

}  // namespace optcc

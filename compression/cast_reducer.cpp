#include "compression/cast_reducer.h"

namespace optcc {

CastReducer::CastReducer(torch::ScalarType wire) : wire_(wire) {
  TORCH_CHECK(wire == torch::kHalf || wire == torch::kBFloat16, "CastReducer: wire dtype must be fp16 or bf16");
}

std::string CastReducer::name() const { return wire_ == torch::kHalf ? "fp16" : "bf16"; }

// The CPU bf16 path of reduce() (an all-gather) is the one taken on Gloo's host tensors.
ReducerPlan CastReducer::plan(const std::vector<std::vector<int64_t>>& shapes, const PlanContext& ctx) const {
  ReducerPlan plan;
  if (shapes.empty()) return plan;
  const int64_t numel = total_numel(shapes);
  const auto kind = wire_ == torch::kBFloat16 && ctx.host_gloo ? CollectiveKind::kAllGather : CollectiveKind::kAllReduce;
  plan.steps = {arithmetic_step(name(), 0.0, 6.0 * double(numel), "cast"),
                collective_step(kind, 2 * numel, name() + " gradients")};
  return plan;
}

void CastReducer::reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) {
  torch::NoGradGuard no_grad;
  begin_records(grads);
  if (dp.size() == 1 || grads.empty()) return;
  auto wire = flatten_fp32(grads).to(wire_);  // [Σ numel] fp16/bf16
  torch::Tensor sum;                          // [Σ numel] fp32
  if (wire_ == torch::kBFloat16 && !wire.is_cuda()) {
    // Gloo (LibTorch 1.13) has no bf16 (nor int16): gather the bits as fp16 (a plain copy),
    // reinterpret, and accumulate in fp32 in rank order.
    auto all = dp.all_gather(wire.view(torch::kHalf), traffic_class(), 0);
    auto parts = all.view(torch::kBFloat16).to(torch::kFloat).view({dp.size(), -1});
    sum = parts[0].clone();
    for (int r = 1; r < dp.size(); ++r) sum.add_(parts[r]);
  } else {
    dp.all_reduce(wire, traffic_class());
    sum = wire.to(torch::kFloat);
  }
  sum.div_(dp.size());
  unflatten_into(sum, grads);
  for (size_t i = 0; i < grads.size(); ++i) records_[i].sent_bytes = grads[i].numel() * 2;
}

}  // namespace optcc

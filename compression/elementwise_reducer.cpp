#include "compression/elementwise_reducer.h"

#include <fmt/format.h>

#include <limits>
#include <unordered_set>

#include "compression/elementwise_detail.h"
#include "compression/raw_loops.h"

namespace optcc {
using namespace elementwise;  // elementwise_detail.h

// ---- the shared sequence ------------------------------------------------------------------------

ElementwiseReducer::ElementwiseReducer(std::string kind, bool error_feedback, int64_t min_numel)
    : kind_(std::move(kind)), error_feedback_(error_feedback), min_numel_(min_numel) {}

namespace {

bool host_fp32(const torch::Tensor& t) {
  return t.is_cpu() && t.scalar_type() == torch::kFloat && t.is_contiguous();
}

bool all_finite(const torch::Tensor& g) {
  if (host_fp32(g)) return kernels::all_finite(g.data_ptr<float>(), g.numel());
  return torch::isfinite(g).all().item<bool>();
}

}  // namespace

void ElementwiseReducer::reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) {
  torch::NoGradGuard no_grad;
  bind_tensors(grads);  // the same list as the state's, before anything changes
  begin_records(grads);
  if (grads.empty()) return;
  // 1. Non-finite on any rank -> all ranks skip, before anything is modified.
  bool finite = true;
  for (const auto& g : grads) finite = finite && all_finite(g);
  auto bad = torch::full({1}, finite ? 0.0f : 1.0f, grads[0].options().dtype(torch::kFloat));
  dp.all_reduce(bad, Traffic::kControl, /*max=*/true);
  if (bad.item<float>() > 0) {
    throw NonFiniteGradients(fmt::format("{}: non-finite gradient on some rank of {} (step {}); gradients and "
                                         "error feedback left untouched, skip this step",
                                         kind_, dp.name(), step));
  }
  // 2. Classify and check every tensor, then 3. compensate the compressed ones in fp32.
  if (ef_.size() < grads.size()) ef_.resize(grads.size());
  std::vector<size_t> raw, compressed;
  for (size_t i = 0; i < grads.size(); ++i) {
    const int64_t n = grads[i].numel();
    if (sends_raw(n)) {
      raw.push_back(i);
      continue;
    }
    if (error_feedback_ && ef_[i].defined() && ef_[i].numel() != n) {
      throw std::invalid_argument(fmt::format("{}: {} has {} elements but its error feedback has {} (did the "
                                              "gradient list change since the state was saved?)",
                                              kind_, records_[i].name, n, ef_[i].numel()));
    }
    check_compressible(i, n);
    compressed.push_back(i);
  }
  std::vector<Item> items;
  for (size_t i : compressed) items.push_back(compensate(i, grads[i]));
  // 4. Compressed tensors: one collective for all of them.
  if (!items.empty()) exchange(items, dp, step);
  // 5. Raw tensors: one flat fp32 all-reduce, ÷ dp.
  if (!raw.empty()) {
    std::vector<torch::Tensor> parts;
    for (size_t i : raw) parts.push_back(grads[i]);
    auto buf = flatten_fp32(parts);  // [Σ N] fp32
    dp.all_reduce(buf, traffic_class());
    buf.div_(dp.size());
    unflatten_into(buf, parts);
    for (size_t i : raw) records_[i].sent_bytes = grads[i].numel() * 4;
  }
  // 6. Write the means back (unless exchange wrote them into the gradient itself).
  for (auto& it : items) {
    auto& g = grads[it.index];
    if (!host_fp32(g) || it.out.data_ptr() != g.data_ptr()) g.copy_(it.out.view(g.sizes()));
    records_[it.index].compressed = true;
    records_[it.index].sent_bytes = compressed_bytes(g.numel());
  }
}

ReducerPlan ElementwiseReducer::plan(const std::vector<std::vector<int64_t>>& shapes, const PlanContext& ctx) const {
  ReducerPlan plan;
  if (shapes.empty()) return plan;
  int64_t compressed = 0, raw = 0, packed = 0, raw_tensors = 0;
  for (const auto& s : shapes) {
    const int64_t n = total_numel({s});
    if (sends_raw(n)) {
      raw += n, raw_tensors += 1;
    } else {
      compressed += compressed_bytes(n), packed += n;
    }
  }
  const bool reduce = exchange_kind() == CollectiveKind::kAllReduce;
  auto& st = plan.steps;
  st.push_back(arithmetic_step(kind_, 0.0, 8.0 * double(packed), "encode"));
  if (packed > 0) st.push_back(collective_step(exchange_kind(), compressed, reduce ? "compressed all-reduce" : "compressed all-gather"));
  if (raw_tensors > 0) st.push_back(collective_step(CollectiveKind::kAllReduce, (ctx.element_bytes > 0 ? ctx.element_bytes : 4) * raw, "raw all-reduce"));
  st.push_back(arithmetic_step(kind_, 0.0, 8.0 * double(packed), "decode"));
  plan.error_feedback_bytes = error_feedback_ ? 4 * packed : 0;
  return plan;
}

ElementwiseReducer::Item ElementwiseReducer::compensate(size_t i, const torch::Tensor& g) {
  Item it;
  it.index = i;
  it.device = g.device();
  const int64_t n = g.numel();
  if (has_tensor_form() && (!g.is_cpu() || tensor_form_on_cpu_)) {  // on g's device, EF too
    it.tensors = true;
    it.out = torch::empty({n}, g.options().dtype(torch::kFloat));
    const auto flat = g.reshape({-1}).to(torch::kFloat, false, /*copy=*/true);
    if (!error_feedback_) {
      it.c = flat;
      return it;
    }
    auto& ef = ef_[i];
    if (!ef.defined()) {
      ef = flat;
    } else {
      if (ef.device() != g.device()) ef = ef.to(g.device());  // e.g. loaded from a checkpoint on the CPU
      ef.add_(flat);
    }
    it.c = ef;
    return it;
  }
  it.out = host_fp32(g) ? g.view({-1}) : torch::empty({n}, torch::kFloat);  // the mean goes straight into g
  if (!error_feedback_) {
    it.c = host_fp32(g) ? it.out : g.reshape({-1}).to(torch::kCPU, torch::kFloat, false, /*copy=*/true);
    return it;
  }
  auto& ef = ef_[i];  // c = g + EF, in EF's storage; exchange leaves c − own there
  if (!ef.defined()) {
    ef = g.reshape({-1}).to(torch::kCPU, torch::kFloat, false, /*copy=*/true);
  } else if (host_fp32(g)) {
    kernels::add_into(ef.data_ptr<float>(), g.data_ptr<float>(), n);
  } else {
    ef.add_(g.reshape({-1}).to(torch::kCPU, torch::kFloat));
  }
  it.c = ef;
  return it;
}

void ElementwiseReducer::save(torch::serialize::OutputArchive& archive) const {
  archive.write(kind_ + ".state", torch::tensor({static_cast<int64_t>(ef_.size())}));
  save_tensors(archive, kind_ + ".tensors");
  for (size_t i = 0; i < ef_.size(); ++i) {
    // A copy: the archive keeps tensors by reference until saved, and reduce() updates EF in place.
    if (ef_[i].defined()) archive.write(kind_ + ".ef." + std::to_string(i), ef_[i].to(torch::kCPU, false, /*copy=*/true));
  }
}

void ElementwiseReducer::load(torch::serialize::InputArchive& archive) {
  torch::Tensor meta;
  if (!archive.try_read(kind_ + ".state", meta)) {
    throw std::invalid_argument(fmt::format("{}: the checkpoint has no '{}.state' entry (written by another reducer?)",
                                            kind_, kind_));
  }
  load_tensors(archive, kind_ + ".tensors", /*has_state=*/meta[0].item<int64_t>() > 0);  // before any change
  ef_.assign(static_cast<size_t>(meta[0].item<int64_t>()), torch::Tensor());
  for (size_t i = 0; i < ef_.size(); ++i) {
    torch::Tensor t;
    if (archive.try_read(kind_ + ".ef." + std::to_string(i), t)) ef_[i] = t.to(torch::kCPU, torch::kFloat, false, true).contiguous();
  }
}

}  // namespace optcc

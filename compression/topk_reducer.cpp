#include "compression/topk_reducer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "compression/elementwise_detail.h"
#include "compression/raw_loops.h"

namespace optcc {
using namespace elementwise;  // elementwise_detail.h

// ---- topk ---------------------------------------------------------------------------------------

TopKOptions TopKOptions::from_yaml(const YAML::Node& o) {
  check_option_keys(o, "topk", {"fraction", "count", "error_feedback", "min_numel"});
  TopKOptions p;
  read_k(o, "topk", p);
  p.error_feedback = option<bool>(o, "topk", "error_feedback", p.error_feedback, "a bool");
  p.min_numel = option<int64_t>(o, "topk", "min_numel", p.min_numel, "an integer");
  validate_k(p, "topk");
  return p;
}

TopKReducer::TopKReducer(TopKOptions options)
    : ElementwiseReducer("topk", options.error_feedback, options.min_numel), opt_(options) {
  validate_k(opt_, "topk");
}

std::string TopKReducer::name() const {
  const auto k = opt_.count > 0 ? fmt::format("count={}", opt_.count) : fmt::format("fraction={}", opt_.fraction);
  return fmt::format("topk({}, error_feedback={}, min_numel={})", k, opt_.error_feedback, opt_.min_numel);
}

int64_t TopKReducer::k_for(int64_t numel) const { return k_of(opt_.fraction, opt_.count, numel); }

void TopKReducer::check_compressible(size_t index, int64_t numel) const {
  if (numel > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument(fmt::format("topk: {} has {} elements; int32 indices allow at most 2^31 - 1",
                                            records_[index].name, numel));
  }
}

void TopKReducer::exchange_tensors(std::vector<Item>& items, Communicator& dp) {
  std::vector<int64_t> ks, offs;
  std::vector<torch::Tensor> values, indices;
  int64_t total = 0;  // Σk
  for (auto& it : items) {
    const int64_t k = k_for(it.c.numel());
    ks.push_back(k), offs.push_back(total), total += k;
    const auto idx = elementwise::select_topk_tensor(it.c, k);  // increasing index order
    values.push_back(it.c.index_select(0, idx).view(torch::kInt));  // the values' bits
    indices.push_back(idx.to(torch::kInt));
    if (error_feedback_) it.c.index_fill_(0, idx, 0.0f);  // residual c − own: 0 where sent
  }
  values.insert(values.end(), indices.begin(), indices.end());
  const auto all = dp.all_gather(torch::cat(values), traffic_class(), 0);  // [n·2Σk] int32, on the device
  for (size_t j = 0; j < items.size(); ++j) {
    auto& out = items[j].out;
    out.zero_();
    for (int r = 0; r < dp.size(); ++r) {  // rank order: the same sum on every rank
      const auto part = all.narrow(0, r * 2 * total, 2 * total);
      out.index_add_(0, part.narrow(0, total + offs[j], ks[j]).to(torch::kLong),
                     part.narrow(0, offs[j], ks[j]).view(torch::kFloat));  // one rank's indices are distinct
    }
    if (dp.size() > 1) elementwise::divide_tensor(out, dp.size());
  }
}

void TopKReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  if (items[0].tensors) return exchange_tensors(items, dp);
  std::vector<int64_t> ks, offs;
  int64_t total = 0;  // Σk
  for (const auto& it : items) {
    ks.push_back(k_for(it.c.numel()));
    offs.push_back(total);
    total += ks.back();
  }
  // [Σk value bits | Σk indices] int32: one all-gather for every tensor.
  auto msg = torch::empty({2 * total}, torch::kInt);
  int32_t* pm = msg.data_ptr<int32_t>();
  for (size_t j = 0; j < items.size(); ++j) {
    float* c = items[j].c.data_ptr<float>();
    int32_t* idx = pm + total + offs[j];
    kernels::select_topk(c, items[j].c.numel(), ks[j], idx);  // increasing index order
    for (int64_t t = 0; t < ks[j]; ++t) {
      std::memcpy(pm + offs[j] + t, c + idx[t], 4);  // the value's bits
      if (error_feedback_) c[idx[t]] = 0.0f;          // residual c − own: 0 where sent
    }
  }
  const auto all = to_host(dp.all_gather(to_device(msg, items[0].device), traffic_class(), 0));  // [n·2Σk]
  const int32_t* pa = all.data_ptr<int32_t>();
  for (size_t j = 0; j < items.size(); ++j) {
    float* out = items[j].out.data_ptr<float>();
    const int64_t n = items[j].out.numel();
    std::fill(out, out + n, 0.0f);
    for (int r = 0; r < dp.size(); ++r) {  // rank order: the same sum on every rank
      const int32_t* part = pa + r * 2 * total;
      for (int64_t t = 0; t < ks[j]; ++t) {
        float v;
        std::memcpy(&v, part + offs[j] + t, 4);
        out[part[total + offs[j] + t]] += v;
      }
    }
    if (dp.size() > 1) kernels::divide(out, n, static_cast<float>(dp.size()));  // ÷ 1 is the identity
  }
}

}  // namespace optcc

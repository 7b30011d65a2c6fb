#include "compression/topk_reducer.h"

#include <fmt/format.h>

#include <limits>

#include "compression/elementwise_detail.h"

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

void TopKReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  std::vector<int64_t> ks, offs;
  int64_t total = 0;  // Σk
  for (const auto& it : items) {
    if (it.c.numel() > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument(fmt::format("topk: {} has {} elements; int32 indices allow at most 2^31 - 1",
                                              records_[it.index].name, it.c.numel()));
    }
    ks.push_back(k_for(it.c.numel()));
    offs.push_back(total);
    total += ks.back();
  }
  // [Σk value bits | Σk indices] int32: one all-gather for every tensor.
  auto msg = torch::empty({2 * total}, items[0].c.options().dtype(torch::kInt));
  auto values = msg.narrow(0, 0, total).view(torch::kFloat);
  auto indices = msg.narrow(0, total, total);
  for (size_t j = 0; j < items.size(); ++j) {
    auto& it = items[j];
    auto idx = std::get<1>(torch::topk(it.c.abs(), ks[j], 0, /*largest=*/true, /*sorted=*/false));  // [k] int64
    auto v = it.c.index_select(0, idx);                                                             // [k] fp32
    values.narrow(0, offs[j], ks[j]).copy_(v);
    indices.narrow(0, offs[j], ks[j]).copy_(idx);
    it.own = torch::zeros_like(it.c).index_copy_(0, idx, v);
  }
  auto all = dp.all_gather(msg, traffic_class(), 0);  // [n·2Σk] int32, rank order
  for (size_t j = 0; j < items.size(); ++j) {
    auto& it = items[j];
    it.out = torch::zeros_like(it.c);
    for (int r = 0; r < dp.size(); ++r) {  // rank order: the same sum on every rank
      auto part = all.narrow(0, r * 2 * total, 2 * total);
      it.out.index_add_(0, part.narrow(0, total + offs[j], ks[j]).to(torch::kLong),
                        part.narrow(0, offs[j], ks[j]).view(torch::kFloat));
    }
    it.out.div_(dp.size());
  }
}

}  // namespace optcc

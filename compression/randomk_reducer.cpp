#include "compression/randomk_reducer.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "compression/elementwise_detail.h"

namespace optcc {
using namespace elementwise;  // elementwise_detail.h

namespace {

// Uniform in [0, bound) without modulo bias.
int64_t uniform_below(at::CPUGeneratorImpl& g, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  uint64_t x;
  do x = g.random64(); while (x < threshold);
  return static_cast<int64_t>(x % bound);
}


}  // namespace

// ---- randomk ------------------------------------------------------------------------------------

RandomKOptions RandomKOptions::from_yaml(const YAML::Node& o) {
  check_option_keys(o, "randomk", {"fraction", "count", "error_feedback", "min_numel", "seed"});
  RandomKOptions p;
  read_k(o, "randomk", p);
  p.error_feedback = option<bool>(o, "randomk", "error_feedback", p.error_feedback, "a bool");
  p.min_numel = option<int64_t>(o, "randomk", "min_numel", p.min_numel, "an integer");
  p.seed = option<int64_t>(o, "randomk", "seed", p.seed, "an integer");
  validate_k(p, "randomk");
  return p;
}

RandomKReducer::RandomKReducer(RandomKOptions options)
    : ElementwiseReducer("randomk", options.error_feedback, options.min_numel), opt_(options) {
  validate_k(opt_, "randomk");
}

std::string RandomKReducer::name() const {
  const auto k = opt_.count > 0 ? fmt::format("count={}", opt_.count) : fmt::format("fraction={}", opt_.fraction);
  return fmt::format("randomk({}, error_feedback={}, min_numel={}, seed={})", k, opt_.error_feedback, opt_.min_numel,
                     opt_.seed);
}

int64_t RandomKReducer::k_for(int64_t numel) const { return k_of(opt_.fraction, opt_.count, numel); }

torch::Tensor RandomKReducer::indices(int64_t step, size_t tensor, int64_t numel) const {
  const int64_t k = k_for(numel);
  auto gen = generator_for(static_cast<uint64_t>(opt_.seed), step, tensor);
  auto* g = gen.get<at::CPUGeneratorImpl>();
  std::unordered_set<int64_t> chosen;  // Floyd: k draws, no rejection loop
  chosen.reserve(static_cast<size_t>(2 * k));
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(k));
  for (int64_t j = numel - k; j < numel; ++j) {
    int64_t t = uniform_below(*g, static_cast<uint64_t>(j + 1));
    if (chosen.count(t)) t = j;
    chosen.insert(t);
    out.push_back(t);
  }
  std::sort(out.begin(), out.end());
  return torch::tensor(out, torch::kLong);
}

void RandomKReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  std::vector<torch::Tensor> idx;
  std::vector<int64_t> offs;
  int64_t total = 0;
  for (const auto& it : items) {
    idx.push_back(indices(step, it.index, it.c.numel()).to(it.c.device()));
    offs.push_back(total);
    total += idx.back().numel();
  }
  auto values = torch::empty({total}, items[0].c.options());  // [Σk] fp32
  for (size_t j = 0; j < items.size(); ++j) {
    auto v = items[j].c.index_select(0, idx[j]);
    values.narrow(0, offs[j], v.numel()).copy_(v);
    items[j].own = torch::zeros_like(items[j].c).index_copy_(0, idx[j], v);
  }
  dp.all_reduce(values, traffic_class());
  values.div_(dp.size());
  for (size_t j = 0; j < items.size(); ++j) {
    items[j].out = torch::zeros_like(items[j].c).index_copy_(0, idx[j], values.narrow(0, offs[j], idx[j].numel()));
  }
}

}  // namespace optcc

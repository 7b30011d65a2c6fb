#include "compression/randomk_reducer.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "compression/elementwise_detail.h"
#include "compression/raw_loops.h"

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

std::vector<int64_t> RandomKReducer::draw(int64_t step, size_t tensor, int64_t numel) const {
  const int64_t k = k_for(numel);
  auto gen = generator_for(static_cast<uint64_t>(opt_.seed), step, tensor);
  auto* g = gen.get<at::CPUGeneratorImpl>();
  std::vector<uint64_t> chosen(static_cast<size_t>((numel + 63) / 64), 0);  // Floyd's set as a bitmap
  auto has = [&](int64_t t) { return (chosen[t >> 6] >> (t & 63)) & 1u; };
  for (int64_t j = numel - k; j < numel; ++j) {  // k draws, no rejection loop
    int64_t t = uniform_below(*g, static_cast<uint64_t>(j + 1));
    if (has(t)) t = j;
    chosen[t >> 6] |= uint64_t{1} << (t & 63);
  }
  std::vector<int64_t> out;  // the set in increasing order: a scan of the bitmap, no sort
  out.reserve(static_cast<size_t>(k));
  for (size_t w = 0; w < chosen.size(); ++w) {
    for (uint64_t bits = chosen[w]; bits; bits &= bits - 1) {
      out.push_back(static_cast<int64_t>(w) * 64 + __builtin_ctzll(bits));
    }
  }
  return out;
}

torch::Tensor RandomKReducer::indices(int64_t step, size_t tensor, int64_t numel) const {
  return torch::tensor(draw(step, tensor, numel), torch::kLong);
}

void RandomKReducer::exchange_tensors(std::vector<Item>& items, Communicator& dp, int64_t step) {
  std::vector<torch::Tensor> idx, values;
  for (auto& it : items) {
    idx.push_back(indices(step, it.index, it.c.numel()).to(it.c.device()));  // increasing
    values.push_back(it.c.index_select(0, idx.back()));
    if (error_feedback_) it.c.index_fill_(0, idx.back(), 0.0f);  // residual c − own: 0 where sent
  }
  auto summed = torch::cat(values);  // [Σk] fp32
  dp.all_reduce(summed, traffic_class());
  elementwise::divide_tensor(summed, dp.size());
  int64_t off = 0;
  for (size_t j = 0; j < items.size(); ++j) {
    const int64_t k = idx[j].numel();
    items[j].out.zero_().index_copy_(0, idx[j], summed.narrow(0, off, k));
    off += k;
  }
}

void RandomKReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  if (items[0].tensors) return exchange_tensors(items, dp, step);
  std::vector<std::vector<int64_t>> idx;
  std::vector<int64_t> offs;
  int64_t total = 0;
  for (const auto& it : items) {
    idx.push_back(draw(step, it.index, it.c.numel()));
    offs.push_back(total);
    total += static_cast<int64_t>(idx.back().size());
  }
  auto values = torch::empty({total}, torch::kFloat);  // [Σk] fp32
  float* pv = values.data_ptr<float>();
  for (size_t j = 0; j < items.size(); ++j) {
    float* c = items[j].c.data_ptr<float>();
    for (size_t t = 0; t < idx[j].size(); ++t) {
      pv[offs[j] + t] = c[idx[j][t]];
      if (error_feedback_) c[idx[j][t]] = 0.0f;  // residual c − own: 0 where sent
    }
  }
  auto summed = to_device(values, items[0].device);
  dp.all_reduce(summed, traffic_class());
  values = to_host(summed);
  pv = values.data_ptr<float>();
  kernels::divide(pv, total, static_cast<float>(dp.size()));
  for (size_t j = 0; j < items.size(); ++j) {
    float* out = items[j].out.data_ptr<float>();
    std::fill(out, out + items[j].out.numel(), 0.0f);
    for (size_t t = 0; t < idx[j].size(); ++t) out[idx[j][t]] = pv[offs[j] + t];
  }
}

}  // namespace optcc

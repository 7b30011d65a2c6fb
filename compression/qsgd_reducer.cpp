#include "compression/qsgd_reducer.h"

#include <fmt/format.h>

#include <cmath>

#include "compression/elementwise_detail.h"

namespace optcc {
using namespace elementwise;  // elementwise_detail.h

// ---- qsgd ---------------------------------------------------------------------------------------

namespace {

void validate_qsgd(const QsgdOptions& p) {
  require(p.levels >= 1 && p.levels <= 127, "qsgd", "levels", p.levels, "in [1, 127] (int8 codes)");
  require(p.bucket_size >= 1, "qsgd", "bucket_size", p.bucket_size, ">= 1");
  require(p.min_numel >= 0, "qsgd", "min_numel", p.min_numel, ">= 0");
}

}  // namespace

QsgdOptions QsgdOptions::from_yaml(const YAML::Node& o) {
  check_option_keys(o, "qsgd", {"levels", "bucket_size", "error_feedback", "min_numel", "seed"});
  QsgdOptions p;
  p.levels = option<int64_t>(o, "qsgd", "levels", p.levels, "an integer");
  p.bucket_size = option<int64_t>(o, "qsgd", "bucket_size", p.bucket_size, "an integer");
  p.error_feedback = option<bool>(o, "qsgd", "error_feedback", p.error_feedback, "a bool");
  p.min_numel = option<int64_t>(o, "qsgd", "min_numel", p.min_numel, "an integer");
  p.seed = option<int64_t>(o, "qsgd", "seed", p.seed, "an integer");
  validate_qsgd(p);
  return p;
}

QsgdReducer::QsgdReducer(QsgdOptions options)
    : ElementwiseReducer("qsgd", options.error_feedback, options.min_numel), opt_(options) {
  validate_qsgd(opt_);
}

std::string QsgdReducer::name() const {
  return fmt::format("qsgd(levels={}, bucket_size={}, error_feedback={}, min_numel={}, seed={})", opt_.levels,
                     opt_.bucket_size, opt_.error_feedback, opt_.min_numel, opt_.seed);
}

int64_t QsgdReducer::compressed_bytes(int64_t numel) const {
  return numel + 4 * ((numel + opt_.bucket_size - 1) / opt_.bucket_size);
}

namespace {

// x [N] -> [⌈N/B⌉, B], zero-padded.
torch::Tensor buckets(const torch::Tensor& x, int64_t b) {
  const int64_t nb = (x.numel() + b - 1) / b;
  return torch::constant_pad_nd(x, {0, nb * b - x.numel()}).view({nb, b});
}

// norms [nb] fp32, codes [N] int8 -> fp32 [N]: norm·code/s (in this order: exact on the grid).
torch::Tensor qsgd_decode(const torch::Tensor& norms, const torch::Tensor& codes, int64_t b, int64_t s) {
  auto q = buckets(codes.to(torch::kFloat), b).mul(norms.unsqueeze(1)).div(static_cast<double>(s));
  return q.view({-1}).narrow(0, 0, codes.numel());
}

}  // namespace

void QsgdReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  const int64_t b = opt_.bucket_size, s = opt_.levels;
  std::vector<int64_t> nbs, norm_offs, code_offs;
  int64_t norms_total = 0, codes_total = 0;
  for (const auto& it : items) {
    nbs.push_back((it.c.numel() + b - 1) / b);
    norm_offs.push_back(norms_total), code_offs.push_back(codes_total);
    norms_total += nbs.back(), codes_total += it.c.numel();
  }
  // [4·Σnb bytes of fp32 norms | ΣN int8 codes] uint8: one all-gather for every tensor.
  const int64_t x = 4 * norms_total + codes_total;
  auto msg = torch::empty({x}, items[0].c.options().dtype(torch::kByte));
  auto norms = torch::empty({norms_total}, items[0].c.options());  // [Σnb] fp32
  auto codes = msg.narrow(0, 4 * norms_total, codes_total).view(torch::kChar);
  for (size_t j = 0; j < items.size(); ++j) {
    auto& it = items[j];
    const int64_t n = it.c.numel();
    auto v = buckets(it.c, b);                                   // [nb, B]
    auto norm = v.square().sum(1);                               // [nb]
    norm.sqrt_();
    auto safe = torch::where(norm > 0, norm, torch::ones_like(norm)).unsqueeze(1);
    auto r = v.abs().mul(static_cast<double>(s)).div(safe);      // [nb, B] in [0, s]
    auto gen = generator_for(static_cast<uint64_t>(opt_.seed) + static_cast<uint64_t>(dp.rank()), step, it.index);
    auto u = buckets(torch::rand({n}, gen, torch::kFloat).to(it.c.device()), b);  // U[0, 1)
    auto level = r.floor();
    level.add_(u.lt(r - level).to(torch::kFloat)).clamp_(0, static_cast<double>(s));
    auto code = level.mul_(v.sign()).view({-1}).narrow(0, 0, n).to(torch::kChar);  // [N] int8
    norms.narrow(0, norm_offs[j], nbs[j]).copy_(norm);
    codes.narrow(0, code_offs[j], n).copy_(code);
    it.own = qsgd_decode(norm, code, b, s);
  }
  msg.narrow(0, 0, 4 * norms_total).copy_(norms.view(torch::kByte));
  auto all = dp.all_gather(msg, traffic_class(), 0);  // [n·x] uint8, rank order
  for (size_t j = 0; j < items.size(); ++j) {
    auto& it = items[j];
    it.out = torch::zeros_like(it.c);
    for (int r = 0; r < dp.size(); ++r) {
      auto part = all.narrow(0, r * x, x);
      auto norm_r = floats_at(part, 4 * norm_offs[j], nbs[j]);
      auto code_r = part.narrow(0, 4 * norms_total + code_offs[j], it.c.numel()).view(torch::kChar);
      it.out.add_(qsgd_decode(norm_r, code_r, b, s));
    }
    it.out.div_(dp.size());
  }
}

}  // namespace optcc

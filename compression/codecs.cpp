#include "compression/codecs.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

#include "compression/orthogonalize.h"  // MGS, shared with the DP PowerSGD reducer
#include "kernels/gemm.h"                // the fp32 GEMM (oneDNN)

namespace optcc {

// --- none / fp16 / bf16 -------------------------------------------------------------------------

std::string CastCodec::name() const {
  return dtype_ == torch::kFloat ? "none" : dtype_ == torch::kHalf ? "fp16" : "bf16";
}

Payload CastCodec::encode_impl(const torch::Tensor& x) {
  if (dtype_ == torch::kFloat) return {{x.contiguous()}};
  // Saturate: a value beyond the wire type's range is sent as its largest finite value, not as
  // inf (an error larger than the value itself). NaN stays NaN.
  const double top = dtype_ == torch::kHalf ? static_cast<double>(std::numeric_limits<c10::Half>::max())
                                            : static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
  return {{x.clamp(-top, top).to(dtype_).contiguous()}};  // (CPU has no clamp for Half)
}

torch::Tensor CastCodec::decode(const Payload& p, int64_t numel) const {
  check_payload(p, numel);
  return p.parts[0].to(torch::kFloat);  // `none`: the part itself, no copy
}

// --- lowrank (CB, spec §2) ----------------------------------------------------------------------

std::pair<int64_t, int64_t> MatrixView::shape(int64_t numel) const {
  if (kind == Kind::kTokenMajor) {
    if (numel <= 0 || numel % hidden != 0) {
      throw std::invalid_argument(fmt::format(
          "lowrank codec (token_major view): {} elements are not a positive multiple of hidden = "
          "{}", numel, hidden));
    }
    return {numel / hidden, hidden};
  }
  const int64_t n = seq_len * (micro_batch / 8);  // the reference's hard-coded /8 (§10 item 4)
  if (numel <= 0 || numel % n != 0) {
    throw std::invalid_argument(fmt::format(
        "lowrank codec (reference view): {} elements are not a positive multiple of n = seq_len*"
        "(micro_batch/8) = {}*({}/8) = {}", numel, seq_len, micro_batch, n));
  }
  return {n, numel / n};
}

LowRankCodec::LowRankCodec(MatrixView view, int64_t rank, uint64_t seed, bool qr)
    : view_(view), rank_(rank), qr_(qr), gen_(at::detail::createCPUGenerator(seed)) {}

int64_t LowRankCodec::rank_for(int64_t numel) const {
  const auto [rows, cols] = view_.shape(numel);
  return std::min({rank_, rows, cols});
}

std::vector<std::vector<int64_t>> LowRankCodec::wire_shapes(int64_t numel) const {
  const auto [rows, cols] = view_.shape(numel);
  const int64_t r = rank_for(numel);
  return {{rows, r}, {cols, r}};
}

Payload LowRankCodec::encode_impl(const torch::Tensor& x) {
  const auto [rows, cols] = view_.shape(x.numel());
  const int64_t r = rank_for(x.numel());
  const auto m = x.contiguous().view({rows, cols});  // [rows, cols] fp32
  torch::Tensor q;                                   // [cols, r]
  if (!q_.defined() || q_.size(0) != cols || q_.size(1) != r) {
    // First message, or a message whose view differs from the last one: fresh random Q.
    q = torch::randn({cols, r}, gen_, torch::kFloat).to(x.device());
  } else {
    q = q_.to(x.device()).clone();  // the previous payload keeps its Q untouched
  }
  const std::function<void(torch::Tensor&)> orthogonalize = [this](torch::Tensor& t) {
    if (qr_) {
      orthogonalize_qr_(t);
    } else {
      orthogonalize_mgs_(t);  // MGS with the 1e-8 guard (spec §2.4)
    }
  };
  orthogonalize(q);
  refill_zero_columns_(q, gen_, orthogonalize);  // after a zero / rank-deficient message
  auto p = torch::empty({rows, r}, m.options());
  mm_f32_out(p, m, q);  // P = M Q [rows, r]
  orthogonalize(p);
  q_ = torch::empty({cols, r}, m.options());
  mm_f32_out(q_, m.t(), p);  // Q = Mᵀ P̂ [cols, r], not normalised; sent and kept for the warm start
  return {{p, q_}};
}

torch::Tensor LowRankCodec::decode(const Payload& p, int64_t numel) const {
  check_payload(p, numel);
  torch::NoGradGuard no_grad;
  const auto& factor_p = p.parts[0];  // [rows, r]
  const auto& factor_q = p.parts[1];  // [cols, r]
  auto out = torch::empty({factor_p.size(0), factor_q.size(0)}, factor_p.options());
  mm_f32_out(out, factor_p, factor_q.t());
  return out.view({numel});
}

void LowRankCodec::save(torch::serialize::OutputArchive& archive) const {
  archive.write("has_q", torch::tensor(q_.defined() ? 1 : 0));
  archive.write("q", q_.defined() ? q_.cpu() : torch::zeros({0}));
  archive.write("rng_state", gen_.get_state());
}

void LowRankCodec::load(torch::serialize::InputArchive& archive) {
  torch::Tensor has_q, q, state;
  archive.read("has_q", has_q);
  archive.read("q", q);
  archive.read("rng_state", state);
  q_ = has_q.item<int64_t>() ? q : torch::Tensor();
  gen_.set_state(state);
}

std::vector<TensorSpec> LowRankCodec::state_for(int64_t numel) const { return {{"q", wire_shapes(numel)[1]}}; }

std::vector<TensorSpec> LowRankCodec::held_state() const {
  if (!q_.defined()) return {};
  return {{"q", q_.sizes().vec()}};
}

std::unique_ptr<ActCodec> LowRankCodec::clone() const {
  auto c = std::make_unique<LowRankCodec>(*this);
  c->gen_ = gen_.clone();  // a copy of at::Generator shares its state; clone() does not
  if (q_.defined()) c->q_ = q_.clone();
  return c;
}

// --- int8 / int4 --------------------------------------------------------------------------------

int64_t QuantCodec::rows(int64_t numel) const {
  if (numel <= 0 || numel % hidden_ != 0) {
    throw std::invalid_argument(fmt::format(
        "{} codec: {} elements are not a positive multiple of hidden = {}", name(), numel,
        hidden_));
  }
  return numel / hidden_;
}

std::vector<std::vector<int64_t>> QuantCodec::wire_shapes(int64_t numel) const {
  const int64_t n = rows(numel);
  if (bits_ == 8) return {{n, hidden_}, {n, 2}};
  return {{(numel + 1) / 2}, {n, 2}};
}

std::vector<torch::ScalarType> QuantCodec::wire_dtypes(int64_t) const {
  return {torch::kByte, torch::kFloat};
}

Payload QuantCodec::encode_impl(const torch::Tensor& x) {
  const int64_t numel = x.numel();
  const auto m = x.contiguous().view({rows(numel), hidden_});  // [rows, hidden]
  const double levels = (1 << bits_) - 1;
  const auto lo_row = std::get<0>(m.min(1, /*keepdim=*/true));  // [rows, 1]
  const auto hi_row = std::get<0>(m.max(1, true));              // [rows, 1]
  const auto scale = (hi_row - lo_row) / levels;
  const auto safe = torch::where(scale > 0, scale, torch::ones_like(scale));  // constant row: q = 0
  // A row with min < 0 < max gets the grid lo = −z·scale (z = round(−min/scale)), so 0 is on it
  // and decodes to exactly 0: every element then decodes at least as close to itself as 0 is.
  const auto straddles = torch::logical_and(lo_row < 0, hi_row > 0);
  const auto lo = torch::where(straddles, -((-lo_row / safe).round() * scale), lo_row);  // [rows, 1]
  auto q = ((m - lo) / safe).round_().clamp_(0, levels).to(torch::kByte);   // [rows, hidden]
  auto meta = torch::cat({scale, lo}, 1);                                   // [rows, 2]
  if (bits_ == 4) {
    auto flat = q.view({-1});
    if (numel % 2) flat = torch::cat({flat, torch::zeros({1}, flat.options())});
    const auto pairs = flat.view({-1, 2});
    q = pairs.select(1, 0) + pairs.select(1, 1) * 16;  // [ceil(numel/2)], both nibbles ≤ 15
  }
  return {{q, meta}};
}

torch::Tensor QuantCodec::decode(const Payload& p, int64_t numel) const {
  check_payload(p, numel);
  torch::Tensor q = p.parts[0];
  if (bits_ == 4) {
    q = torch::stack({q.bitwise_and(15), q.__rshift__(4)}, 1).view({-1}).narrow(0, 0, numel);
  }
  const auto& meta = p.parts[1];
  const auto scale = meta.narrow(1, 0, 1), lo = meta.narrow(1, 1, 1);  // [rows, 1]
  return (q.reshape({rows(numel), hidden_}).to(torch::kFloat) * scale + lo).view({numel});
}

// --- topk ---------------------------------------------------------------------------------------

int64_t TopKCodec::k_for(int64_t numel) const {
  if (numel <= 0) return 0;
  if (count_ > 0) return std::min(count_, numel);
  return std::clamp<int64_t>(std::llround(fraction_ * static_cast<double>(numel)), 1, numel);
}

std::vector<std::vector<int64_t>> TopKCodec::wire_shapes(int64_t numel) const {
  const int64_t k = k_for(numel);
  return {{k}, {k}};
}

std::vector<torch::ScalarType> TopKCodec::wire_dtypes(int64_t) const {
  return {torch::kFloat, torch::kLong};
}

Payload TopKCodec::encode_impl(const torch::Tensor& x) {
  const auto idx = std::get<1>(x.abs().topk(k_for(x.numel())));  // [k] int64, by |x| descending
  return {{x.index_select(0, idx), idx}};
}

torch::Tensor TopKCodec::decode(const Payload& p, int64_t numel) const {
  check_payload(p, numel);
  return torch::zeros({numel}, p.parts[0].options()).index_put_({p.parts[1]}, p.parts[0]);
}

}  // namespace optcc

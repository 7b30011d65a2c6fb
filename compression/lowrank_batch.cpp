#include "compression/lowrank_batch.h"

#include "compression/orthogonalize.h"

#include <cmath>
#include <cstring>

namespace optcc {
namespace {


// SplitMix64 (Steele, Lea, Flood 2014): the sequence's increment and its finaliser's multipliers,
// as int64 bit patterns (tensor arithmetic is on int64; products wrap modulo 2^64 on every device).
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kMix2 = 0x94D049BB133111EBULL;

int64_t as_int64(uint64_t v) {
  int64_t out;
  static_assert(sizeof(out) == sizeof(v));
  std::memcpy(&out, &v, sizeof(out));
  return out;
}

uint64_t mix64(uint64_t z) {  // the finaliser on the host (for the per-call key)
  z = (z ^ (z >> 30)) * kMix1;
  z = (z ^ (z >> 27)) * kMix2;
  return z ^ (z >> 31);
}

/// z >>> s (logical) on int64 tensors: the arithmetic shift, with the sign's copies masked off.
torch::Tensor shift_right(const torch::Tensor& z, int s) {
  return z.bitwise_right_shift(s).bitwise_and(as_int64((~0ULL) >> s));
}

/// The finaliser as tensor operations.
torch::Tensor mix64(torch::Tensor z) {
  z = z.bitwise_xor(shift_right(z, 30)).mul(as_int64(kMix1));
  z = z.bitwise_xor(shift_right(z, 27)).mul(as_int64(kMix2));
  return z.bitwise_xor(shift_right(z, 31));
}

}  // namespace

void orthogonalize_batched_(torch::Tensor& m) {
  TORCH_CHECK(m.dim() == 3 && m.scalar_type() == torch::kFloat,
              "orthogonalize_batched_: needs a 3-D fp32 tensor [B, n, k], got ", m.sizes(), " ", m.scalar_type());
  torch::NoGradGuard no_grad;
  if (m.numel() == 0) return;
  const int64_t k = m.size(2);
  auto [q, r] = torch::linalg_qr(m, "reduced");  // q [B, n, kk], r [B, kk, k], kk = min(n, k)
  const int64_t kk = q.size(2);
  // |R_jj| is column j's norm once the columns before it are projected out. Kept columns get the
  // sign that makes R_jj positive (the unique QR; so an orthonormal input comes back as itself, up
  // to rounding), dropped ones 0. A NaN anywhere makes q NaN, and 0·NaN keeps it so.
  const auto diag = r.diagonal(0, -2, -1);                      // [B, kk]
  const auto col_norms = m.narrow(2, 0, kk).norm(2, {1});       // [B, kk]
  const auto keep = (diag.abs() > kDependentColumnFraction * col_norms).to(torch::kFloat);
  const auto scale = (keep * diag.sign()).unsqueeze(1);          // [B, 1, kk]
  if (kk == k) {
    torch::mul_out(m, q, scale);
  } else {  // n < k: the columns beyond n are zero
    m.narrow(2, 0, kk).copy_(q * scale);
    m.narrow(2, kk, k - kk).zero_();
  }
}

torch::Tensor CounterNormal::draw(at::IntArrayRef shape, const torch::TensorOptions& options) {
  const uint64_t key = mix64(seed_ ^ mix64(counter_ * kGamma + kGamma));  // this call's stream
  ++counter_;
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  // Element k's 64 random bits: the finaliser of key + (k+1)·γ, SplitMix64's own sequence.
  const auto k = torch::arange(1, numel + 1, options.dtype(torch::kLong));
  const auto bits = mix64(k.mul(as_int64(kGamma)).add(as_int64(key)));
  // Two 24-bit uniforms: u1 in (0, 1) (never 0, so the log is finite), u2 in [0, 1).
  constexpr double kTwoTo24 = 16777216.0;
  const auto u1 = shift_right(bits, 40).to(torch::kFloat).add_(0.5).div_(kTwoTo24);
  const auto u2 = shift_right(bits, 16).bitwise_and(0xFFFFFF).to(torch::kFloat).div_(kTwoTo24);
  auto out = u1.log_().mul_(-2.0).sqrt_().mul_(u2.mul(2.0 * M_PI).cos_());  // Box–Muller
  return out.view(shape);
}

void CounterNormal::save(torch::serialize::OutputArchive& archive, const std::string& prefix) const {
  archive.write(prefix + ".seed_counter", torch::tensor({as_int64(seed_), as_int64(counter_)}, torch::kLong));
}

bool CounterNormal::load(torch::serialize::InputArchive& archive, const std::string& prefix) {
  torch::Tensor t;
  if (!archive.try_read(prefix + ".seed_counter", t)) return false;
  TORCH_CHECK(t.numel() == 2 && t.scalar_type() == torch::kLong, prefix, ".seed_counter: expected int64 [2], got ",
              t.sizes(), " ", t.scalar_type());
  const auto* v = t.data_ptr<int64_t>();
  std::memcpy(&seed_, &v[0], sizeof(seed_));
  std::memcpy(&counter_, &v[1], sizeof(counter_));
  return true;
}

void prepare_q_batched_(torch::Tensor& q, CounterNormal& gen) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat, "prepare_q_batched_: needs Q [B, cols, r] fp32, got ",
              q.sizes(), " ", q.scalar_type());
  torch::NoGradGuard no_grad;
  orthogonalize_batched_(q);
  const auto fresh = gen.draw(q.sizes(), q.options());       // [B, cols, r]
  const auto zero = q.abs().amax(1, /*keepdim=*/true).eq(0);  // [B, 1, r]: the zero columns
  q.copy_(torch::where(zero, fresh, q));
  orthogonalize_batched_(q);
}

void lowrank_encode_p(const torch::Tensor& m, const torch::Tensor& q, torch::Tensor& p) {
  TORCH_CHECK(m.dim() == 3 && q.dim() == 3 && p.dim() == 3 && m.size(0) == q.size(0) && m.size(2) == q.size(1) &&
                  p.size(0) == m.size(0) && p.size(1) == m.size(1) && p.size(2) == q.size(2),
              "lowrank_encode_p: needs M [B, rows, cols], Q [B, cols, r], P [B, rows, r]; got ", m.sizes(), ", ",
              q.sizes(), ", ", p.sizes());
  torch::NoGradGuard no_grad;
  torch::bmm_out(p, m, q);
}

void lowrank_encode_q(const torch::Tensor& m, torch::Tensor& p, torch::Tensor& q_out) {
  TORCH_CHECK(m.dim() == 3 && p.dim() == 3 && q_out.dim() == 3 && p.size(0) == m.size(0) && p.size(1) == m.size(1) &&
                  q_out.size(0) == m.size(0) && q_out.size(1) == m.size(2) && q_out.size(2) == p.size(2),
              "lowrank_encode_q: needs M [B, rows, cols], P [B, rows, r], Q [B, cols, r]; got ", m.sizes(), ", ",
              p.sizes(), ", ", q_out.sizes());
  torch::NoGradGuard no_grad;
  orthogonalize_batched_(p);
  torch::bmm_out(q_out, m.transpose(1, 2), p);
}

}  // namespace optcc

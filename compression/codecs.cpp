#include "compression/codecs.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <vector>

#include "compression/orthogonalize.h"  // MGS, shared with the DP PowerSGD reducer
#include "compression/elementwise_detail.h"
#include "compression/raw_loops.h"
#include "kernels/thin_gemm.h"           // the low-rank products (P = M·Q, Q = Mᵀ·P̂, M̂ = P̂·Qᵀ)

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

torch::Tensor CastCodec::decode_alias(const Payload& p) const {
  return dtype_ == torch::kFloat ? p.parts[0] : torch::Tensor();  // `none`: the part itself, no copy
}

void CastCodec::decode_impl(const Payload& p, torch::Tensor& out) const { out.copy_(p.parts[0]); }

// --- lowrank (CB, docs/design.md §2) ----------------------------------------------------------------------

std::pair<int64_t, int64_t> MatrixView::shape(int64_t numel) const {
  if (kind == Kind::kTokenMajor) {
    if (numel <= 0 || numel % hidden != 0) {
      throw std::invalid_argument(fmt::format(
          "lowrank codec (token_major view): {} elements are not a positive multiple of hidden = "
          "{}", numel, hidden));
    }
    return {numel / hidden, hidden};
  }
  const int64_t n = seq_len * (micro_batch / 8);  // the reference's hard-coded /8 (docs/design.md §10.4)
  if (numel <= 0 || numel % n != 0) {
    throw std::invalid_argument(fmt::format(
        "lowrank codec (reference view): {} elements are not a positive multiple of n = seq_len*"
        "(micro_batch/8) = {}*({}/8) = {}", numel, seq_len, micro_batch, n));
  }
  return {n, numel / n};
}

LowRankCodec::LowRankCodec(MatrixView view, int64_t rank, uint64_t seed, bool qr)
    : view_(view), rank_(rank), qr_(qr), gen_(at::detail::createCPUGenerator(seed)), draws_(seed) {}

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
  if (!x.is_cpu() || batched_on_cpu_) return encode_batched(m, r);
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
      orthogonalize_mgs_(t);  // MGS with the 1e-8 guard (docs/design.md §2.4)
    }
  };
  orthogonalize(q);
  refill_zero_columns_(q, gen_, orthogonalize);  // after a zero / rank-deficient message
  auto p = torch::empty({rows, r}, m.options());
  thin_mm_f32_out(p, m, q);  // P = M Q [rows, r]
  orthogonalize(p);
  q_ = torch::empty({cols, r}, m.options());
  thin_mm_f32_out(q_, m.t(), p);  // Q = Mᵀ P̂ [cols, r], not normalised; sent and kept for the warm start
  return {{p, q_}};
}

// The batched kernels with B = 1: the same steps as a fixed number of operations, no host sync. A
// Q of another shape (or none yet) starts from zeros, which prepare_q_batched_ refills with draws.
Payload LowRankCodec::encode_batched(const torch::Tensor& m, int64_t r) {
  const int64_t rows = m.size(0), cols = m.size(1);
  const bool warm = q_.defined() && q_.size(0) == cols && q_.size(1) == r;
  auto q = warm ? q_.to(m.device()).unsqueeze(0).clone() : torch::zeros({1, cols, r}, m.options());  // [1, cols, r]
  prepare_q_batched_(q, draws_);
  const auto m3 = m.unsqueeze(0);  // [1, rows, cols]
  auto p = torch::empty({1, rows, r}, m.options());
  lowrank_encode_p(m3, q, p);
  auto q_new = torch::empty({1, cols, r}, m.options());
  lowrank_encode_q(m3, p, q_new);  // P̂ in place, Q = MᵀP̂
  q_ = q_new[0];
  return {{p[0], q_}};
}

void LowRankCodec::decode_impl(const Payload& p, torch::Tensor& out) const {
  const auto& factor_p = p.parts[0];  // [rows, r]
  const auto& factor_q = p.parts[1];  // [cols, r]
  auto m = out.view({factor_p.size(0), factor_q.size(0)});  // M̂ = P̂·Qᵀ straight into out
  thin_mm_f32_out(m, factor_p, factor_q.t());
}

void LowRankCodec::save(torch::serialize::OutputArchive& archive) const {
  archive.write("has_q", torch::tensor(q_.defined() ? 1 : 0));
  archive.write("q", q_.defined() ? q_.cpu() : torch::zeros({0}));
  archive.write("rng_state", gen_.get_state());
  draws_.save(archive, "draws");
}

void LowRankCodec::load(torch::serialize::InputArchive& archive) {
  torch::Tensor has_q, q, state;
  archive.read("has_q", has_q);
  archive.read("q", q);
  archive.read("rng_state", state);
  q_ = has_q.item<int64_t>() ? q : torch::Tensor();
  gen_.set_state(state);
  if (!draws_.load(archive, "draws")) draws_ = CounterNormal(draws_.seed());  // an older checkpoint: from the seed
}

std::vector<TensorSpec> LowRankCodec::state_for(int64_t numel) const { return {{"q", wire_shapes(numel)[1]}}; }

CommStep LowRankCodec::encode_arithmetic(int64_t numel, bool with_error) const {
  const auto shapes = wire_shapes(numel);  // P̂ [rows, r], Q [cols, r]
  const double rows = double(shapes.at(0).at(0)), r = double(shapes.at(0).at(1)), cols = double(shapes.at(1).at(0));
  const double flops = 4.0 * rows * cols * r + 2.0 * rows * r * r + (with_error ? 2.0 * rows * cols * r : 0.0);
  return arithmetic_step(name(), flops, 8.0 * double(numel), "encode");
}

CommStep LowRankCodec::decode_arithmetic(int64_t numel) const {
  const auto shapes = wire_shapes(numel);
  const double rows = double(shapes.at(0).at(0)), r = double(shapes.at(0).at(1)), cols = double(shapes.at(1).at(0));
  return arithmetic_step(name(), 2.0 * rows * cols * r, 8.0 * double(numel), "decode");
}

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

namespace {

/// numel / hidden: a message of codec `codec` must be whole rows (tokens) of `hidden` elements.
int64_t whole_rows(const std::string& codec, int64_t numel, int64_t hidden) {
  if (numel <= 0 || numel % hidden != 0) {
    throw std::invalid_argument(
        fmt::format("{} codec: {} elements are not a positive multiple of hidden = {}", codec, numel, hidden));
  }
  return numel / hidden;
}

}  // namespace

int64_t QuantCodec::rows(int64_t numel) const { return whole_rows(name(), numel, hidden_); }

std::vector<std::vector<int64_t>> QuantCodec::wire_shapes(int64_t numel) const {
  const int64_t n = rows(numel);
  if (bits_ == 8) return {{n, hidden_}, {n, 2}};
  return {{(numel + 1) / 2}, {n, 2}};
}

std::vector<torch::ScalarType> QuantCodec::wire_dtypes(int64_t) const {
  return {torch::kByte, torch::kFloat};
}

namespace {

/// One row's grid (codecs.h, int8; kernels::quant_grid): scale = (max − min)/levels, lo = min, or the
/// zero-point grid lo = −round(−min/scale)·scale when min < 0 < max. `safe`: scale, or 1 for a constant row.
struct RowGrid {
  float scale, lo, safe;
};

RowGrid row_grid(const float* x, int64_t n, float levels) {
  float mn, mx;
  kernels::min_max(x, n, &mn, &mx);
  const kernels::QuantGrid g = kernels::quant_grid(mn, mx, levels);
  return {g.scale, g.offset, g.safe};
}

/// Runs fill(host) on `out` when it is a CPU tensor, else on a CPU tensor copied into it.
template <class F>
void fill_on_host(torch::Tensor& out, F fill) {
  if (out.is_cpu()) return fill(out);
  auto host = torch::empty(out.sizes(), out.options().device(torch::kCPU));
  fill(host);
  out.copy_(host);
}

// --- the ATen forms (any device) -------------------------------------------------------------------
// The same operations as the CPU loops, in tensor form: each is an IEEE single-precision operation
// (sub, mul, div, round half to even) that rounds the same on every device, so payloads agree bit for bit.

/// kernels::min_max per row of a contiguous fp32 [rows, n]: min and max of the ordered-integer image
/// (raw_loops.cpp), mapped back to floats.
std::pair<torch::Tensor, torch::Tensor> rows_min_max(const torch::Tensor& x) {
  const auto k = x.view(torch::kInt);
  const auto ord = torch::bitwise_xor(k, torch::bitwise_and(k.__rshift__(31), 0x7fffffff));
  auto back = [](const torch::Tensor& m) {
    return torch::bitwise_xor(m, torch::bitwise_and(m.__rshift__(31), 0x7fffffff)).view(torch::kFloat);
  };
  return {back(std::get<0>(ord.min(1))), back(std::get<0>(ord.max(1)))};
}

/// kernels::quant_grid and kernels::quantize per row: codes (uint8 [rows, n]) and meta [rows, 2] =
/// {scale, offset}.
std::pair<torch::Tensor, torch::Tensor> quantize_rows(const torch::Tensor& x, float levels) {
  const auto [mn, mx] = rows_min_max(x);
  const auto scale = (mx - mn) / levels;
  const auto safe = torch::where(scale > 0, scale, torch::ones_like(scale));  // constant row: q = 0
  const auto offset = torch::where(torch::logical_and(mn < 0, mx > 0), -(torch::round(-mn / safe) * scale), mn);
  const auto inv = torch::ones_like(safe) / safe;
  auto v = (x - offset.unsqueeze(1)) * inv.unsqueeze(1);
  v = torch::where(v > 0, v, torch::zeros_like(v));  // NaN -> 0, as quantize()
  v = torch::where(v < levels, v, torch::full_like(v, levels));
  return {torch::round(v).to(torch::kByte), torch::stack({scale, offset}, 1)};
}

/// kernels::dequantize per row: codes [rows, n] -> fp32 with each row's {scale, offset}.
torch::Tensor dequantize_rows(const torch::Tensor& q, const torch::Tensor& meta) {
  return q.to(torch::kFloat) * meta.select(1, 0).unsqueeze(1) + meta.select(1, 1).unsqueeze(1);
}

/// Flat codes (< 16) two per byte, element 2i in the low nibble (a zero pads an odd count).
torch::Tensor pack_nibbles_aten(const torch::Tensor& q) {
  auto flat = q.reshape({-1});
  if (flat.numel() % 2) flat = torch::cat({flat, torch::zeros({1}, flat.options())});
  const auto pairs = flat.view({-1, 2});
  return torch::bitwise_or(pairs.select(1, 0), pairs.select(1, 1).__lshift__(4));
}

/// The inverse: the first n codes.
torch::Tensor unpack_nibbles_aten(const torch::Tensor& p, int64_t n) {
  return torch::stack({torch::bitwise_and(p, 15), p.__rshift__(4)}, 1).reshape({-1}).narrow(0, 0, n);
}

/// Flat 3-bit codes, eight in three bytes, least significant bit first (kernels::pack_bits; count % 8 == 0).
torch::Tensor pack_triples_aten(const torch::Tensor& q) {
  const auto c = q.reshape({-1, 8}).to(torch::kInt);
  auto v = torch::zeros({c.size(0)}, c.options());
  for (int m = 0; m < 8; ++m) v = torch::bitwise_or(v, c.select(1, m).__lshift__(3 * m));
  return torch::stack({torch::bitwise_and(v, 255), torch::bitwise_and(v.__rshift__(8), 255), v.__rshift__(16)}, 1)
      .reshape({-1})
      .to(torch::kByte);
}

torch::Tensor unpack_triples_aten(const torch::Tensor& p) {
  const auto b = p.reshape({-1, 3}).to(torch::kInt);
  const auto v = torch::bitwise_or(torch::bitwise_or(b.select(1, 0), b.select(1, 1).__lshift__(8)),
                                   b.select(1, 2).__lshift__(16));
  std::vector<torch::Tensor> codes;
  for (int m = 0; m < 8; ++m) codes.push_back(torch::bitwise_and(v.__rshift__(3 * m), 7));
  return torch::stack(codes, 1).reshape({-1}).to(torch::kByte);
}

/// kernels::hadamard_transform on each row of [rows, n] (n a power of two): the butterflies of h = 1, 2,
/// ..., n/2, each u + v and u − v of the same pairs, then the multiplication by 1/√n.
torch::Tensor hadamard_rows_aten(torch::Tensor x) {
  const int64_t rows = x.size(0), n = x.size(1);
  for (int64_t h = 1; h < n; h *= 2) {
    const auto y = x.view({rows, n / (2 * h), 2, h});
    const auto u = y.select(2, 0), v = y.select(2, 1);
    x = torch::stack({u + v, u - v}, 2).view({rows, n});
  }
  return x * (1.0f / std::sqrt(static_cast<float>(n)));
}

/// int4 packing across rows: element 2i in the low nibble of byte i, whatever the row width.
class NibbleWriter {
 public:
  explicit NibbleWriter(uint8_t* out) : out_(out) {}
  void write(const uint8_t* q, int64_t n) {
    if (n > 0 && carry_ >= 0) {
      *out_++ = static_cast<uint8_t>(carry_ | (q[0] << 4));
      ++q, --n, carry_ = -1;
    }
    kernels::pack_nibbles(q, n - n % 2, out_);
    out_ += n / 2;
    if (n % 2) carry_ = q[n - 1];
  }
  void finish() {
    if (carry_ >= 0) *out_ = static_cast<uint8_t>(carry_);  // odd numel: the last high nibble is 0
  }

 private:
  uint8_t* out_;
  int carry_ = -1;  // a low nibble waiting for its pair (across a row boundary), or -1
};

/// y[0..n) = levels of elements [first, first + n) of an int4 payload, times scale plus lo.
void dequantize_int4(const uint8_t* packed, int64_t first, int64_t n, float scale, float lo, float* y) {
  if (n > 0 && first % 2) {  // starts on a high nibble
    *y++ = static_cast<float>(packed[first / 2] >> 4) * scale + lo;
    ++first, --n;
  }
  kernels::dequantize_nibbles(packed + first / 2, n / 2, scale, lo, y);
  if (n % 2) y[n - 1] = static_cast<float>(packed[(first + n - 1) / 2] & 15) * scale + lo;
}

}  // namespace

Payload QuantCodec::encode_aten(const torch::Tensor& x) const {
  const int64_t numel = x.numel(), n = rows(numel);
  auto [q, meta] = quantize_rows(x.to(torch::kFloat).contiguous().view({n, hidden_}), static_cast<float>((1 << bits_) - 1));
  if (bits_ == 4) q = pack_nibbles_aten(q);
  return {{q, meta}};
}

void QuantCodec::decode_aten(const Payload& p, torch::Tensor& out) const {
  const auto& meta = p.parts[1];
  const int64_t n = meta.size(0);
  const auto q = bits_ == 8 ? p.parts[0].view({n, hidden_}) : unpack_nibbles_aten(p.parts[0], n * hidden_).view({n, hidden_});
  out.copy_(dequantize_rows(q, meta).view(out.sizes()));
}

Payload QuantCodec::encode_impl(const torch::Tensor& x) {
  if (!x.is_cpu()) return encode_aten(x);  // on its device, no host copy
  const int64_t numel = x.numel(), n = rows(numel);
  const auto host = x.contiguous();  // the CPU loops
  const auto shapes = wire_shapes(numel);
  auto q = torch::empty(shapes[0], torch::kByte);
  auto meta = torch::empty({n, 2}, torch::kFloat);  // {scale, lo} per row
  const float levels = static_cast<float>((1 << bits_) - 1);
  const float* px = host.data_ptr<float>();
  float* pm = meta.data_ptr<float>();
  std::vector<uint8_t> row(bits_ == 4 ? hidden_ : 0);  // int4: one row's levels before packing
  NibbleWriter nibbles(q.data_ptr<uint8_t>());
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = px + r * hidden_;
    const RowGrid g = row_grid(xr, hidden_, levels);
    pm[2 * r] = g.scale, pm[2 * r + 1] = g.lo;
    uint8_t* dst = bits_ == 8 ? q.data_ptr<uint8_t>() + r * hidden_ : row.data();
    kernels::quantize(xr, hidden_, g.lo, 1.0f / g.safe, levels, dst);
    if (bits_ == 4) nibbles.write(row.data(), hidden_);
  }
  nibbles.finish();
  return {{q, meta}};
}

void QuantCodec::decode_impl(const Payload& p, torch::Tensor& out) const {
  if (!out.is_cpu()) return decode_aten(p, out);
  const auto q = p.parts[0].to(torch::kCPU).contiguous();
  const auto meta = p.parts[1].to(torch::kCPU).contiguous();
  fill_on_host(out, [&](torch::Tensor& y) {
    const uint8_t* pq = q.data_ptr<uint8_t>();
    const float* pm = meta.data_ptr<float>();
    float* py = y.data_ptr<float>();
    for (int64_t r = 0; r < meta.size(0); ++r) {
      const int64_t first = r * hidden_;
      if (bits_ == 8) {
        kernels::dequantize(pq + first, hidden_, pm[2 * r], pm[2 * r + 1], py + first);
      } else {
        dequantize_int4(pq, first, hidden_, pm[2 * r], pm[2 * r + 1], py + first);
      }
    }
  });
}

// --- hadamard -----------------------------------------------------------------------------------

HadamardCodec::HadamardCodec(int bits, int64_t hidden, int64_t tile) : bits_(bits), hidden_(hidden), tile_(tile) {
  if (bits != 3 && bits != 4 && bits != 8) {
    throw std::invalid_argument(fmt::format("hadamard codec: option 'bits' is {} (known: 3, 4, 8)", bits));
  }
  if (hidden <= 0) throw std::invalid_argument(fmt::format("hadamard codec: hidden must be positive, got {}", hidden));
  if (tile < 8 || (tile & (tile - 1)) != 0 || hidden % tile != 0) {
    const int64_t power = hidden & -hidden;  // the largest power of two dividing hidden
    throw std::invalid_argument(fmt::format(
        "hadamard codec: option 'tile' is {}: it must be a power of two, at least 8, dividing hidden = {} ({})", tile,
        hidden, power >= 8 ? fmt::format("e.g. tile: {}", std::min<int64_t>(power, 64)) : "there is none: use int8 or int4"));
  }
}

int64_t HadamardCodec::tiles(int64_t numel) const { return whole_rows(name(), numel, hidden_) * (hidden_ / tile_); }

std::vector<std::vector<int64_t>> HadamardCodec::wire_shapes(int64_t numel) const {
  const int64_t t = tiles(numel);
  return {{t, tile_ * bits_ / 8}, {t, 2}};
}

std::vector<torch::ScalarType> HadamardCodec::wire_dtypes(int64_t) const { return {torch::kByte, torch::kFloat}; }

CommStep HadamardCodec::encode_arithmetic(int64_t numel, bool with_error) const {
  const double rotation = double(numel) * (std::log2(double(tile_)) + 1.0);
  return arithmetic_step(name(), rotation * (with_error ? 2.0 : 1.0), 8.0 * double(numel), "encode");
}

CommStep HadamardCodec::decode_arithmetic(int64_t numel) const {
  return arithmetic_step(name(), double(numel) * (std::log2(double(tile_)) + 1.0), 8.0 * double(numel), "decode");
}

Payload HadamardCodec::encode_aten(const torch::Tensor& x) const {
  const int64_t t = tiles(x.numel());
  const auto y = hadamard_rows_aten(x.to(torch::kFloat).contiguous().view({t, tile_}));
  auto [q, meta] = quantize_rows(y, static_cast<float>((1 << bits_) - 1));
  q = bits_ == 8 ? q : bits_ == 4 ? pack_nibbles_aten(q) : pack_triples_aten(q);
  return {{q.view({t, tile_ * bits_ / 8}), meta}};
}

void HadamardCodec::decode_aten(const Payload& p, torch::Tensor& out) const {
  const auto& meta = p.parts[1];
  const int64_t t = meta.size(0);
  const auto& packed = p.parts[0];
  const auto q = bits_ == 8 ? packed : bits_ == 4 ? unpack_nibbles_aten(packed.reshape({-1}), t * tile_)
                                                  : unpack_triples_aten(packed);
  out.copy_(hadamard_rows_aten(dequantize_rows(q.reshape({t, tile_}), meta)).view(out.sizes()));
}

Payload HadamardCodec::encode_impl(const torch::Tensor& x) {
  if (!x.is_cpu()) return encode_aten(x);  // on its device, no host copy
  const int64_t numel = x.numel(), t = tiles(numel), row_bytes = tile_ * bits_ / 8;
  const auto host = x.contiguous();
  auto q = torch::empty({t, row_bytes}, torch::kByte);
  auto meta = torch::empty({t, 2}, torch::kFloat);  // {scale, lo} per tile
  // 16 tiles at a time (raw_loops.h): the per-tile rotation, grid, quantisation and packing, bit for bit
  kernels::hadamard_encode_tiles(host.data_ptr<float>(), t, tile_, bits_, q.data_ptr<uint8_t>(),
                                 meta.data_ptr<float>());
  return {{q, meta}};
}

void HadamardCodec::decode_impl(const Payload& p, torch::Tensor& out) const {
  if (!out.is_cpu()) return decode_aten(p, out);
  const auto q = p.parts[0].to(torch::kCPU).contiguous();
  const auto meta = p.parts[1].to(torch::kCPU).contiguous();
  fill_on_host(out, [&](torch::Tensor& y) {
    kernels::hadamard_decode_tiles(q.data_ptr<uint8_t>(), meta.data_ptr<float>(), meta.size(0), tile_, bits_,
                                   y.data_ptr<float>());
  });
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

Payload TopKCodec::encode_aten(const torch::Tensor& x) const {
  const auto flat = x.to(torch::kFloat).contiguous().view({-1});
  const auto idx = elementwise::select_topk_tensor(flat, k_for(flat.numel()));  // increasing, ties to the smaller
  return {{flat.index_select(0, idx), idx}};
}

void TopKCodec::decode_aten(const Payload& p, torch::Tensor& out) const {
  const auto& idx = p.parts[1];
  const int64_t n = out.numel();
  if (idx.numel() > 0 && torch::logical_or(idx < 0, idx >= n).any().item<bool>()) {
    const auto bad = idx.masked_select(torch::logical_or(idx < 0, idx >= n))[0].item<int64_t>();
    throw std::invalid_argument(fmt::format("topk codec: payload index {} is outside [0, {})", bad, n));
  }
  out.zero_();
  out.view({-1}).index_copy_(0, idx, p.parts[0].to(out.scalar_type()));
}

Payload TopKCodec::encode_impl(const torch::Tensor& x) {
  if (!x.is_cpu()) return encode_aten(x);  // on its device, no host copy
  const auto host = x.to(torch::kCPU).contiguous();
  const int64_t n = host.numel(), k = k_for(n);
  auto idx = torch::empty({k}, torch::kLong);  // increasing index order
  auto values = torch::empty({k}, torch::kFloat);
  const float* px = host.data_ptr<float>();
  int64_t* pi = idx.data_ptr<int64_t>();
  float* pv = values.data_ptr<float>();
  kernels::select_topk(px, n, k, pi);  // a threshold pass and nth_element on the candidates
  for (int64_t j = 0; j < k; ++j) pv[j] = px[pi[j]];
  return {{values.to(x.device()), idx.to(x.device())}};
}

void TopKCodec::decode_impl(const Payload& p, torch::Tensor& out) const {
  if (!out.is_cpu()) return decode_aten(p, out);
  const auto values = p.parts[0].to(torch::kCPU).contiguous();
  const auto idx = p.parts[1].to(torch::kCPU).contiguous();
  fill_on_host(out, [&](torch::Tensor& y) {
    const int64_t n = y.numel();
    float* py = y.data_ptr<float>();
    const float* pv = values.data_ptr<float>();
    const int64_t* pi = idx.data_ptr<int64_t>();
    std::fill(py, py + n, 0.0f);
    for (int64_t j = 0; j < values.numel(); ++j) {
      if (pi[j] < 0 || pi[j] >= n) {
        throw std::invalid_argument(fmt::format("topk codec: payload index {} is outside [0, {})", pi[j], n));
      }
      py[pi[j]] = pv[j];
    }
  });
}

}  // namespace optcc

#include "compression/qsgd_reducer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "compression/elementwise_detail.h"
#include "compression/raw_loops.h"

namespace optcc {
using namespace elementwise;  // elementwise_detail.h

// ---- qsgd ---------------------------------------------------------------------------------------

namespace {

// bits 4: codes in [-7, 7] travel as code + 8 in 4 bits (pack_bits' layout).
void pack_codes4(const int8_t* codes, int64_t n, uint8_t* out) {
  std::vector<uint8_t> biased(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) biased[i] = static_cast<uint8_t>(codes[i] + 8);
  kernels::pack_bits(biased.data(), n, 4, out);
}

void unpack_codes4(const uint8_t* packed, int64_t n, int8_t* codes) {
  auto* u = reinterpret_cast<uint8_t*>(codes);
  kernels::unpack_bits(packed, n, 4, u);
  for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<int8_t>(static_cast<int>(u[i]) - 8);
}

void validate_qsgd(const QsgdOptions& p) {
  require(p.levels >= 1 && p.levels <= 127, "qsgd", "levels", p.levels, "in [1, 127] (int8 codes)");
  require(p.bucket_size >= 1, "qsgd", "bucket_size", p.bucket_size, ">= 1");
  require(p.min_numel >= 0, "qsgd", "min_numel", p.min_numel, ">= 0");
  require(p.bits == 4 || p.bits == 8, "qsgd", "bits", p.bits, "4 or 8 (bits per code on the wire)");
  require(p.bits == 8 || p.levels <= 7, "qsgd", "levels", p.levels, "<= 7 with bits: 4 (codes -7..7 in 4 bits)");
}

}  // namespace

QsgdOptions QsgdOptions::from_yaml(const YAML::Node& o) {
  check_option_keys(o, "qsgd", {"levels", "bucket_size", "error_feedback", "min_numel", "seed", "bits"});
  QsgdOptions p;
  p.levels = option<int64_t>(o, "qsgd", "levels", p.levels, "an integer");
  p.bucket_size = option<int64_t>(o, "qsgd", "bucket_size", p.bucket_size, "an integer");
  p.error_feedback = option<bool>(o, "qsgd", "error_feedback", p.error_feedback, "a bool");
  p.min_numel = option<int64_t>(o, "qsgd", "min_numel", p.min_numel, "an integer");
  p.seed = option<int64_t>(o, "qsgd", "seed", p.seed, "an integer");
  p.bits = option<int64_t>(o, "qsgd", "bits", p.bits, "an integer");
  validate_qsgd(p);
  return p;
}

QsgdReducer::QsgdReducer(QsgdOptions options)
    : ElementwiseReducer("qsgd", options.error_feedback, options.min_numel), opt_(options) {
  validate_qsgd(opt_);
}

std::string QsgdReducer::name() const {
  return fmt::format("qsgd(levels={}, bucket_size={}, error_feedback={}, min_numel={}, seed={}{})", opt_.levels,
                     opt_.bucket_size, opt_.error_feedback, opt_.min_numel, opt_.seed,
                     opt_.bits == 8 ? "" : fmt::format(", bits={}", opt_.bits));
}

namespace {
int64_t code_bytes(int64_t numel, int64_t bits) { return bits == 8 ? numel : (numel + 1) / 2; }
}  // namespace

int64_t QsgdReducer::compressed_bytes(int64_t numel) const {
  return code_bytes(numel, opt_.bits) + 4 * ((numel + opt_.bucket_size - 1) / opt_.bucket_size);
}

namespace {

// kernels::counter_uniform(key, i) for int64 indices i < 2³² (uint32 arithmetic in int64 lanes: a
// product of two 32-bit numbers wraps modulo 2⁶⁴, whose low 32 bits are the uint32 product's).
torch::Tensor counter_uniforms(uint64_t key, const torch::Tensor& i) {
  constexpr int64_t kMask = int64_t{0xffffffff};
  const auto k0 = static_cast<int64_t>(key & 0xffffffffu), k1 = static_cast<int64_t>(key >> 32);
  auto x = torch::bitwise_and(torch::bitwise_xor(i, k1) + k0, kMask);
  x = torch::bitwise_xor(x, x.__rshift__(16));
  x = torch::bitwise_and(x * int64_t{0x7feb352d}, kMask);
  x = torch::bitwise_xor(x, x.__rshift__(15));
  x = torch::bitwise_and(x * int64_t{0x846ca68b}, kMask);
  x = torch::bitwise_xor(x, x.__rshift__(16));
  return x.__rshift__(8).to(torch::kFloat) * 0x1p-24f;
}

// Per row of buckets xb [m, len]: Σ x² in qsgd_encode_bucket's order (16 lanes over the whole
// blocks of 16, then the tail from 0, then the lanes one by one), each step one IEEE add.
torch::Tensor bucket_sum_squares(const torch::Tensor& xb) {
  const int64_t len = xb.size(1), whole = len / 16 * 16;
  const auto sq = xb * xb;
  auto lanes = torch::zeros({xb.size(0), 16}, xb.options());
  for (int64_t i = 0; i < whole; i += 16) lanes = lanes + sq.narrow(1, i, 16);
  auto sum = torch::zeros({xb.size(0)}, xb.options());
  for (int64_t i = whole; i < len; ++i) sum = sum + sq.select(1, i);
  for (int64_t j = 0; j < 16; ++j) sum = sum + lanes.select(1, j);
  return sum;
}

}  // namespace

// The tensor form's encode of one item (qsgd_encode_bucket on every bucket, the EF update): its bucket
// norms [nb] fp32 and its codes as message bytes (int8, or code + 8 in 4 bits, element 2i low).
std::pair<torch::Tensor, torch::Tensor> QsgdReducer::encode_tensor(ElementwiseReducer::Item& it, uint64_t key) const {
  const int64_t b = opt_.bucket_size, n = it.c.numel(), whole = n / b, rest = n - whole * b;
  const auto fopts = it.c.options();
  const auto levels = torch::full({1}, static_cast<float>(opt_.levels), fopts);
  const auto index = torch::arange(n, fopts.dtype(torch::kLong));
  std::vector<torch::Tensor> norms, codes;
  // the whole buckets as rows, then the partial last one
  for (const auto& [first, rows, len] : {std::tuple<int64_t, int64_t, int64_t>{0, whole, b},
                                         std::tuple<int64_t, int64_t, int64_t>{whole * b, rest > 0, rest}}) {
    if (rows == 0 || len == 0) continue;
    auto xb = it.c.narrow(0, first, rows * len).view({rows, len});
    const auto norm = torch::sqrt(bucket_sum_squares(xb));
    const auto ratio = torch::where(norm > 0, levels / norm, torch::zeros_like(norm)).unsqueeze(1);
    const auto r = xb.abs() * ratio;
    const auto fl = torch::trunc(r);  // r ≥ 0
    const auto u = counter_uniforms(key, index.narrow(0, first, rows * len).view({rows, len}));
    auto level = fl + (u < r - fl).to(torch::kFloat);
    level = torch::where(level < levels, level, levels);
    const auto code = torch::where(xb < 0, -level, level).to(torch::kInt).to(torch::kChar);
    if (error_feedback_) xb.sub_((code.to(torch::kFloat) * norm.unsqueeze(1)) / levels);  // c − own
    norms.push_back(norm), codes.push_back(code.reshape({-1}));
  }
  const auto all = torch::cat(codes);
  if (opt_.bits == 8) return {torch::cat(norms), all.view(torch::kByte)};
  auto biased = all.to(torch::kInt) + 8;
  if (n % 2) biased = torch::cat({biased, torch::zeros({1}, biased.options())});
  const auto pairs = biased.view({-1, 2});
  return {torch::cat(norms), torch::bitwise_or(pairs.select(1, 0), pairs.select(1, 1).__lshift__(4)).to(torch::kByte)};
}

// One rank's decoded message of one item: codes (message bytes) and bucket norms -> [n] fp32.
torch::Tensor QsgdReducer::decode_tensor(const torch::Tensor& packed, const torch::Tensor& norms, int64_t n) const {
  torch::Tensor code;
  if (opt_.bits == 4) {
    code = torch::stack({torch::bitwise_and(packed, 15), packed.__rshift__(4)}, 1).reshape({-1}).narrow(0, 0, n)
               .to(torch::kInt) - 8;
  } else {
    code = packed.clone().view(torch::kChar);
  }
  const auto per_element = norms.repeat_interleave(opt_.bucket_size).narrow(0, 0, n);
  return (code.to(torch::kFloat) * per_element) / torch::full({1}, static_cast<float>(opt_.levels), norms.options());
}

void QsgdReducer::exchange_tensors(std::vector<Item>& items, Communicator& dp, int64_t step) {
  std::vector<torch::Tensor> norms, codes;
  for (auto& it : items) {
    const uint64_t key = elementwise::stream_key(static_cast<uint64_t>(opt_.seed) + static_cast<uint64_t>(dp.rank()),
                                                 step, it.index);
    auto [nrm, code] = encode_tensor(it, key);
    norms.push_back(nrm), codes.push_back(code);
  }
  // [4·Σnb bytes of fp32 norms | codes] uint8, as the raw loops' message
  const auto all_norms = torch::cat(norms);
  std::vector<torch::Tensor> parts{all_norms.view(torch::kByte)};
  parts.insert(parts.end(), codes.begin(), codes.end());
  const auto msg = torch::cat(parts);
  const int64_t x = msg.numel();
  const auto all = dp.all_gather(msg, traffic_class(), 0);  // [n·x] uint8, on the device
  int64_t norm_off = 0, code_off = 4 * all_norms.numel();
  for (size_t j = 0; j < items.size(); ++j) {
    auto& out = items[j].out;
    const int64_t n = out.numel(), nb = norms[j].numel(), code_len = codes[j].numel();
    for (int r = 0; r < dp.size(); ++r) {  // rank order
      const auto part = all.narrow(0, r * x, x);
      const auto nrm = part.narrow(0, 4 * norm_off, 4 * nb).clone().view(torch::kFloat);  // (cloned: aligned)
      const auto decoded = decode_tensor(part.narrow(0, code_off, code_len), nrm, n);
      if (r == 0) {
        out.copy_(decoded);  // 0 + d = d: a decode is never −0
      } else {
        out.add_(decoded);
      }
    }
    if (dp.size() > 1) elementwise::divide_tensor(out, dp.size());
    norm_off += nb, code_off += code_len;
  }
}

void QsgdReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  if (items[0].tensors) return exchange_tensors(items, dp, step);
  const int64_t b = opt_.bucket_size;
  const int s = static_cast<int>(opt_.levels);
  std::vector<int64_t> nbs, norm_offs, code_offs;
  int64_t norms_total = 0, codes_total = 0;
  for (const auto& it : items) {
    nbs.push_back((it.c.numel() + b - 1) / b);
    norm_offs.push_back(norms_total), code_offs.push_back(codes_total);
    norms_total += nbs.back(), codes_total += code_bytes(it.c.numel(), opt_.bits);
  }
  // [4·Σnb bytes of fp32 norms | codes: ΣN int8, or Σ⌈N/2⌉ packed 4-bit] uint8: one all-gather for every tensor.
  const bool packed = opt_.bits == 4;
  std::vector<int8_t> scratch;  // bits 4: one tensor's int8 codes before packing / after unpacking
  const int64_t x = 4 * norms_total + codes_total;
  auto msg = torch::empty({x}, torch::kByte);
  uint8_t* pm = msg.data_ptr<uint8_t>();
  std::vector<float> norms(static_cast<size_t>(norms_total));
  for (size_t j = 0; j < items.size(); ++j) {
    auto& it = items[j];
    const int64_t n = it.c.numel();
    float* c = it.c.data_ptr<float>();
    if (packed) scratch.resize(static_cast<size_t>(n));
    auto* codes = packed ? scratch.data() : reinterpret_cast<int8_t*>(pm + 4 * norms_total + code_offs[j]);
    const uint64_t key = stream_key(static_cast<uint64_t>(opt_.seed) + static_cast<uint64_t>(dp.rank()), step, it.index);
    for (int64_t q = 0; q < nbs[j]; ++q) {
      const int64_t first = q * b, len = std::min(b, n - first);
      const float norm = kernels::qsgd_encode_bucket(c + first, len, s, key, first, codes + first);
      norms[norm_offs[j] + q] = norm;
      if (error_feedback_) kernels::qsgd_subtract_decoded(codes + first, len, norm, s, c + first);  // c − own
    }
    if (packed) pack_codes4(scratch.data(), n, pm + 4 * norms_total + code_offs[j]);
  }
  std::memcpy(pm, norms.data(), 4 * norms.size());
  const auto all = to_host(dp.all_gather(to_device(msg, items[0].device), traffic_class(), 0));  // [n·x] uint8
  const uint8_t* pa = all.data_ptr<uint8_t>();
  for (size_t j = 0; j < items.size(); ++j) {
    const int64_t n = items[j].out.numel();
    float* out = items[j].out.data_ptr<float>();
    for (int r = 0; r < dp.size(); ++r) {  // rank order
      const uint8_t* part = pa + r * x;
      const int8_t* codes = reinterpret_cast<const int8_t*>(part + 4 * norms_total + code_offs[j]);
      if (packed) {
        scratch.resize(static_cast<size_t>(n));
        unpack_codes4(part + 4 * norms_total + code_offs[j], n, scratch.data());
        codes = scratch.data();
      }
      for (int64_t q = 0; q < nbs[j]; ++q) {
        const int64_t first = q * b, len = std::min(b, n - first);
        const float norm = float_at(part, 4 * (norm_offs[j] + q));
        if (r == 0) {  // 0 + d = d: a decode is never −0
          kernels::qsgd_decode(codes + first, len, norm, s, out + first);
        } else {
          kernels::qsgd_add_decoded(codes + first, len, norm, s, out + first);
        }
      }
    }
    if (dp.size() > 1) kernels::divide(out, n, static_cast<float>(dp.size()));  // ÷ 1 is the identity
  }
}

}  // namespace optcc

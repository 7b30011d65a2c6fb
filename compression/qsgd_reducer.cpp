#include "compression/qsgd_reducer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

void QsgdReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
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

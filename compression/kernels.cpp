// Raw-pointer loops (kernels.h). Plain loops over contiguous memory with no calls and no
// data-dependent branches in the hot ones, so GCC/Clang vectorise them at -O3 -fno-trapping-math;
// clamps are written as ternaries (if-converted to min/max) and float→int rounding with the
// 1.5·2²³ trick (round half to even in the default rounding mode, as std::nearbyint).
#include "compression/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace optcc::kernels {
namespace {

constexpr int kLanes = 16;  // independent accumulators: lets a reduction vectorise without reassociation

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Round half to even for 0 ≤ v < 2²²: adding 1.5·2²³ leaves no fraction bits.
inline float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

}  // namespace

// ---- checks and sums ---------------------------------------------------------------------------

bool all_finite(const float* x, int64_t n) {
  uint32_t worst = 0;  // max over exponent fields: all ones means inf or NaN
  for (int64_t i = 0; i < n; ++i) {
    uint32_t e;
    std::memcpy(&e, x + i, 4);
    e &= 0x7f800000u;
    worst = e > worst ? e : worst;
  }
  return worst != 0x7f800000u;
}

double sum_abs(const float* x, int64_t n) {
  constexpr int64_t kBlock = 4096;
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = std::min(n, b + kBlock);
    float acc[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= end; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) acc[j] += std::fabs(x[i + j]);
    }
    double block = 0.0;
    for (; i < end; ++i) block += std::fabs(x[i]);
    for (int j = 0; j < kLanes; ++j) block += acc[j];
    total += block;
  }
  return total;
}

void min_max(const float* x, int64_t n, float* lo, float* hi) {
  float a[kLanes], b[kLanes];
  for (int j = 0; j < kLanes; ++j) a[j] = b[j] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = x[i + j];
      a[j] = v < a[j] ? v : a[j];
      b[j] = v > b[j] ? v : b[j];
    }
  }
  float l = a[0], h = b[0];
  for (int j = 1; j < kLanes; ++j) l = a[j] < l ? a[j] : l, h = b[j] > h ? b[j] : h;
  for (; i < n; ++i) l = x[i] < l ? x[i] : l, h = x[i] > h ? x[i] : h;
  *lo = l;
  *hi = h;
}

// ---- element-wise --------------------------------------------------------------------------------

void add_into(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void divide(float* y, int64_t n, float d) {
  for (int64_t i = 0; i < n; ++i) y[i] /= d;
}

// ---- quantisation ---------------------------------------------------------------------------------

void quantize(const float* x, int64_t n, float lo, float inv_scale, float levels, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) {
    float v = (x[i] - lo) * inv_scale;
    v = v > 0.0f ? v : 0.0f;
    v = v < levels ? v : levels;
    q[i] = static_cast<uint8_t>(static_cast<int32_t>(round_even(v)));
  }
}

void dequantize(const uint8_t* q, int64_t n, float scale, float lo, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(q[i]) * scale + lo;
}

void pack_nibbles(const uint8_t* q, int64_t n, uint8_t* out) {
  for (int64_t i = 0; i < n / 2; ++i) out[i] = static_cast<uint8_t>(q[2 * i] | (q[2 * i + 1] << 4));
}

void dequantize_nibbles(const uint8_t* p, int64_t pairs, float scale, float lo, float* y) {
  for (int64_t i = 0; i < pairs; ++i) {
    y[2 * i] = static_cast<float>(p[i] & 15) * scale + lo;
    y[2 * i + 1] = static_cast<float>(p[i] >> 4) * scale + lo;
  }
}

// ---- selection ------------------------------------------------------------------------------------

namespace {

// |x| as an order-preserving integer key: larger key, larger magnitude; NaN above +inf.
inline uint32_t magnitude_key(const float* x, int64_t i) { return bits_of(x[i]) & 0x7fffffffu; }

// A key t with at least k keys of x at or above it, hopefully few more (0 when unsure).
uint32_t candidate_threshold(const float* x, int64_t n, int64_t k) {
  const int64_t s = std::min<int64_t>(n, 8192);
  const double expect = static_cast<double>(k) * static_cast<double>(s) / static_cast<double>(n);
  const auto m = static_cast<int64_t>(std::ceil(expect + 4.0 * std::sqrt(expect) + 8.0));
  if (n < 8 * s || m >= s) return 0;  // small or dense: every element is a candidate
  std::vector<uint32_t> sample(static_cast<size_t>(s));
  for (int64_t j = 0; j < s; ++j) sample[j] = magnitude_key(x, j * (n / s));
  std::nth_element(sample.begin(), sample.begin() + (m - 1), sample.end(), std::greater<uint32_t>());
  return sample[m - 1];
}

// The k-th largest key among `cand` (k ≤ cand.size()).
uint32_t kth_key(const float* x, const std::vector<int64_t>& cand, int64_t k) {
  std::vector<uint32_t> keys(cand.size());
  for (size_t j = 0; j < cand.size(); ++j) keys[j] = magnitude_key(x, cand[j]);
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<uint32_t>());
  return keys[k - 1];
}

template <class Index>
void select_topk_impl(const float* x, int64_t n, int64_t k, Index* idx) {
  if (k <= 0) return;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) idx[i] = static_cast<Index>(i);
    return;
  }
  uint32_t t = candidate_threshold(x, n, k);
  std::vector<int64_t> cand;  // in increasing index order
  for (int pass = 0; pass < 2; ++pass) {
    cand.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (magnitude_key(x, i) >= t) cand.push_back(i);
    }
    if (static_cast<int64_t>(cand.size()) >= k) break;
    t = 0;  // the sample's threshold was too high: every element is a candidate
  }
  const uint32_t kth = kth_key(x, cand, k);
  int64_t above = 0;
  for (int64_t i : cand) above += magnitude_key(x, i) > kth;
  int64_t out = 0, ties = k - above;  // keys equal to kth: the first `ties` in index order
  for (int64_t i : cand) {
    const uint32_t key = magnitude_key(x, i);
    if (key > kth || (key == kth && ties-- > 0)) idx[out++] = static_cast<Index>(i);
  }
}

}  // namespace

void select_topk(const float* x, int64_t n, int64_t k, int64_t* idx) { select_topk_impl(x, n, k, idx); }
void select_topk(const float* x, int64_t n, int64_t k, int32_t* idx) { select_topk_impl(x, n, k, idx); }

// ---- bits -----------------------------------------------------------------------------------------

void pack_signs(const float* x, int64_t n, uint8_t* out) {
  const int64_t full = n / 8;
  for (int64_t j = 0; j < full; ++j) {
    uint32_t b = 0;
    for (int t = 0; t < 8; ++t) b |= static_cast<uint32_t>(x[8 * j + t] >= 0.0f) << t;
    out[j] = static_cast<uint8_t>(b);
  }
  if (n % 8) {
    uint32_t b = 0;
    for (int64_t t = 0; t < n % 8; ++t) b |= static_cast<uint32_t>(x[8 * full + t] >= 0.0f) << t;
    out[full] = static_cast<uint8_t>(b);
  }
}

void add_signed(const uint8_t* bits, int64_t n, float a, float* y) {
  const int64_t full = n / 8;
  for (int64_t j = 0; j < full; ++j) {
    const uint32_t b = bits[j];
    for (int t = 0; t < 8; ++t) y[8 * j + t] += ((b >> t) & 1u) ? a : -a;
  }
  for (int64_t i = 8 * full; i < n; ++i) y[i] += ((bits[full] >> (i - 8 * full)) & 1u) ? a : -a;
}

void subtract_scaled_sign(float* x, int64_t n, float a) {
  for (int64_t i = 0; i < n; ++i) x[i] -= x[i] >= 0.0f ? a : -a;
}

// ---- stochastic quantisation ----------------------------------------------------------------------

namespace {

inline uint32_t mix32(uint32_t x) {  // an invertible avalanche of 32 bits (xorshift-multiply)
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

inline float uniform_of(uint32_t k0, uint32_t k1, uint32_t i) {
  return static_cast<float>(mix32(mix32(i ^ k0) + k1) >> 8) * 0x1p-24f;
}

}  // namespace

float counter_uniform(uint64_t key, uint64_t i) {
  return uniform_of(static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32), static_cast<uint32_t>(i));
}

float qsgd_encode_bucket(const float* x, int64_t n, int s, uint64_t key, int64_t first, int8_t* code) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * x[i + j];
  }
  float sq = 0.0f;
  for (; i < n; ++i) sq += x[i] * x[i];
  for (int j = 0; j < kLanes; ++j) sq += acc[j];
  const float norm = std::sqrt(sq);
  const float ratio = norm > 0.0f ? static_cast<float>(s) / norm : 0.0f;  // zero bucket: r = 0
  const float top = static_cast<float>(s);
  const auto k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  const auto base = static_cast<uint32_t>(first);
  for (int64_t j = 0; j < n; ++j) {
    const float r = std::fabs(x[j]) * ratio;
    const float fl = static_cast<float>(static_cast<int32_t>(r));  // r ≥ 0: truncation is floor
    float level = fl + (uniform_of(k0, k1, base + static_cast<uint32_t>(j)) < r - fl ? 1.0f : 0.0f);
    level = level < top ? level : top;
    const float signed_level = x[j] < 0.0f ? -level : level;
    code[j] = static_cast<int8_t>(static_cast<int32_t>(signed_level));
  }
  return norm;
}

void qsgd_decode(const int8_t* code, int64_t n, float norm, float s, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = (static_cast<float>(code[i]) * norm) / s;
}

void qsgd_add_decoded(const int8_t* code, int64_t n, float norm, float s, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += (static_cast<float>(code[i]) * norm) / s;
}

void qsgd_subtract_decoded(const int8_t* code, int64_t n, float norm, float s, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] -= (static_cast<float>(code[i]) * norm) / s;
}

}  // namespace optcc::kernels

// Raw-pointer loops (raw_loops.h). Plain loops over contiguous memory with no calls and no
// data-dependent branches in the hot ones, so GCC/Clang vectorise them at -O3 -fno-trapping-math;
// clamps are written as ternaries (if-converted to min/max) and float→int rounding with the
// 1.5·2²³ trick (round half to even in the default rounding mode, as std::nearbyint).
#include "compression/raw_loops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

// The hot loops are compiled twice on x86-64 Linux with GCC, for AVX2 and for the baseline
// (SSE2), and the loader picks one per machine (ifunc): wider vectors where the CPU has them,
// the same results either way (no FMA contraction: -ffp-contract=off).
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define OPTCC_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define OPTCC_SIMD_CLONES
#endif

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

OPTCC_SIMD_CLONES bool all_finite(const float* x, int64_t n) {
  uint32_t worst = 0;  // max over exponent fields: all ones means inf or NaN
  for (int64_t i = 0; i < n; ++i) {
    uint32_t e;
    std::memcpy(&e, x + i, 4);
    e &= 0x7f800000u;
    worst = e > worst ? e : worst;
  }
  return worst != 0x7f800000u;
}

OPTCC_SIMD_CLONES double sum_abs(const float* x, int64_t n) {
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

namespace {

// An order-preserving integer image of a float (an involution): negative floats get their
// magnitude bits flipped, so signed integer order is float order (−0 just below +0; NaN at the
// ends). Integer min/max reductions vectorise; float ones need -ffinite-math-only.
inline int32_t ordered(int32_t b) { return b ^ ((b >> 31) & 0x7fffffff); }

}  // namespace

OPTCC_SIMD_CLONES void min_max(const float* x, int64_t n, float* lo, float* hi) {
  int32_t first;
  std::memcpy(&first, x, 4);
  int32_t a = ordered(first), b = a;
  for (int64_t i = 0; i < n; ++i) {
    int32_t k;
    std::memcpy(&k, x + i, 4);
    k = ordered(k);
    a = k < a ? k : a;
    b = k > b ? k : b;
  }
  a = ordered(a), b = ordered(b);
  std::memcpy(lo, &a, 4);
  std::memcpy(hi, &b, 4);
}

// ---- element-wise --------------------------------------------------------------------------------

OPTCC_SIMD_CLONES void add_into(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

OPTCC_SIMD_CLONES void divide(float* y, int64_t n, float d) {
  for (int64_t i = 0; i < n; ++i) y[i] /= d;
}

// ---- quantisation ---------------------------------------------------------------------------------

OPTCC_SIMD_CLONES void quantize(const float* x, int64_t n, float lo, float inv_scale, float levels, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) {
    float v = (x[i] - lo) * inv_scale;
    v = v > 0.0f ? v : 0.0f;
    v = v < levels ? v : levels;
    q[i] = static_cast<uint8_t>(static_cast<int32_t>(round_even(v)));
  }
}

OPTCC_SIMD_CLONES void dequantize(const uint8_t* q, int64_t n, float scale, float lo, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(q[i]) * scale + lo;
}

void hadamard_transform(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      float* a = x + i;
      float* b = x + i + h;
      for (int64_t j = 0; j < h; ++j) {
        const float u = a[j], v = b[j];
        a[j] = u + v;
        b[j] = u - v;
      }
    }
  }
  const float s = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void pack_bits(const uint8_t* q, int64_t n, int bits, uint8_t* out) {
  if (bits == 8) {
    std::memcpy(out, q, static_cast<size_t>(n));
    return;
  }
  uint32_t acc = 0;
  int have = 0;  // bits waiting in acc
  for (int64_t i = 0; i < n; ++i) {
    acc |= static_cast<uint32_t>(q[i]) << have;
    have += bits;
    while (have >= 8) {
      *out++ = static_cast<uint8_t>(acc & 255u);
      acc >>= 8;
      have -= 8;
    }
  }
  if (have > 0) *out = static_cast<uint8_t>(acc & 255u);
}

void unpack_bits(const uint8_t* p, int64_t n, int bits, uint8_t* q) {
  if (bits == 8) {
    std::memcpy(q, p, static_cast<size_t>(n));
    return;
  }
  const uint32_t mask = (1u << bits) - 1u;
  uint32_t acc = 0;
  int have = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (have < bits) {
      acc |= static_cast<uint32_t>(*p++) << have;
      have += 8;
    }
    q[i] = static_cast<uint8_t>(acc & mask);
    acc >>= bits;
    have -= bits;
  }
}

QuantGrid quant_grid(float lo, float hi, float levels) {
  const float scale = (hi - lo) / levels;
  const float safe = scale > 0 ? scale : 1.0f;  // constant row: q = 0
  const float offset = lo < 0 && hi > 0 ? -(std::nearbyint(-lo / safe) * scale) : lo;
  return {scale, offset, safe};
}

namespace {

constexpr int64_t kTileBlock = 16;  // tiles per transposed block: one AVX-512 or two AVX2 vectors of fp32

// Butterflies and the 1/√tile of hadamard_transform on a block b[tile][kTileBlock] (column l: tile l),
// each element through the same operations in the same order as hadamard_transform.
OPTCC_SIMD_CLONES void hadamard_block(float* b, int64_t tile) {
  for (int64_t h = 1; h < tile; h *= 2) {
    for (int64_t i = 0; i < tile; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        float* __restrict u = b + j * kTileBlock;
        float* __restrict v = b + (j + h) * kTileBlock;
        for (int64_t l = 0; l < kTileBlock; ++l) {
          const float x = u[l], y = v[l];
          u[l] = x + y;
          v[l] = x - y;
        }
      }
    }
  }
  const float s = 1.0f / std::sqrt(static_cast<float>(tile));
  for (int64_t k = 0; k < tile * kTileBlock; ++k) b[k] *= s;
}

// Per column of b[tile][kTileBlock]: min_max's ordered-integer minimum and maximum.
OPTCC_SIMD_CLONES void block_min_max(const float* b, int64_t tile, float* lo, float* hi) {
  int32_t mn[kTileBlock], mx[kTileBlock];
  for (int64_t l = 0; l < kTileBlock; ++l) {
    int32_t k;
    std::memcpy(&k, b + l, 4);
    mn[l] = mx[l] = ordered(k);
  }
  for (int64_t j = 0; j < tile; ++j) {
    for (int64_t l = 0; l < kTileBlock; ++l) {
      int32_t k;
      std::memcpy(&k, b + j * kTileBlock + l, 4);
      k = ordered(k);
      mn[l] = k < mn[l] ? k : mn[l];
      mx[l] = k > mx[l] ? k : mx[l];
    }
  }
  for (int64_t l = 0; l < kTileBlock; ++l) {
    const int32_t a = ordered(mn[l]), c = ordered(mx[l]);
    std::memcpy(lo + l, &a, 4);
    std::memcpy(hi + l, &c, 4);
  }
}

// quantize() per column: q[j][l] from b[j][l] with column l's offset and 1/safe.
OPTCC_SIMD_CLONES void block_quantize(const float* b, int64_t tile, const float* offset, const float* inv,
                                      float levels, uint8_t* q) {
  for (int64_t j = 0; j < tile; ++j) {
    for (int64_t l = 0; l < kTileBlock; ++l) {
      float v = (b[j * kTileBlock + l] - offset[l]) * inv[l];
      v = v > 0.0f ? v : 0.0f;
      v = v < levels ? v : levels;
      q[j * kTileBlock + l] = static_cast<uint8_t>(static_cast<int32_t>(round_even(v)));
    }
  }
}

// dequantize() per column: b[j][l] = q[j][l]·scale[l] + offset[l].
OPTCC_SIMD_CLONES void block_dequantize(const uint8_t* q, int64_t tile, const float* scale, const float* offset,
                                        float* b) {
  for (int64_t j = 0; j < tile; ++j) {
    for (int64_t l = 0; l < kTileBlock; ++l) {
      b[j * kTileBlock + l] = static_cast<float>(q[j * kTileBlock + l]) * scale[l] + offset[l];
    }
  }
}

// pack_bits / unpack_bits of one tile's `tile` codes (a multiple of 8), by whole groups of 8 codes.
OPTCC_SIMD_CLONES void pack_tile(const uint8_t* q, int64_t tile, int bits, uint8_t* out) {
  if (bits == 8) {
    std::memcpy(out, q, static_cast<size_t>(tile));
  } else if (bits == 4) {
    for (int64_t i = 0; i < tile / 2; ++i) out[i] = static_cast<uint8_t>(q[2 * i] | (q[2 * i + 1] << 4));
  } else {  // 3: eight codes in three bytes, least significant bit first
    for (int64_t g = 0; g < tile / 8; ++g) {
      const uint8_t* c = q + 8 * g;
      const uint32_t v = c[0] | c[1] << 3 | c[2] << 6 | c[3] << 9 | c[4] << 12 | c[5] << 15 | c[6] << 18 |
                         static_cast<uint32_t>(c[7]) << 21;
      out[3 * g] = static_cast<uint8_t>(v), out[3 * g + 1] = static_cast<uint8_t>(v >> 8),
      out[3 * g + 2] = static_cast<uint8_t>(v >> 16);
    }
  }
}

OPTCC_SIMD_CLONES void unpack_tile(const uint8_t* p, int64_t tile, int bits, uint8_t* q) {
  if (bits == 8) {
    std::memcpy(q, p, static_cast<size_t>(tile));
  } else if (bits == 4) {
    for (int64_t i = 0; i < tile / 2; ++i) q[2 * i] = p[i] & 15, q[2 * i + 1] = p[i] >> 4;
  } else {
    for (int64_t g = 0; g < tile / 8; ++g) {
      const uint32_t v = p[3 * g] | p[3 * g + 1] << 8 | static_cast<uint32_t>(p[3 * g + 2]) << 16;
      for (int m = 0; m < 8; ++m) q[8 * g + m] = static_cast<uint8_t>((v >> (3 * m)) & 7u);
    }
  }
}

}  // namespace

void hadamard_encode_blocked(const float* x, int64_t tiles, int64_t tile, int bits, uint8_t* codes, float* meta) {
  const int64_t row_bytes = tile * bits / 8;
  const float levels = static_cast<float>((1 << bits) - 1);
  std::vector<float> block(static_cast<size_t>(tile * kTileBlock));
  std::vector<uint8_t> q(static_cast<size_t>(tile * kTileBlock)), row(static_cast<size_t>(tile));
  float lo[kTileBlock], hi[kTileBlock], offset[kTileBlock], inv[kTileBlock];
  for (int64_t t0 = 0; t0 < tiles; t0 += kTileBlock) {
    const int64_t n = std::min(kTileBlock, tiles - t0);  // tiles in this block; the rest of its columns are 0
    for (int64_t j = 0; j < tile; ++j) {
      float* dst = block.data() + j * kTileBlock;
      for (int64_t l = 0; l < n; ++l) dst[l] = x[(t0 + l) * tile + j];
      for (int64_t l = n; l < kTileBlock; ++l) dst[l] = 0.0f;
    }
    hadamard_block(block.data(), tile);
    block_min_max(block.data(), tile, lo, hi);
    for (int64_t l = 0; l < kTileBlock; ++l) {
      const QuantGrid g = quant_grid(lo[l], hi[l], levels);
      offset[l] = g.offset, inv[l] = 1.0f / g.safe;
      if (l < n) meta[2 * (t0 + l)] = g.scale, meta[2 * (t0 + l) + 1] = g.offset;
    }
    block_quantize(block.data(), tile, offset, inv, levels, q.data());
    for (int64_t l = 0; l < n; ++l) {
      for (int64_t j = 0; j < tile; ++j) row[j] = q[j * kTileBlock + l];
      pack_tile(row.data(), tile, bits, codes + (t0 + l) * row_bytes);
    }
  }
}

void hadamard_decode_blocked(const uint8_t* codes, const float* meta, int64_t tiles, int64_t tile, int bits,
                             float* y) {
  const int64_t row_bytes = tile * bits / 8;
  std::vector<float> block(static_cast<size_t>(tile * kTileBlock));
  std::vector<uint8_t> q(static_cast<size_t>(tile * kTileBlock)), row(static_cast<size_t>(tile));
  float scale[kTileBlock], offset[kTileBlock];
  for (int64_t t0 = 0; t0 < tiles; t0 += kTileBlock) {
    const int64_t n = std::min(kTileBlock, tiles - t0);
    for (int64_t l = 0; l < kTileBlock; ++l) {
      scale[l] = l < n ? meta[2 * (t0 + l)] : 0.0f, offset[l] = l < n ? meta[2 * (t0 + l) + 1] : 0.0f;
    }
    for (int64_t l = 0; l < kTileBlock; ++l) {
      if (l < n) unpack_tile(codes + (t0 + l) * row_bytes, tile, bits, row.data());
      for (int64_t j = 0; j < tile; ++j) q[j * kTileBlock + l] = l < n ? row[j] : 0;
    }
    block_dequantize(q.data(), tile, scale, offset, block.data());
    hadamard_block(block.data(), tile);
    for (int64_t l = 0; l < n; ++l) {
      for (int64_t j = 0; j < tile; ++j) y[(t0 + l) * tile + j] = block[j * kTileBlock + l];
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define OPTCC_HADAMARD_AVX2 1
namespace {

// The same per-tile computation with AVX2 registers of 8 floats, a tile at a time: the butterflies of
// h = 1, 2, 4 inside each register (a lane permutation, then u + v and u − v blended: the same two
// operations on the same operands as hadamard_transform), those of h ≥ 8 between registers, then the
// scale, the ordered-integer min/max, quant_grid, quantize's clamps (max_ps/min_ps keep its answers
// for NaN and −0) and rounding, and the packing. Bit for bit the per-tile loops.
__attribute__((target("avx2"))) inline __m256 wht_in8(__m256 r) {
  __m256 s = _mm256_permute_ps(r, 0xB1);  // lanes 1,0,3,2,...: h = 1
  r = _mm256_blend_ps(_mm256_add_ps(r, s), _mm256_sub_ps(s, r), 0xAA);
  s = _mm256_permute_ps(r, 0x4E);  // lanes 2,3,0,1,...: h = 2
  r = _mm256_blend_ps(_mm256_add_ps(r, s), _mm256_sub_ps(s, r), 0xCC);
  s = _mm256_permute2f128_ps(r, r, 0x01);  // halves swapped: h = 4
  return _mm256_blend_ps(_mm256_add_ps(r, s), _mm256_sub_ps(s, r), 0xF0);
}

// b[0..tile) holds the tile after the in-register stages; the stages h ≥ 8 and the scale, in place.
__attribute__((target("avx2"))) inline void wht_across(float* b, int64_t tile) {
  for (int64_t h = 8; h < tile; h *= 2) {
    for (int64_t i = 0; i < tile; i += 2 * h) {
      for (int64_t j = i; j < i + h; j += 8) {
        const __m256 u = _mm256_loadu_ps(b + j), v = _mm256_loadu_ps(b + j + h);
        _mm256_storeu_ps(b + j, _mm256_add_ps(u, v));
        _mm256_storeu_ps(b + j + h, _mm256_sub_ps(u, v));
      }
    }
  }
  const __m256 s = _mm256_set1_ps(1.0f / std::sqrt(static_cast<float>(tile)));
  for (int64_t j = 0; j < tile; j += 8) _mm256_storeu_ps(b + j, _mm256_mul_ps(_mm256_loadu_ps(b + j), s));
}

__attribute__((target("avx2"))) inline __m256i ordered8(__m256i k) {
  return _mm256_xor_si256(k, _mm256_and_si256(_mm256_srai_epi32(k, 31), _mm256_set1_epi32(0x7fffffff)));
}

// quantize() of 8 values to codes as 8 int32 lanes.
__attribute__((target("avx2"))) inline __m256i quantize8(__m256 y, __m256 off, __m256 inv, __m256 top) {
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  __m256 v = _mm256_mul_ps(_mm256_sub_ps(y, off), inv);
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), top);  // NaN and −0 -> 0, as quantize()
  return _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(v, magic), magic));
}

// 8 codes (int32 lanes, each < 256) as 8 bytes in order, in the low half of the result.
__attribute__((target("avx2"))) inline __m128i bytes8(__m256i q) {
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  return _mm_packus_epi16(w, w);
}

// Stores 8 codes packed at `bits` (4: four bytes, low nibble first; 8: eight bytes); 3 goes through row.
__attribute__((target("avx2"))) inline void store_codes8(__m256i q, int bits, uint8_t* out, uint8_t* row) {
  const __m128i b = bytes8(q);
  if (bits == 4) {
    const __m128i z = _mm_and_si128(_mm_or_si128(b, _mm_srli_epi16(b, 4)), _mm_set1_epi16(0x00ff));
    const int32_t packed = _mm_cvtsi128_si32(_mm_packus_epi16(z, z));
    std::memcpy(out, &packed, 4);
  } else if (bits == 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), b);
  } else {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(row), b);
  }
}

// min_max's answer from per-lane ordered-integer minima and maxima.
__attribute__((target("avx2"))) inline void lanes_min_max(__m256i mn, __m256i mx, float* lo, float* hi) {
  alignas(32) int32_t a[8], c[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), mn);
  _mm256_store_si256(reinterpret_cast<__m256i*>(c), mx);
  int32_t l = a[0], h = c[0];
  for (int k = 1; k < 8; ++k) l = a[k] < l ? a[k] : l, h = c[k] > h ? c[k] : h;
  l = ordered(l), h = ordered(h);
  std::memcpy(lo, &l, 4);
  std::memcpy(hi, &h, 4);
}

// A tile's grid from its per-lane ordered minima and maxima: meta = {scale, offset}, and quantize8's
// operands (offset, 1/safe, levels) broadcast to 8 lanes.
struct TileGrid8 {
  __m256 off, inv, top;
};
__attribute__((target("avx2"))) inline TileGrid8 tile_grid(__m256i mn, __m256i mx, float levels, float* meta) {
  float lo, hi;
  lanes_min_max(mn, mx, &lo, &hi);
  const QuantGrid g = quant_grid(lo, hi, levels);
  meta[0] = g.scale, meta[1] = g.offset;
  return {_mm256_set1_ps(g.offset), _mm256_set1_ps(1.0f / g.safe), _mm256_set1_ps(levels)};
}

// One tile of 8·A floats (A ≤ 8) held in registers throughout.
template <int A>
__attribute__((target("avx2"))) inline void encode_tile_regs(const float* x, int bits, float levels, uint8_t* out,
                                                             float* meta, uint8_t* row) {
  __m256 r[A];
  for (int a = 0; a < A; ++a) r[a] = wht_in8(_mm256_loadu_ps(x + 8 * a));
  for (int h = 1; h < A; h *= 2) {  // h registers = 8h elements
    for (int i = 0; i < A; i += 2 * h) {
      for (int a = i; a < i + h; ++a) {
        const __m256 u = r[a], v = r[a + h];
        r[a] = _mm256_add_ps(u, v), r[a + h] = _mm256_sub_ps(u, v);
      }
    }
  }
  const __m256 s = _mm256_set1_ps(1.0f / std::sqrt(static_cast<float>(8 * A)));
  __m256i mn = _mm256_set1_epi32(0x7fffffff), mx = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
  for (int a = 0; a < A; ++a) {
    r[a] = _mm256_mul_ps(r[a], s);
    const __m256i k = ordered8(_mm256_castps_si256(r[a]));
    mn = _mm256_min_epi32(mn, k), mx = _mm256_max_epi32(mx, k);
  }
  const TileGrid8 g = tile_grid(mn, mx, levels, meta);
  for (int a = 0; a < A; ++a) store_codes8(quantize8(r[a], g.off, g.inv, g.top), bits, out + a * bits, row + 8 * a);
  if (bits == 3) pack_tile(row, 8 * A, 3, out);
}

// A tile of any length (a multiple of 8) through a scratch buffer b[tile].
__attribute__((target("avx2"))) void encode_tile_mem(const float* x, int64_t tile, int bits, float levels,
                                                     uint8_t* out, float* meta, float* b, uint8_t* row) {
  for (int64_t j = 0; j < tile; j += 8) _mm256_storeu_ps(b + j, wht_in8(_mm256_loadu_ps(x + j)));
  wht_across(b, tile);
  __m256i mn = _mm256_set1_epi32(0x7fffffff), mx = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
  for (int64_t j = 0; j < tile; j += 8) {
    const __m256i k = ordered8(_mm256_castps_si256(_mm256_loadu_ps(b + j)));
    mn = _mm256_min_epi32(mn, k), mx = _mm256_max_epi32(mx, k);
  }
  const TileGrid8 g = tile_grid(mn, mx, levels, meta);
  for (int64_t j = 0; j < tile; j += 8) {
    store_codes8(quantize8(_mm256_loadu_ps(b + j), g.off, g.inv, g.top), bits, out + j / 8 * bits, row + j);
  }
  if (bits == 3) pack_tile(row, tile, 3, out);
}

__attribute__((target("avx2"))) void hadamard_encode_avx2(const float* x, int64_t tiles, int64_t tile, int bits,
                                                          uint8_t* codes, float* meta) {
  const int64_t row_bytes = tile * bits / 8;
  const float levels = static_cast<float>((1 << bits) - 1);
  std::vector<float> b(static_cast<size_t>(tile));
  std::vector<uint8_t> row(static_cast<size_t>(tile));
  for (int64_t t = 0; t < tiles; ++t) {
    const float* xt = x + t * tile;
    uint8_t* out = codes + t * row_bytes;
    float* mt = meta + 2 * t;
    switch (tile) {
      case 8: encode_tile_regs<1>(xt, bits, levels, out, mt, row.data()); break;
      case 16: encode_tile_regs<2>(xt, bits, levels, out, mt, row.data()); break;
      case 32: encode_tile_regs<4>(xt, bits, levels, out, mt, row.data()); break;
      case 64: encode_tile_regs<8>(xt, bits, levels, out, mt, row.data()); break;
      default: encode_tile_mem(xt, tile, bits, levels, out, mt, b.data(), row.data());
    }
  }
}

__attribute__((target("avx2"))) void hadamard_decode_avx2(const uint8_t* codes, const float* meta, int64_t tiles,
                                                          int64_t tile, int bits, float* y) {
  const int64_t row_bytes = tile * bits / 8;
  std::vector<uint8_t> row(static_cast<size_t>(tile) + 8);
  for (int64_t t = 0; t < tiles; ++t) {
    unpack_tile(codes + t * row_bytes, tile, bits, row.data());
    const __m256 scale = _mm256_set1_ps(meta[2 * t]), off = _mm256_set1_ps(meta[2 * t + 1]);
    float* yt = y + t * tile;
    for (int64_t j = 0; j < tile; j += 8) {
      const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.data() + j)));
      const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), scale), off);  // dequantize()
      _mm256_storeu_ps(yt + j, wht_in8(v));
    }
    wht_across(yt, tile);
  }
}
}  // namespace
#endif

void hadamard_encode_tiles(const float* x, int64_t tiles, int64_t tile, int bits, uint8_t* codes, float* meta) {
#ifdef OPTCC_HADAMARD_AVX2
  if (__builtin_cpu_supports("avx2")) return hadamard_encode_avx2(x, tiles, tile, bits, codes, meta);
#endif
  hadamard_encode_blocked(x, tiles, tile, bits, codes, meta);
}

void hadamard_decode_tiles(const uint8_t* codes, const float* meta, int64_t tiles, int64_t tile, int bits, float* y) {
#ifdef OPTCC_HADAMARD_AVX2
  if (__builtin_cpu_supports("avx2")) return hadamard_decode_avx2(codes, meta, tiles, tile, bits, y);
#endif
  hadamard_decode_blocked(codes, meta, tiles, tile, bits, y);
}

OPTCC_SIMD_CLONES void pack_nibbles(const uint8_t* q, int64_t n, uint8_t* out) {
  for (int64_t i = 0; i < n / 2; ++i) out[i] = static_cast<uint8_t>(q[2 * i] | (q[2 * i + 1] << 4));
}

OPTCC_SIMD_CLONES void dequantize_nibbles(const uint8_t* p, int64_t pairs, float scale, float lo, float* y) {
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
  const int64_t s = std::min<int64_t>(n, 16384);
  const double expect = static_cast<double>(k) * static_cast<double>(s) / static_cast<double>(n);
  const auto m = static_cast<int64_t>(std::ceil(expect + 4.0 * std::sqrt(expect) + 8.0));
  if (n < 8 * s || m >= s) return 0;  // small or dense: every element is a candidate
  std::vector<uint32_t> sample(static_cast<size_t>(s));
  for (int64_t j = 0; j < s; ++j) sample[j] = magnitude_key(x, j * (n / s));
  std::nth_element(sample.begin(), sample.begin() + (m - 1), sample.end(), std::greater<uint32_t>());
  return sample[m - 1];
}

constexpr int64_t kChunk = 4096;  // elements per flag scan: 16 KB of x stays in L1/L2 for it

}  // namespace

// out[i] = 1 if the key of x[i] is ≥ t, else 0 (a compare and a pack: vectorises cheaply).
OPTCC_SIMD_CLONES void threshold_flags(const float* __restrict x, int64_t n, uint32_t t, uint8_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(magnitude_key(x, i) >= t);
}

namespace {

/// Candidates: indices with key ≥ t (increasing) and their keys, `count` of them.
struct Candidates {
  std::vector<int64_t> index;
  std::vector<uint32_t> key;
  int64_t count = 0;
  void grow() {  // at least 4096 more slots
    const size_t size = std::max<size_t>(2 * index.size(), index.size() + 4096);
    index.resize(size), key.resize(size);
  }
};

// Collects every i with key ≥ t, chunk by chunk: a vectorised byte flag per element, then the
// nonzero flags, 32 tested at a time (x still cached), for the indices and keys.
void collect_at_or_above(const float* x, int64_t n, uint32_t t, Candidates& cand) {
  cand.count = 0;
  uint8_t flags[kChunk];
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t len = std::min(kChunk, n - c);
    threshold_flags(x + c, len, t, flags);
    const int64_t padded = (len + 31) / 32 * 32;  // whole groups of 4 words
    std::memset(flags + len, 0, static_cast<size_t>(padded - len));
    if (static_cast<int64_t>(cand.index.size()) - cand.count < len) cand.grow();  // room for the chunk
    int64_t* index = cand.index.data();
    uint32_t* key = cand.key.data();
    int64_t count = cand.count;
    for (int64_t g = 0; g < padded; g += 32) {
      uint64_t m[4];  // flag of element g + 8q + b in bit 8b of m[q] (little-endian)
      std::memcpy(m, flags + g, 32);
      if ((m[0] | m[1] | m[2] | m[3]) == 0) continue;  // the common case: no candidate among 32
      for (int q = 0; q < 4; ++q) {
        for (uint64_t w = m[q]; w; w &= w - 1) {
          const int64_t i = c + g + 8 * q + __builtin_ctzll(w) / 8;
          index[count] = i;
          key[count++] = magnitude_key(x, i);
        }
      }
    }
    cand.count = count;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define OPTCC_HAVE_AVX512_COLLECT 1
// collect_at_or_above in one AVX-512 pass: 16 keys compared at a time, the lanes at or above t
// compressed in registers (vpcompress into a register is fast everywhere; its memory form is
// microcoded on AMD) and stored whole, branch-free, the count advanced by the popcount. The slots
// past count get overwritten later, so cand needs 16 spare slots. Same output as the portable
// path: indices increasing, their keys.
__attribute__((target("avx512f"))) void collect_at_or_above_avx512(const float* x, int64_t n, uint32_t t,
                                                                    Candidates& cand) {
  cand.count = 0;
  const __m512i tv = _mm512_set1_epi32(static_cast<int>(t));
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i lane_lo = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0), lane_hi = _mm512_set_epi64(15, 14, 13, 12, 11, 10, 9, 8);
  int64_t i = 0;
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t end = std::min(n, c + kChunk);
    if (static_cast<int64_t>(cand.index.size()) - cand.count < (end - c) + 16) cand.grow();  // room for the chunk
    int64_t* index = cand.index.data();
    uint32_t* key = cand.key.data();
    int64_t count = cand.count;
    for (i = c; i + 16 <= end; i += 16) {
      const __m512i k = _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask);
      const __mmask16 m = _mm512_cmpge_epu32_mask(k, tv);
      _mm512_storeu_si512(key + count, _mm512_maskz_compress_epi32(m, k));
      const __m512i base = _mm512_set1_epi64(i);
      const auto lo = static_cast<__mmask8>(m & 0xff), hi = static_cast<__mmask8>(m >> 8);
      const int nlo = __builtin_popcount(lo);
      _mm512_storeu_si512(index + count, _mm512_maskz_compress_epi64(lo, _mm512_add_epi64(base, lane_lo)));
      _mm512_storeu_si512(index + count + nlo, _mm512_maskz_compress_epi64(hi, _mm512_add_epi64(base, lane_hi)));
      count += __builtin_popcount(m);
    }
    for (; i < end; ++i) {  // the tail of the last chunk
      const uint32_t kk = magnitude_key(x, i);
      if (kk >= t) index[count] = i, key[count++] = kk;
    }
    cand.count = count;
  }
}

bool cpu_has_avx512f() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
}
#endif

// The k-th largest key among the candidates (k ≤ their count).
uint32_t kth_key(const Candidates& cand, int64_t k) {
  std::vector<uint32_t> keys(cand.key.begin(), cand.key.begin() + cand.count);
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
  Candidates cand;
  for (int pass = 0; pass < 2; ++pass) {
#ifdef OPTCC_HAVE_AVX512_COLLECT
    if (cpu_has_avx512f()) {
      collect_at_or_above_avx512(x, n, t, cand);
    } else {
      collect_at_or_above(x, n, t, cand);
    }
#else
    collect_at_or_above(x, n, t, cand);
#endif
    if (cand.count >= k) break;
    t = 0;  // the sample's threshold was too high: every element is a candidate
  }
  const uint32_t kth = kth_key(cand, k);
  int64_t above = 0;
  for (int64_t j = 0; j < cand.count; ++j) above += cand.key[j] > kth;
  int64_t out = 0, ties = k - above;  // keys equal to kth: the first `ties` in index order
  for (int64_t j = 0; j < cand.count; ++j) {
    const uint32_t key = cand.key[j];
    if (key > kth || (key == kth && ties-- > 0)) idx[out++] = static_cast<Index>(cand.index[j]);
  }
}

}  // namespace

void select_topk(const float* x, int64_t n, int64_t k, int64_t* idx) { select_topk_impl(x, n, k, idx); }
void select_topk(const float* x, int64_t n, int64_t k, int32_t* idx) { select_topk_impl(x, n, k, idx); }

// ---- bits -----------------------------------------------------------------------------------------

OPTCC_SIMD_CLONES void pack_signs(const float* x, int64_t n, uint8_t* out) {
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

OPTCC_SIMD_CLONES void add_signed(const uint8_t* bits, int64_t n, float a, float* y) {
  const int64_t full = n / 8;
  for (int64_t j = 0; j < full; ++j) {
    const uint32_t b = bits[j];
    for (int t = 0; t < 8; ++t) y[8 * j + t] += ((b >> t) & 1u) ? a : -a;
  }
  for (int64_t i = 8 * full; i < n; ++i) y[i] += ((bits[full] >> (i - 8 * full)) & 1u) ? a : -a;
}

OPTCC_SIMD_CLONES void subtract_scaled_sign(float* x, int64_t n, float a) {
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

// One avalanche round over a key-dependent bijection of i: different keys, different streams.
inline float uniform_of(uint32_t k0, uint32_t k1, uint32_t i) {
  return static_cast<float>(mix32((i ^ k1) + k0) >> 8) * 0x1p-24f;
}

}  // namespace

float counter_uniform(uint64_t key, uint64_t i) {
  return uniform_of(static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32), static_cast<uint32_t>(i));
}

OPTCC_SIMD_CLONES float qsgd_encode_bucket(const float* x, int64_t n, int s, uint64_t key, int64_t first, int8_t* code) {
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

OPTCC_SIMD_CLONES void qsgd_decode(const int8_t* code, int64_t n, float norm, float s, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = (static_cast<float>(code[i]) * norm) / s;
}

OPTCC_SIMD_CLONES void qsgd_add_decoded(const int8_t* code, int64_t n, float norm, float s, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += (static_cast<float>(code[i]) * norm) / s;
}

OPTCC_SIMD_CLONES void qsgd_subtract_decoded(const int8_t* code, int64_t n, float norm, float s, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] -= (static_cast<float>(code[i]) * norm) / s;
}

}  // namespace optcc::kernels

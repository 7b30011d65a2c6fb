// Raw-pointer loops behind the element-wise codecs (codecs.cpp: int8, int4, topk) and reducers
// (topk, randomk, qsgd, signsgd). Internal to compression/, not a public contract of the project.
//
// Every function works on contiguous host memory given by pointers and counts (no LibTorch in this
// file or in raw_loops.cpp), single-threaded, allocation-free unless stated. raw_loops.cpp is compiled
// with -O3 -fno-trapping-math (compression/CMakeLists.txt) so its plain loops vectorise; neither
// flag changes a result (no fast-math: every operation rounds as written here).
#pragma once

#include <cstdint>
#include <vector>

namespace optcc::kernels {

// ---- checks and sums ---------------------------------------------------------------------------

/// True when no x[i] (i < n) is ±inf or NaN.
bool all_finite(const float* x, int64_t n);
/// Σ |x[i]| accumulated in blocks of fp32 lanes, blocks added in double; returned as double.
double sum_abs(const float* x, int64_t n);
/// Smallest and largest of x[0..n) (n ≥ 1; NaN entries are skipped unless all are NaN).
void min_max(const float* x, int64_t n, float* lo, float* hi);

// ---- element-wise --------------------------------------------------------------------------------

/// y[i] += x[i].
void add_into(float* y, const float* x, int64_t n);
/// y[i] /= d.
void divide(float* y, int64_t n, float d);

// ---- quantisation (int8 / int4 codecs) ------------------------------------------------------------

/// q[i] = clamp(round_half_even((x[i] − lo)·inv_scale), 0, levels), levels ≤ 255.
void quantize(const float* x, int64_t n, float lo, float inv_scale, float levels, uint8_t* q);
/// y[i] = q[i]·scale + lo.
void dequantize(const uint8_t* q, int64_t n, float scale, float lo, float* y);
/// Packs levels ≤ 15 two per byte: out[i] = q[2i] | q[2i+1] << 4 for i < n/2 (n even).
void pack_nibbles(const uint8_t* q, int64_t n, uint8_t* out);
/// y[2i] = (p[i] & 15)·scale + lo, y[2i+1] = (p[i] >> 4)·scale + lo, for i < pairs.
void dequantize_nibbles(const uint8_t* p, int64_t pairs, float scale, float lo, float* y);

// ---- Walsh–Hadamard rotation and bit packing (hadamard codec) ---------------------------------------

/// x[0..n) ← H·x / √n in place, H the n×n Walsh–Hadamard matrix in Sylvester order (n a power of
/// two, n ≥ 1): an orthonormal, symmetric transform, so it is its own inverse and keeps ‖x‖₂.
/// log2(n) butterfly passes of n/2 additions and n/2 subtractions, then n multiplications.
void hadamard_transform(float* x, int64_t n);
/// Packs n codes of `bits` bits each (1 ≤ bits ≤ 8, every code < 2^bits) into ⌈n·bits/8⌉ bytes,
/// least significant bit first: code i holds bits [i·bits, (i+1)·bits) of the stream; unused high
/// bits of the last byte are 0.
void pack_bits(const uint8_t* q, int64_t n, int bits, uint8_t* out);
/// The inverse of pack_bits: q[0..n) from ⌈n·bits/8⌉ bytes.
void unpack_bits(const uint8_t* p, int64_t n, int bits, uint8_t* q);

/// One row's (or tile's) quantisation grid from its smallest and largest value (int8, int4 and
/// hadamard codecs, codecs.h): scale = (hi − lo)/levels; safe = scale, or 1 for a constant row
/// (every code 0); offset = −round_half_even(−lo/safe)·scale when lo < 0 < hi (0 on the grid), else lo.
struct QuantGrid {
  float scale, offset, safe;
};
QuantGrid quant_grid(float lo, float hi, float levels);

/// The hadamard codec's encode of `tiles` tiles of `tile` floats (x[tiles·tile], tile a power of two
/// ≥ 8, bits ∈ {3, 4, 8}): each tile rotated (hadamard_transform), given its grid (min_max, quant_grid),
/// quantised to 2^bits − 1 levels (quantize) and packed (pack_bits) into codes[tiles · tile·bits/8];
/// meta[2i, 2i+1] = tile i's {scale, offset}. Bit for bit what those per-tile calls give, with vector
/// operations instead of loops over a few elements (the two paths below). Allocates O(16·tile) bytes.
void hadamard_encode_tiles(const float* x, int64_t tiles, int64_t tile, int bits, uint8_t* codes, float* meta);
/// Its inverse, as unpack_bits, dequantize and hadamard_transform per tile give it: y[tiles·tile].
void hadamard_decode_tiles(const uint8_t* codes, const float* meta, int64_t tiles, int64_t tile, int bits, float* y);
/// The two paths behind them, the same bytes out: on x86-64 CPUs with AVX2 (picked at run time) a tile
/// at a time in registers of 8 floats (the butterflies of h = 1, 2, 4 as lane permutations); elsewhere
/// 16 tiles at a time in a transposed block of plain loops. The portable one is declared for its test.
void hadamard_encode_blocked(const float* x, int64_t tiles, int64_t tile, int bits, uint8_t* codes, float* meta);
void hadamard_decode_blocked(const uint8_t* codes, const float* meta, int64_t tiles, int64_t tile, int bits, float* y);

// ---- selection (topk) ----------------------------------------------------------------------------

/// Indices of the k largest |x[i]| (0 ≤ k ≤ n), written to idx[0..k) in increasing index order.
/// Ties at the k-th magnitude go to the smallest indices; NaN counts as larger than +inf (as
/// torch::topk). Exact (not approximate): a threshold from a strided sample, one pass collecting
/// the candidates at or above it, std::nth_element on the candidates; falls back to nth_element
/// over all of x when the sample's threshold keeps fewer than k. Allocates O(k + sample) scratch
/// (O(n) on the fallback).
void select_topk(const float* x, int64_t n, int64_t k, int64_t* idx);
void select_topk(const float* x, int64_t n, int64_t k, int32_t* idx);

// ---- bits (signsgd) ------------------------------------------------------------------------------

/// out[j] bit t = (x[8j + t] >= 0) for 8j + t < n; ⌈n/8⌉ bytes, unused high bits of the last 0.
void pack_signs(const float* x, int64_t n, uint8_t* out);
/// y[i] += bit i of bits ? a : −a (bit i%8 of byte i/8), for i < n.
void add_signed(const uint8_t* bits, int64_t n, float a, float* y);
/// x[i] −= (x[i] >= 0 ? a : −a): the residual of the scaled sign a·sign(x).
void subtract_scaled_sign(float* x, int64_t n, float a);

// ---- stochastic quantisation (qsgd) --------------------------------------------------------------

/// A counter-based uniform in [0, 1) with 24 random bits: u(key, i), the same on any machine.
float counter_uniform(uint64_t key, uint64_t i);
/// One QSGD bucket of n ≤ bucket elements starting at global element `first` of its tensor:
/// norm = ‖x‖₂; r = |x|·(s/norm); ℓ = ⌊r⌋ + [u(key, first+i) < r − ⌊r⌋] clamped to [0, s];
/// code = sign(x)·ℓ (0 for a zero bucket). Returns the norm.
float qsgd_encode_bucket(const float* x, int64_t n, int s, uint64_t key, int64_t first, int8_t* code);
/// y[i] = (code[i]·norm) / s: the decode, exact for values on the grid (never −0).
void qsgd_decode(const int8_t* code, int64_t n, float norm, float s, float* y);
/// y[i] += (code[i]·norm) / s.
void qsgd_add_decoded(const int8_t* code, int64_t n, float norm, float s, float* y);
/// x[i] −= (code[i]·norm) / s: the residual of the bucket's own decode.
void qsgd_subtract_decoded(const int8_t* code, int64_t n, float norm, float s, float* x);

}  // namespace optcc::kernels

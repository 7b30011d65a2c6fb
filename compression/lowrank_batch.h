// Batched low-rank kernels: the encode of the low-rank compressors (the DP PowerSGD reducer and the
// CB `lowrank` codec) on B same-shape matrices at once, as a fixed number of batched ATen operations.
//
// Why: on a GPU, one kernel per column pair (MGS as tensor operations, orthogonalize.h) makes the
// encode launch-bound: O(r²) small kernels per matrix and O(B·r²) per step. Here every step is one
// batched operation over all B matrices, whatever r and B: the number of ATen operations one encode
// issues does not grow with the rank r of the factors or with B (a CPU test counts them), and no
// operation reads a value back to the host (no host synchronisation inside an encode).
//
// Which path each device takes (the callers decide, and say so in their headers): CUDA tensors take
// this batched path; CPU tensors keep the per-matrix kernels of orthogonalize.h and kernels/thin_gemm.h,
// which are faster there (bench_compression: reducer/powersgd/.../{batched,per_matrix}). The CPU can
// run this path too (tests; the `batched` benchmarks).
//
// Shapes and dtypes: every tensor here is fp32, batch-first: M [B, rows, cols], P [B, rows, r],
// Q [B, cols, r], on any one device. Nothing here communicates; callers all-reduce P and Q between
// the steps (encode_p, then encode_q).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace optcc {

/// Orthonormalises the columns of every matrix of m [B, n, k] fp32, in place, with one batched
/// Householder QR (torch::linalg_qr): m_b := Q_b [n, k] (reduced; when n < k, columns ≥ n are zero).
/// Column j of matrix b is set to exactly zero where |R_jj| ≤ 1e-4·‖m_b,j‖: it is (numerically) in
/// the span of the columns before it, or zero, as in the per-matrix kernels (orthogonalize.h), so
/// rank-deficient inputs give zero columns and m_b·m_bᵀ is an orthogonal projector: for any A,
/// ‖A − m_b·m_bᵀ·A‖ ≤ ‖A‖. A matrix with a NaN keeps NaN columns. The same columns' span as
/// orthogonalize_qr_ on each matrix alone (equal values on CPU, where both call LAPACK per matrix).
/// Throws c10::Error unless m is 3-D fp32.
void orthogonalize_batched_(torch::Tensor& m);

/// Standard normal draws computed by tensor operations on any device, deterministic and equal on
/// every rank that holds the same (seed, counter): draw k of a call is a hash (SplitMix64's
/// finaliser) of (seed, the call's counter, k), turned into a normal by Box–Muller in fp32. Each
/// call advances the counter by one, whatever it draws, so the sequence depends only on the number
/// of calls, never on data. No host synchronisation, no CPU generator on a GPU's path. Its state is
/// (seed, counter); save() and load() carry it in a checkpoint.
/// Quality: the hash's 64 bits give two 24-bit uniforms per draw; the draws have mean 0 and
/// variance 1 to sampling error (tests check both); meant for refilling columns, not for statistics.
class CounterNormal {
 public:
  explicit CounterNormal(uint64_t seed = 0) : seed_(seed) {}
  /// Draws of `shape` with `options` (fp32 output on options' device); advances the counter.
  torch::Tensor draw(at::IntArrayRef shape, const torch::TensorOptions& options);
  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }
  /// Keys "<prefix>.seed_counter": int64 [2] {seed, counter}.
  void save(torch::serialize::OutputArchive& archive, const std::string& prefix) const;
  /// Reads what save() wrote; returns false (state unchanged) when the key is absent (a checkpoint
  /// written before this generator existed).
  bool load(torch::serialize::InputArchive& archive, const std::string& prefix);

 private:
  uint64_t seed_ = 0;
  uint64_t counter_ = 0;
};

/// Warm-start upkeep of Q [B, cols, r] fp32, in place, for the batched path: q is orthonormalised
/// (orthogonalize_batched_); every column that comes out zero (a zero or rank-deficient matrix last
/// time) is replaced by normal draws from `gen` (one draw of q's whole shape, used only where a
/// column is zero: no host sync to find them), and q is orthonormalised again. A zero column would
/// otherwise stay zero for ever (see refill_zero_columns_ in orthogonalize.h).
void prepare_q_batched_(torch::Tensor& q, CounterNormal& gen);

/// P := M·Q [B, rows, r] (torch::bmm into p, which must be [B, rows, r] fp32 and may be a view of a
/// packed send buffer). The first half of an encode; the caller may all-reduce P before encode_q.
void lowrank_encode_p(const torch::Tensor& m, const torch::Tensor& q, torch::Tensor& p);

/// P̂ := orthonormalised P (in place, orthogonalize_batched_), then Q := Mᵀ·P̂ [B, cols, r] into q_out.
/// The second half of an encode: P̂ and Q are the two factors sent; the decode is P̂·Qᵀ.
void lowrank_encode_q(const torch::Tensor& m, torch::Tensor& p, torch::Tensor& q_out);

}  // namespace optcc

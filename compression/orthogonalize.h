// Dense kernels of the low-rank compressors (the DP PowerSGD reducer and the CB codec): column
// orthonormalisation of the factors (docs/design.md §6.2, §7 "MGS with the 1e-8 guard") and the fp32 GEMM
// they run on M.
#pragma once

#include <torch/torch.h>

#include <functional>

namespace optcc {

/// The dependence rule every orthonormalisation here applies (MGS, QR, the batched QR of
/// lowrank_batch.h): a column with at most this fraction of its own norm left once the columns
/// before it are projected out is numerically in their span, and is set to exactly zero.
constexpr double kDependentColumnFraction = 1e-4;

/// Modified Gram–Schmidt, in place, column by column, on m [rows, cols] fp32 (rows ≥ cols not
/// required). Result: every column is unit length (up to the eps guard) and orthogonal to the
/// others at fp32 precision, or exactly zero; so m·mᵀ is an orthogonal projector (onto the kept
/// columns' span) and ‖A − m·mᵀA‖ ≤ ‖A‖ for any A, which is what makes the low-rank compressors
/// never worse than sending nothing.
///   Pass 1 (the reference, docs/design.md §2.4): column j is divided by (‖m_j‖ + eps) after the
///   projections onto columns < j are removed, and its projection is removed from later columns.
///   Pass 2 ("twice is enough", Daniel–Gragg–Kaufman–Stewart): a column that kept at most 1/√2 of
///   its original norm n0 through pass 1 is projected onto the finished columns once more. It is
///   set to exactly 0 when what is left is ≤ 1e-4·n0, or when pass 2 removed as much again (it
///   lies in the span of the earlier columns: rank(m) < cols, e.g. a rank-deficient message).
///   Without pass 2 such a column would be normalised from its rounding residue and would not be
///   orthogonal to the others (the reference's loss of orthogonality: errors larger than the
///   input). Well-conditioned inputs never take pass 2 and give the reference's bits.
/// A column of norm 0 stays exactly 0 (no NaN even with eps = 0); a NaN column stays NaN.
/// The guard's regime: a column of norm n ≲ 1e-6 comes out shorter than unit (n/(n + eps), as in
/// the reference), and pass 1 then removes only part of its direction from later columns, so the
/// dependence test above (which assumes unit columns) may keep nearly parallel short columns.
/// m·mᵀ is then no projector, but its eigenvalues stay below 2 (in the worst case, a rank-1 input,
/// Σ n_j²/(n_j + eps)² peaks near 1.4), so ‖A − m·mᵀA‖ ≤ ‖A‖ still holds; tests check it.
/// CPU: a sequential kernel on a column-major copy; norms and projection coefficients are
/// accumulated in double in a fixed order, so the result is deterministic and does not depend on
/// the SIMD width. Other devices: orthogonalize_mgs_tensor_ops_ (float accumulation, no host sync).
void orthogonalize_mgs_(torch::Tensor& m, double eps = 1e-8);

/// The same algorithm as tensor operations (what non-CPU tensors get; callable on CPU, for tests).
void orthogonalize_mgs_tensor_ops_(torch::Tensor& m, double eps = 1e-8);

/// Householder QR: m := Q [rows, cols] (reduced; columns ≥ rows zero when rows < cols). Column j
/// is zeroed where |R_jj| ≤ 1e-4·‖m_j‖ (numerically dependent, as in MGS; exactly dependent or
/// zero columns included), so rank-deficient inputs give zero columns like MGS. Same contract.
void orthogonalize_qr_(torch::Tensor& m);

/// Warm-start upkeep of the low-rank compressors, after orthogonalising their Q [cols, r]: a zero
/// column of Q (left by a zero or rank-deficient message: Q = Mᵀ·P̂ with zero columns in P̂) would
/// stay zero for ever (P = M·Q gets a zero column, hence so does the next Q), and that direction
/// would never be sent again. Each zero column is refilled with standard normal draws from `gen`
/// (CPU; one randn [rows, z] for z zero columns, so the draws depend only on q's zero pattern and
/// the generator state), then `orth` orthogonalises q again. Returns z. One host sync.
int64_t refill_zero_columns_(torch::Tensor& q, at::Generator& gen, const std::function<void(torch::Tensor&)>& orth);

}  // namespace optcc

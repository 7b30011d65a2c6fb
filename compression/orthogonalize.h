// Dense kernels of the low-rank compressors (the DP PowerSGD reducer and the CB codec): column
// orthonormalisation of the factors (spec §6.2, §7 "MGS with the 1e-8 guard") and the fp32 GEMM
// they run on M.
#pragma once

#include <torch/torch.h>

namespace optcc {

/// Modified Gram–Schmidt, in place, column by column, on m [rows, cols] fp32 (rows ≥ cols not
/// required). Column j is divided by (‖m_j‖ + eps) after the projections onto columns < j are
/// removed. A column of norm 0 stays exactly 0 (it is left alone, so no NaN even with eps = 0),
/// and later columns then project onto it trivially. Like the reference, a column that depends
/// on earlier ones (rank(m) < cols) is normalised from its rounding residue and is then not
/// orthogonal to them (loss of orthogonality); use QR when that matters.
/// CPU: a sequential kernel on a column-major copy; norms and projection coefficients are
/// accumulated in double in a fixed order, so the result is deterministic and does not depend on
/// the SIMD width. Other devices: the same algorithm as tensor operations (float accumulation).
void orthogonalize_mgs_(torch::Tensor& m, double eps = 1e-8);

/// Householder QR: returns Q [rows, cols] (reduced). Columns whose R diagonal is 0 (to 0 exactly)
/// are zeroed, so rank-deficient inputs keep zero columns like MGS. Same shape contract as MGS.
void orthogonalize_qr_(torch::Tensor& m);

/// out := beta·out + alpha·(a·b) for 2-D fp32 tensors a [m, k], b [k, n], out [m, n] (beta = 0:
/// out is not read). a and b may be transposed views (one unit stride); out must not overlap a or
/// b. On CPU it calls oneDNN's dnnl_sgemm when LibTorch has it loaded (found at run time; on
/// these tall-skinny shapes it is 1.2–1.6× faster than OpenBLAS on one thread), else at::mm_out /
/// addmm_. oneDNN runs on LibTorch's intra-op (OpenMP) threads. The environment variable
/// OPTCC_LOWRANK_GEMM=aten forces the at:: path.
void mm_f32_out(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, float alpha = 1.0f,
                float beta = 0.0f);

}  // namespace optcc

// kernels/thin_gemm.h: the three products of the low-rank compressors (CB's lowrank codec,
// docs/design.md §2; PowerSGD, docs/design.md §6.2), where one dimension is the rank r of the factorisation (r ≤ 64):
//
//   project       P = M·Q       M [rows, cols] row-major, Q [cols, r]          -> P [rows, r]
//   back-project  Q = Mᵀ·P̂      the same M (read by rows, never transposed)    -> Q [cols, r]
//   expand        M̂ = P̂·Qᵀ      P̂ [rows, r], Q [cols, r]                       -> M̂ [rows, cols]
//
// A general GEMM (gemm.h: oneDNN or OpenBLAS) runs these at 40-80 GFLOP/s on one core of this
// project's CPUs, 40-75% of its ~105 GFLOP/s sgemm, because the reduction over r = 16 is too short
// for its packing and the output of expand is written through the cache (a fresh M̂ of 100 MB costs
// a read of every line before it is written). These kernels keep a tile of the thin operand in
// registers, stream M once per pass, and write a large M̂ with non-temporal stores.
//
// Which ISA runs is chosen once per process from the CPU: AVX-512F (with AVX2's 8-lane kernels for
// a project or back-project of r ≤ 8, which would half fill a 16-lane vector), else AVX2+FMA, else none
// (then every call is mm_f32_out). OPTCC_THIN_GEMM=avx2 or none in the environment caps it (to
// test or time the lower paths; avx512 is the default cap); another value makes every call of
// this header's functions (so the first lowrank or PowerSGD compression) throw
// std::invalid_argument naming the variable. Results are within fp32 round-off of
// mm_f32_out (blocked fp32 sums with fused multiply-adds: thin_gemm_sum_block) and do not depend
// on the number of threads.
#pragma once

#include <torch/torch.h>

#include <string>

namespace optcc {

/// The instruction set the thin kernels use on this CPU: "avx512", "avx2", or "none" (CPU without
/// AVX2+FMA, or OPTCC_THIN_GEMM=none: every thin_mm_f32_out call is mm_f32_out). Throws
/// std::invalid_argument for a malformed OPTCC_THIN_GEMM.
std::string thin_gemm_isa();

/// Which path thin_mm_f32_out(out, a, b, alpha, beta) takes for these operands: "project",
/// "back-project", "expand" (the kernels above; "expand (streaming stores)" when M̂ is written with
/// non-temporal stores), or "gemm" (mm_f32_out: another layout, a wide thin side, a non-CPU or
/// non-fp32 tensor, beta ≠ 0 outside expand, or no supported ISA). For tests and benchmarks.
std::string thin_gemm_path(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                           float beta = 0.0f);

/// out := beta·out + alpha·(a·b) for 2-D fp32 tensors a [m, k], b [k, n], out [m, n], as
/// mm_f32_out (gemm.h: same contract, same checks, c10::Error on shape or dtype mismatch, no
/// autograd, out must not overlap a or b), through the thin kernels when the operands are one of
///   project       a [m, k] with unit column stride, b [k, n] with unit column stride, n ≤ the
///                 ISA's thin limit (64 with AVX-512, 32 with AVX2), beta = 0;
///   back-project  a = x.t() for an x [k, m] with unit column stride, b as above, n ≤ the limit,
///                 beta = 0;
///   expand        a [m, k] with unit column stride, b = y.t() for a y [n, k] with unit column
///                 stride, k ≤ 64; any alpha, beta.
/// In every case each operand's rows must lie at least a row apart (row stride ≥ row length, as
/// a contiguous tensor or a narrowed view has; an expand()ed or overlapping view goes to
/// mm_f32_out, which copies it). Streaming (non-temporal) stores when beta = 0,
///                 out is 64-byte aligned with a row stride of a multiple of 16 floats, and out
///                 is at least kThinStreamBytes;
/// and out row-major with unit column stride; otherwise mm_f32_out. Runs on the calling thread and
/// LibTorch's intra-op threads (at::parallel_for, by rows of out). Any rank, any thread.
void thin_mm_f32_out(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, float alpha = 1.0f,
                     float beta = 0.0f);

/// The sums' block length (thin_gemm.h's numerics, for tests and error analysis) on this CPU for
/// `path` (thin_gemm_path's "project", "back-project", "expand") at thin width `thin` (n for
/// project and back-project, k for expand): each element of the product is a sum over the long
/// dimension taken in blocks of this many terms in ascending order, each block from 0 with one fma
/// per term, the block sums added in order (so its round-off grows with the block length plus the
/// number of blocks, as a blocked BLAS's does). 0 for "gemm" or without kernels.
int64_t thin_gemm_sum_block(const std::string& path, int64_t thin);

/// Outputs of expand from this size on (bytes) are written with non-temporal stores: larger than
/// the 16-32 MiB last-level cache a core of a server CPU has, so they would go to memory anyway,
/// and a non-temporal store spares the read of every line a normal store makes first.
constexpr int64_t kThinStreamBytes = int64_t(32) << 20;

}  // namespace optcc

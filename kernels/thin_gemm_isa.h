// Internal to kernels/: the per-instruction-set entry points behind thin_gemm.h. Each ISA's kernels
// live in their own translation unit (thin_gemm_avx512.cpp, thin_gemm_avx2.cpp), compiled with that
// ISA's flags and including nothing but <immintrin.h>, <cstdint> and this header, so no inline
// function compiled for AVX-512 can be picked by the linker for code that runs on other CPUs.
// thin_gemm.cpp checks the CPU at run time and calls only what it supports.
#pragma once

#include <cstdint>

namespace optcc::thin_gemm_detail {

/// One row-major fp32 product C = alpha·(A·B) + beta·C, C [m, n], over k; the layouts per kind:
///   kProject      A [m, k] at a (row stride lda), B [k, n] at b (ldb), n ≤ max_thin: P = M·Q.
///   kBackProject  A = Xᵀ with X [k, m] at a (ldx = lda), B [k, n] at b (ldb), n ≤ max_thin:
///                 Q = Mᵀ·P̂ (M read row by row, never transposed).
///   kExpand       A [m, k] at a (lda), B = Yᵀ with Y [n, k] at b (ldy = ldb), k ≤ 64: M̂ = P̂·Qᵀ.
/// Every element of C is a sum over k in ascending order, in blocks (kProject: kSumBlock terms;
/// kBackProject: the ISA's group of rows of X; kExpand: one block), each from 0 with one fma per
/// term, the block sums added in order; then times alpha (kProject, kBackProject: they need
/// beta = 0) or alpha·sum + beta·C (kExpand). The same whatever the row range a thread gets or
/// the cache blocking: results do not depend on the number of threads. `stream` (kExpand, beta = 0): non-temporal stores for C's full vectors, for
/// outputs larger than the cache; it needs c and ldc aligned to the ISA's vector width.
struct Args {
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool stream = false;
};

/// The cache block the kernels size their reused operand to (a B chunk of kProject, a C chunk of
/// kBackProject, a transposed Y chunk of kExpand), bytes: about a quarter of a 1-2 MiB L2.
constexpr int64_t kBlockBytes = 256 * 1024;
constexpr int64_t kExpandBlockBytes = 16 * 1024;  // kExpand's transposed Y chunk: in L1
/// kProject's sum block, terms.
constexpr int64_t kSumBlock = 256;

namespace avx512 {
constexpr int64_t kMaxThin = 64;  // 4 vectors of 16 lanes
/// Rows [i0, i1) of C. Each call needs the Args above (thin side ≤ kMaxThin); AVX-512F CPUs only.
void project(const Args& g, int64_t i0, int64_t i1);
void back_project(const Args& g, int64_t i0, int64_t i1);
/// scratch: k · expand_scratch_columns(k) floats, the calling thread's own.
void expand(const Args& g, int64_t i0, int64_t i1, float* scratch);
int64_t expand_scratch_columns(int64_t k);
/// kBackProject's sum block (rows of X) for a thin width n.
int64_t back_project_block(int64_t n);
}  // namespace avx512

namespace avx2 {
constexpr int64_t kMaxThin = 32;  // 4 vectors of 8 lanes (16 registers)
void project(const Args& g, int64_t i0, int64_t i1);
void back_project(const Args& g, int64_t i0, int64_t i1);
void expand(const Args& g, int64_t i0, int64_t i1, float* scratch);
int64_t expand_scratch_columns(int64_t k);
/// kBackProject's sum block (rows of X) for a thin width n.
int64_t back_project_block(int64_t n);
}  // namespace avx2

}  // namespace optcc::thin_gemm_detail

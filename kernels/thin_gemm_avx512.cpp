// The thin-GEMM kernels (thin_gemm_isa.h) for AVX-512F: 16 fp32 lanes, 32 registers. Compiled with
// -mavx512f -mfma (kernels/CMakeLists.txt); called only after thin_gemm.cpp checked the CPU.
// Includes nothing that defines inline code shared with other translation units (see the header).
#include <immintrin.h>

#include <cstdint>

#include "kernels/thin_gemm_isa.h"

namespace optcc::thin_gemm_detail::avx512 {
namespace {

struct V {
  using T = __m512;
  static constexpr int W = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T loadu(const float* p) { return _mm512_loadu_ps(p); }
  using Mask = __mmask16;
  static Mask mask(int n) { return static_cast<Mask>((1u << n) - 1u); }
  static T load_m(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void storeu(float* p, T v) { _mm512_storeu_ps(p, v); }
  static void store_m(float* p, Mask m, T v) { _mm512_mask_storeu_ps(p, m, v); }
  static void stream(float* p, T v) { _mm512_stream_ps(p, v); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  // acc + *p·y with *p broadcast from memory inside the fma (one instruction, no register for it).
  static T fmadd_bcast(const float* p, T y, T acc) {
    asm("vfmadd231ps %[x]%{1to16%}, %[y], %[acc]" : [acc] "+v"(acc) : [y] "v"(y), [x] "m"(*p));
    return acc;
  }
  static void fence() { _mm_sfence(); }
};

// Register tiles (32 zmm): accumulators + the reused operand + one broadcast.
constexpr int kMaxVectors = 4;
// P = M·Q: R rows × nv accumulators (8, 12, 12, 16), nv loads of Q per column of M.
constexpr int project_rows(int nv) { return nv == 1 ? 8 : nv == 2 ? 6 : 4; }
// Q = Mᵀ·P̂: RB rows of P̂ in registers (8, 16, 15, 16) and U·nv accumulator chains (8, 8, 6, 8). At
// most 8 rows of M are read side by side: with a row stride of a multiple of 4 KiB (hidden 3,072 or
// 12,288) they share one L1 set, and 16 of them in its 8 ways halved the speed (measured).
constexpr int back_rows(int nv) { return nv == 1 ? 8 : nv == 2 ? 8 : nv == 3 ? 5 : 4; }
constexpr int back_unroll(int nv) { return nv == 1 ? 8 : nv == 2 ? 4 : 2; }
// M̂ = P̂·Qᵀ: 4 rows × 4 vectors (64 columns) = 16 accumulators.
constexpr int kExpandRows = 4;
constexpr int kExpandVectors = 4;

}  // namespace

#include "kernels/thin_gemm_kernels.inc"

}  // namespace optcc::thin_gemm_detail::avx512

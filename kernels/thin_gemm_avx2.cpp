// The thin-GEMM kernels (thin_gemm_isa.h) for AVX2 + FMA: 8 fp32 lanes, 16 registers. Compiled with
// -mavx2 -mfma (kernels/CMakeLists.txt); called only after thin_gemm.cpp checked the CPU.
// Includes nothing that defines inline code shared with other translation units (see the header).
#include <immintrin.h>

#include <cstdint>

#include "kernels/thin_gemm_isa.h"

namespace optcc::thin_gemm_detail::avx2 {
namespace {

struct V {
  using T = __m256;
  static constexpr int W = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T loadu(const float* p) { return _mm256_loadu_ps(p); }
  using Mask = __m256i;  // lane j is on when its sign bit is set
  static Mask mask(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  static T load_m(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static void storeu(float* p, T v) { _mm256_storeu_ps(p, v); }
  static void store_m(float* p, Mask m, T v) { _mm256_maskstore_ps(p, m, v); }
  static void stream(float* p, T v) { _mm256_stream_ps(p, v); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T fmadd_bcast(const float* p, T y, T acc) { return _mm256_fmadd_ps(_mm256_set1_ps(*p), y, acc); }
  static void fence() { _mm_sfence(); }
};

// Register tiles (16 ymm): accumulators + the reused operand + one broadcast.
constexpr int kMaxVectors = 4;
constexpr int project_rows(int nv) { return nv == 1 ? 8 : nv == 2 ? 4 : nv == 3 ? 3 : 2; }
constexpr int back_rows(int nv) { return nv == 1 ? 8 : nv == 2 ? 4 : 2; }
constexpr int back_unroll(int nv) { return nv == 1 ? 4 : nv == 2 ? 2 : nv == 3 ? 2 : 1; }
constexpr int kExpandRows = 4;
constexpr int kExpandVectors = 2;

}  // namespace

#include "kernels/thin_gemm_kernels.inc"

}  // namespace optcc::thin_gemm_detail::avx2

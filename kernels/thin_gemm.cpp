#include "kernels/thin_gemm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <cstdint>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/thin_gemm_isa.h"

namespace optcc {
namespace {

namespace d = thin_gemm_detail;

enum class Isa { kNone, kAvx2, kAvx512 };

Isa detect_isa() {
#if defined(__x86_64__) && defined(OPTCC_THIN_GEMM_X86)
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the registers (XGETBV).
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kNone;
}

// The CPU's best, capped by OPTCC_THIN_GEMM (thin_gemm.h).
Isa choose_isa() {
  const Isa cpu = detect_isa();
  const char* env = std::getenv("OPTCC_THIN_GEMM");
  if (env == nullptr || *env == '\0') return cpu;
  const std::string v = env;
  Isa cap;
  if (v == "avx512") {
    cap = Isa::kAvx512;
  } else if (v == "avx2") {
    cap = Isa::kAvx2;
  } else if (v == "none") {
    cap = Isa::kNone;
  } else {
    throw std::invalid_argument("environment: OPTCC_THIN_GEMM='" + v +
                                "' is not an instruction set of the thin kernels. Fix: set it to avx512, avx2 "
                                "or none (a cap on what the CPU has), or unset it");
  }
  return static_cast<int>(cap) < static_cast<int>(cpu) ? cap : cpu;
}

Isa isa() {
  static const Isa chosen = choose_isa();
  return chosen;
}

int64_t max_thin(Isa i) {
  return i == Isa::kAvx512 ? d::avx512::kMaxThin : i == Isa::kAvx2 ? d::avx2::kMaxThin : 0;
}

constexpr int64_t kMaxExpandK = 64;

bool unit_cols(const torch::Tensor& t) { return t.size(1) <= 1 || t.stride(1) == 1; }
bool unit_rows(const torch::Tensor& t) { return t.size(0) <= 1 || t.stride(0) == 1; }  // a transposed view

enum class Kind { kGemm, kProject, kBackProject, kExpand };

// The kernel for these operands (shapes already checked), with its Args; kGemm when none fits.
Kind classify(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, float beta, d::Args& g) {
  const Isa i = isa();
  if (i == Isa::kNone) return Kind::kGemm;
  if (!a.is_cpu() || !b.is_cpu() || !out.is_cpu()) return Kind::kGemm;
  if (a.scalar_type() != torch::kFloat || b.scalar_type() != torch::kFloat || out.scalar_type() != torch::kFloat)
    return Kind::kGemm;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || k == 0 || n == 0 || !unit_cols(out) || (m > 1 && out.stride(0) < n)) return Kind::kGemm;
  g.m = m, g.n = n, g.k = k;
  g.c = out.data_ptr<float>(), g.ldc = std::max<int64_t>(out.stride(0), n);
  g.b = b.data_ptr<float>(), g.a = a.data_ptr<float>();
  if (n <= max_thin(i) && beta == 0.0f && unit_cols(b) && (k == 1 || b.stride(0) >= n)) {  // B's rows apart
    g.ldb = std::max<int64_t>(b.stride(0), n);
    if (unit_cols(a) && (m == 1 || a.stride(0) >= k)) {
      g.lda = std::max<int64_t>(a.stride(0), k);
      return Kind::kProject;
    }
    if (unit_rows(a) && (k == 1 || a.stride(1) >= m)) {  // a = x.t(), x [k, m] by rows
      g.lda = std::max<int64_t>(a.stride(1), m);
      return Kind::kBackProject;
    }
  }
  if (k <= kMaxExpandK && unit_cols(a) && (m == 1 || a.stride(0) >= k) && unit_rows(b) &&
      (n == 1 || b.stride(1) >= k)) {  // b = y.t(), y [n, k] by rows
    g.lda = std::max<int64_t>(a.stride(0), k);
    g.ldb = std::max<int64_t>(b.stride(1), k);
    g.beta = beta;
    const auto addr = reinterpret_cast<uintptr_t>(g.c);
    g.stream = beta == 0.0f && addr % 64 == 0 && g.ldc % 16 == 0 && 4 * m * n >= kThinStreamBytes;
    return Kind::kExpand;
  }
  return Kind::kGemm;
}

// Rows per at::parallel_for task: about 64K output elements (project, expand) or M columns
// (back-project) each, so a thread's share is worth its start.
int64_t grain(int64_t per_row) { return std::max<int64_t>(16, (int64_t(1) << 16) / std::max<int64_t>(1, per_row)); }

// The kernels a product of thin width n runs on: the process's ISA, except AVX2's 8-lane kernels
// for project and back-project of n ≤ 8 on an AVX-512 CPU (a 16-lane vector would be half empty).
Isa kernel_isa(Kind kind, int64_t n) {
  const Isa i = isa();
  if (i == Isa::kAvx512 && (kind == Kind::kProject || kind == Kind::kBackProject) && n <= 8) return Isa::kAvx2;
  return i;
}

void run(Kind kind, const d::Args& g) {
  const Isa i = kernel_isa(kind, g.n);
  switch (kind) {
    case Kind::kProject:
      at::parallel_for(0, g.m, grain(g.k), [&](int64_t i0, int64_t i1) {
        i == Isa::kAvx512 ? d::avx512::project(g, i0, i1) : d::avx2::project(g, i0, i1);
      });
      return;
    case Kind::kBackProject:
      at::parallel_for(0, g.m, grain(g.k), [&](int64_t i0, int64_t i1) {
        i == Isa::kAvx512 ? d::avx512::back_project(g, i0, i1) : d::avx2::back_project(g, i0, i1);
      });
      return;
    case Kind::kExpand:
      at::parallel_for(0, g.m, grain(g.n), [&](int64_t i0, int64_t i1) {
        const int64_t cols = i == Isa::kAvx512 ? d::avx512::expand_scratch_columns(g.k)
                                               : d::avx2::expand_scratch_columns(g.k);
        std::vector<float> scratch(static_cast<size_t>(cols * g.k));
        i == Isa::kAvx512 ? d::avx512::expand(g, i0, i1, scratch.data()) : d::avx2::expand(g, i0, i1, scratch.data());
      });
      return;
    case Kind::kGemm:
      return;
  }
}

void check_shapes(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && a.size(1) == b.size(0) &&
                  out.size(0) == a.size(0) && out.size(1) == b.size(1),
              "thin_mm_f32_out: shapes ", a.sizes(), " x ", b.sizes(), " -> ", out.sizes());
}

}  // namespace

std::string thin_gemm_isa() {
  switch (isa()) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kNone: break;
  }
  return "none";
}

std::string thin_gemm_path(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, float beta) {
  check_shapes(out, a, b);
  d::Args g;
  switch (classify(out, a, b, beta, g)) {
    case Kind::kProject: return "project";
    case Kind::kBackProject: return "back-project";
    case Kind::kExpand: return g.stream ? "expand (streaming stores)" : "expand";
    case Kind::kGemm: break;
  }
  return "gemm";
}

int64_t thin_gemm_sum_block(const std::string& path, int64_t thin) {
  const Isa i = isa();
  if (i == Isa::kNone || path == "gemm") return 0;
  if (path == "project") return d::kSumBlock;
  if (path == "back-project") {
    return kernel_isa(Kind::kBackProject, thin) == Isa::kAvx512 ? d::avx512::back_project_block(thin)
                                                                : d::avx2::back_project_block(thin);
  }
  if (path == "expand" || path == "expand (streaming stores)") return std::max<int64_t>(thin, 1);
  throw std::invalid_argument("thin_gemm_sum_block: unknown path '" + path + "'");
}

void thin_mm_f32_out(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, float alpha, float beta) {
  check_shapes(out, a, b);
  d::Args g;
  const Kind kind = classify(out, a, b, beta, g);
  if (kind == Kind::kGemm) return mm_f32_out(out, a, b, alpha, beta);
  g.alpha = alpha;
  torch::NoGradGuard no_grad;
  const int64_t lanes = kernel_isa(kind, g.n) == Isa::kAvx512 ? 16 : 8;
  if (kind == Kind::kBackProject && g.n % lanes != 0) {
    // A thin width that is no whole number of vectors (r = 8 or 24 with AVX-512): Q's rows are
    // closer together than a vector, and masked loads and stores of neighbouring rows, which share
    // vectors' bytes, stall each other (measured: r = 8 three times slower than r = 16). So B and C
    // are padded with zero columns to whole vectors and C's real columns copied out after: the
    // same operations on every real lane, so the same bits.
    const int64_t padded = (g.n + lanes - 1) / lanes * lanes;
    auto bp = torch::zeros({g.k, padded}, out.options());
    bp.narrow(1, 0, g.n).copy_(torch::from_blob(const_cast<float*>(g.b), {g.k, g.n}, {g.ldb, 1}, out.options()));
    auto cp = torch::empty({g.m, padded}, out.options());
    d::Args gp = g;
    gp.b = bp.data_ptr<float>(), gp.ldb = padded, gp.c = cp.data_ptr<float>(), gp.ldc = padded, gp.n = padded;
    run(kind, gp);
    out.copy_(cp.narrow(1, 0, g.n));
    return;
  }
  run(kind, g);
}

}  // namespace optcc

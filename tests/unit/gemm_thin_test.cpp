// kernels/thin_gemm.h: the low-rank compressors' thin products. Each kernel's contract is exact:
// every element is one fp32 sum over the short dimension in ascending order, one fma per term,
// from 0 (then alpha, beta as documented). The tests recompute that sum with std::fma in scalar
// code and require equality bit for bit, on shapes that cross every register tile, tail and cache
// block, with 1 and 2 threads; and they check that the kernels actually run on this CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/gemm.h"
#include "kernels/thin_gemm.h"

namespace optcc {
namespace {

using torch::indexing::Slice;

// The documented sum of every kernel (thin_gemm_sum_block): c[i][j] = the sum over l of
// a[i][l]·b[l][j] in blocks of `block` terms, each from 0 with one std::fma per term, block sums
// added in order; then alpha·sum (alpha ≠ 1), or fma(alpha, sum, beta·old) when beta ≠ 0
// (fma(alpha, sum, old) at beta 1).
torch::Tensor reference(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& old, float alpha,
                        float beta, int64_t block) {
  const auto a2 = a.contiguous(), b2 = b.contiguous();
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  auto c = torch::empty({m, n});
  auto old2 = old.defined() ? old.contiguous() : torch::zeros({m, n});
  const float *pa = a2.data_ptr<float>(), *pb = b2.data_ptr<float>(), *po = old2.data_ptr<float>();
  float* pc = c.data_ptr<float>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int64_t l0 = 0; l0 < k; l0 += block) {
        float part = 0.0f;
        for (int64_t l = l0; l < std::min(k, l0 + block); ++l) part = std::fma(pa[i * k + l], pb[l * n + j], part);
        s = l0 == 0 ? part : s + part;
      }
      float v;
      if (beta == 0.0f) {
        v = alpha == 1.0f ? s : alpha * s;
      } else {
        v = std::fma(alpha, s, beta == 1.0f ? po[i * n + j] : beta * po[i * n + j]);
      }
      pc[i * n + j] = v;
    }
  }
  return c;
}

bool bit_equal(const torch::Tensor& x, const torch::Tensor& y) {
  const auto a = x.contiguous(), b = y.contiguous();
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), 4 * a.numel()) == 0;
}

bool have_kernels() { return thin_gemm_isa() != "none"; }
int64_t max_thin() { return thin_gemm_isa() == "avx512" ? 64 : 32; }

// Runs thin_mm_f32_out on out (a clone of old when beta ≠ 0) and checks path and bits, 1 and 2 threads.
void expect_exact(const torch::Tensor& a, const torch::Tensor& b, const std::string& path, float alpha = 1.0f,
                  float beta = 0.0f) {
  const int64_t m = a.size(0), n = b.size(1);
  const auto old = torch::randn({m, n});
  const int64_t thin = path == "project" || path == "back-project" ? n : a.size(1);
  const int64_t block = thin_gemm_sum_block(path, thin);
  ASSERT_GT(block, 0) << path;
  const auto ref = reference(a, b, beta != 0.0f ? old : torch::Tensor(), alpha, beta, block);
  const int before = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    auto out = beta != 0.0f ? old.clone() : torch::full({m, n}, std::nanf(""));  // beta = 0: out is not read
    if (a.size(1) > 1 && n > 1) {
      EXPECT_EQ(thin_gemm_path(out, a, b, beta), path) << a.sizes() << " x " << b.sizes();
    } else {  // k = 1 or n = 1: a vector fits more than one layout; any kernel will do
      EXPECT_NE(thin_gemm_path(out, a, b, beta), "gemm") << a.sizes() << " x " << b.sizes();
    }
    thin_mm_f32_out(out, a, b, alpha, beta);
    EXPECT_TRUE(bit_equal(out, ref)) << path << " " << a.sizes() << " x " << b.sizes() << ", " << threads
                                     << " threads: max |diff| " << (out - ref).abs().max().item<float>();
  }
  at::set_num_threads(before);
}

TEST(ThinGemm, KernelsRunOnThisCpu) {
  if (const char* c = std::getenv("OPTCC_THIN_GEMM"); c != nullptr && std::string(c) == "bogus") GTEST_SKIP();
  // Every x86-64 CPU this project's results come from has AVX2 (the CI and lab machines: AVX-512).
  // ctest also runs these tests under OPTCC_THIN_GEMM=avx2 (test_gemm_thin_avx2), to cover that path.
  const char* cap = std::getenv("OPTCC_THIN_GEMM");
#if defined(__x86_64__)
  if (cap == nullptr || std::string(cap) != "none") {
    EXPECT_NE(thin_gemm_isa(), "none");
  }
  if (cap != nullptr && std::string(cap) == "avx2") {
    EXPECT_EQ(thin_gemm_isa(), "avx2");
  }
#endif
  if (!have_kernels()) GTEST_SKIP() << "no AVX2/AVX-512: thin_mm_f32_out is mm_f32_out here";
  auto m = torch::randn({64, 100}), q = torch::randn({100, 16}), p = torch::randn({64, 16});
  auto pout = torch::empty({64, 16}), qout = torch::empty({100, 16}), mout = torch::empty({64, 100});
  EXPECT_EQ(thin_gemm_path(pout, m, q), "project");
  EXPECT_EQ(thin_gemm_path(qout, m.t(), p), "back-project");
  EXPECT_EQ(thin_gemm_path(mout, p, q.t()), "expand");
  EXPECT_EQ(thin_gemm_path(mout, p, q.t(), 1.0f), "expand");
}

// ctest runs this one under OPTCC_THIN_GEMM=bogus (test_gemm_thin_bad_cap); elsewhere it skips.
TEST(ThinGemm, MalformedCapNamesTheVariable) {
  const char* cap = std::getenv("OPTCC_THIN_GEMM");
  if (cap == nullptr || std::string(cap) != "bogus") GTEST_SKIP() << "runs under OPTCC_THIN_GEMM=bogus";
  auto out = torch::empty({4, 16});
  try {
    thin_mm_f32_out(out, torch::randn({4, 10}), torch::randn({10, 16}));
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("OPTCC_THIN_GEMM='bogus'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(thin_gemm_isa(), std::invalid_argument);  // every call, not only the first
}

TEST(ThinGemm, ProjectIsTheAscendingFmaSumAtEveryWidth) {
  if (!have_kernels()) GTEST_SKIP();
  torch::manual_seed(11);
  for (int64_t r : {1, 5, 8, 15, 16, 17, 24, 31, 32, 33, 40, 48, 63, 64}) {
    if (r > max_thin()) continue;
    for (int64_t rows : {1, 7, 37}) {
      expect_exact(torch::randn({rows, 301}), torch::randn({301, r}), "project");
    }
  }
  // alpha; row strides wider than the rows (narrowed views)
  expect_exact(torch::randn({19, 40}).index({Slice(), Slice(0, 33)}), torch::randn({33, 24}).index({Slice(), Slice(0, 20)}),
               "project", 0.5f);
  // more rows of B than one cache block holds (256 KiB of B: 4,096 rows at r = 16)
  expect_exact(torch::randn({9, 9000}), torch::randn({9000, 16}), "project");
  // enough rows for at::parallel_for to give each of 2 threads a share (grain 217 rows at k = 301)
  expect_exact(torch::randn({600, 301}), torch::randn({301, 16}), "project");
}

TEST(ThinGemm, BackProjectIsTheAscendingFmaSumAtEveryWidth) {
  if (!have_kernels()) GTEST_SKIP();
  torch::manual_seed(12);
  for (int64_t r : {1, 5, 8, 15, 16, 17, 24, 31, 32, 33, 40, 48, 63, 64}) {
    if (r > max_thin()) continue;
    for (int64_t rows : {1, 3, 35}) {  // rows of M: the sum's length, across the register groups of rows
      const auto m = torch::randn({rows, 203});
      expect_exact(m.t(), torch::randn({rows, r}), "back-project");
    }
  }
  const auto wide = torch::randn({21, 50}).index({Slice(), Slice(0, 45)});  // M with a row stride of 50
  expect_exact(wide.t(), torch::randn({21, 16}), "back-project", -2.0f);
  // more columns of M (rows of Q) than one cache block of Q holds (4,096 at r = 16)
  expect_exact(torch::randn({18, 5000}).t(), torch::randn({18, 16}), "back-project");
}

TEST(ThinGemm, ExpandIsTheAscendingFmaSumWithAlphaAndBeta) {
  if (!have_kernels()) GTEST_SKIP();
  torch::manual_seed(13);
  for (int64_t r : {1, 7, 16, 17, 40, 64}) {
    for (int64_t rows : {1, 6, 33}) {
      for (int64_t cols : {1, 15, 16, 100, 129}) {
        expect_exact(torch::randn({rows, r}), torch::randn({cols, r}).t(), "expand");
      }
    }
  }
  // PowerSGD's error feedback: EF := EF − P̂·Qᵀ (alpha −1, beta 1), and a general alpha, beta
  expect_exact(torch::randn({30, 16}), torch::randn({70, 16}).t(), "expand", -1.0f, 1.0f);
  expect_exact(torch::randn({30, 16}), torch::randn({70, 16}).t(), "expand", 0.25f, -3.0f);
  // more columns than one transposed block of Q holds (4,096 at r = 16), and a strided P̂
  expect_exact(torch::randn({5, 20}).index({Slice(), Slice(0, 16)}), torch::randn({5000, 16}).t(), "expand");
}

TEST(ThinGemm, LargeExpandStreamsAndStaysExact) {
  if (!have_kernels()) GTEST_SKIP();
  torch::manual_seed(14);
  // 1,024 × 8,192 fp32 = 32 MiB: the streaming (non-temporal) store threshold
  const auto p = torch::randn({1024, 16}), q = torch::randn({8192, 16});
  expect_exact(p, q.t(), "expand (streaming stores)");
  // one row short of it: normal stores
  expect_exact(p.index({Slice(0, 1023)}), q.t(), "expand");
  // streaming with a partial last tile: 8,208 columns (a multiple of 16, not of the 64-column tile)
  expect_exact(p, torch::randn({8208, 16}).t(), "expand (streaming stores)");
}

TEST(ThinGemm, OtherOperandsFallBackToTheGemm) {
  torch::manual_seed(15);
  // rows of B that overlap (a broadcast view, row stride 0): mm_f32_out's copy, the same values
  const auto row = torch::randn({1, 16});
  const auto broadcast = row.expand({300, 16});
  const auto m300 = torch::randn({40, 300}), x300 = torch::randn({300, 40});
  auto p40 = torch::empty({40, 16}), q40 = torch::empty({40, 16});
  EXPECT_EQ(thin_gemm_path(p40, m300, broadcast), "gemm");
  EXPECT_EQ(thin_gemm_path(q40, x300.t(), broadcast), "gemm");
  thin_mm_f32_out(p40, m300, broadcast);
  thin_mm_f32_out(q40, x300.t(), broadcast);
  EXPECT_LT((p40 - torch::mm(m300, broadcast.contiguous())).abs().max().item<float>(), 1e-3);
  EXPECT_LT((q40 - torch::mm(x300.t(), broadcast.contiguous())).abs().max().item<float>(), 1e-3);
  const auto a = torch::randn({40, 30}), thin = torch::randn({30, 16});
  auto o16 = torch::empty({40, 16});
  EXPECT_EQ(thin_gemm_path(o16, a, thin, 1.0f), "gemm");  // project needs beta = 0
  const auto strided = torch::randn({30, 32}).index({Slice(), Slice(torch::indexing::None, torch::indexing::None, 2)});
  EXPECT_EQ(thin_gemm_path(o16, a, strided), "gemm");  // B with no unit stride
  EXPECT_EQ(thin_gemm_path(o16, a.to(torch::kDouble), thin.to(torch::kDouble)), "gemm");
  auto wide_out = torch::empty({40, 80});
  EXPECT_EQ(thin_gemm_path(wide_out, a, torch::randn({80, 30}).t()), have_kernels() ? "expand" : "gemm");  // k = 30
  // k = 70 and n = 80: no thin side; the result is mm_f32_out's, bit for bit
  const auto wa = torch::randn({40, 70}), wb = torch::randn({70, 80});
  EXPECT_EQ(thin_gemm_path(wide_out, wa, wb), "gemm");
  auto ref = torch::empty({40, 80});
  thin_mm_f32_out(wide_out, wa, wb, 2.0f);
  mm_f32_out(ref, wa, wb, 2.0f);
  EXPECT_TRUE(bit_equal(wide_out, ref));
  EXPECT_THROW(thin_mm_f32_out(wide_out, wa, a), c10::Error);  // [40, 70] x [40, 30]
}

}  // namespace
}  // namespace optcc

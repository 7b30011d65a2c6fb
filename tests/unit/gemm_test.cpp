// kernels/gemm.h: the oneDNN GEMM path against ATen (F::linear, at::mm) within fp32 round-off,
// forward and both gradients, with and without bias, on 3-D inputs and transposed views; deferred
// weight gradients against the plain backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kernels/gemm.h"

namespace optcc {
namespace {

namespace F = torch::nn::functional;

// Max |a - b| relative to max |b|.
double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-30, b.abs().max().item<double>());
}

void expect_linear_matches_aten(const torch::Tensor& x0, const torch::Tensor& w0, const torch::Tensor& b0) {
  auto run = [&](bool ours) {
    auto x = x0.detach().clone().requires_grad_(true);
    auto w = w0.detach().clone().requires_grad_(true);
    torch::Tensor b = b0.defined() ? b0.detach().clone().requires_grad_(true) : torch::Tensor();
    auto y = ours ? gemm_linear(x, w, b) : F::linear(x, w, b);
    auto g = torch::linspace(-1, 1, y.numel()).view(y.sizes());  // a fixed upstream gradient
    (y * g).sum().backward();
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : torch::zeros({1})};
  };
  const auto ours = run(true), ref = run(false);
  ASSERT_EQ(ours[0].sizes(), ref[0].sizes());
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_LT(rel_diff(ours[i], ref[i]), 1e-5) << "output " << i;
}

TEST(Gemm, LinearMatchesAtenForwardAndBothGradients) {
  torch::manual_seed(7);
  expect_linear_matches_aten(torch::randn({5, 3, 64}), torch::randn({96, 64}), torch::randn({96}));
  expect_linear_matches_aten(torch::randn({17, 32}), torch::randn({8, 32}), torch::Tensor());
  // a transposed (non-contiguous) input and a narrowed weight, as the output layer's x·Eᵀ
  expect_linear_matches_aten(torch::randn({32, 6}).t(), torch::randn({40, 32}).narrow(0, 0, 30), torch::Tensor());
}

// Deferred weight gradients (ZB-H1's W): under a WeightGradDeferral the backward gives the input
// gradient only; run() of what it recorded then gives the weight and bias gradients of the plain
// backward, bit for bit in fp32 (the same GEMMs), into leaves and through a cast (bf16 compute of an
// fp32 parameter: autograd carries the deferred gradient through the cast). Two micro-batches
// accumulate, as W after W does.
TEST(Gemm, DeferredWeightGradientsEqualThePlainBackward) {
  torch::manual_seed(3);
  const auto x0 = torch::randn({2, 5, 24}), w0 = torch::randn({16, 24}), b0 = torch::randn({16});
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto run = [&](bool defer) {
      auto w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
      std::vector<torch::Tensor> dx;
      DeferredWeightGrads store;
      for (int mb = 0; mb < 2; ++mb) {
        auto x = (x0 + mb).to(dtype).requires_grad_(true);
        const torch::Tensor before = w.grad().defined() ? w.grad().clone() : torch::Tensor();
        torch::Tensor y;
        if (defer) {
          WeightGradDeferral on(store);
          y = gemm_linear(x, w.to(dtype), b.to(dtype));
        } else {
          y = gemm_linear(x, w.to(dtype), b.to(dtype));
        }
        y.sum().backward();
        dx.push_back(x.grad().to(torch::kFloat));
        if (!defer) continue;
        EXPECT_EQ(w.grad().defined(), before.defined()) << "B must leave the weight gradient to W";
        if (before.defined()) {
          EXPECT_TRUE(torch::equal(w.grad(), before)) << "B must leave the weight gradient to W";
        }
        EXPECT_GT(store.held_bytes(), 0);
        DeferredWeightGrads::run(store.take());
        EXPECT_EQ(store.held_bytes(), 0);
      }
      return std::vector<torch::Tensor>{dx[0], dx[1], w.grad(), b.grad()};
    };
    const auto plain = run(false), deferred = run(true);
    for (size_t i = 0; i < plain.size(); ++i) {
      ASSERT_TRUE(deferred[i].defined()) << i;
      EXPECT_TRUE(torch::allclose(deferred[i], plain[i], 1e-6, 1e-6)) << "output " << i;
    }
  }
}

TEST(Gemm, MmMatchesAtenWithAlphaBetaAndTransposedViews) {
  torch::manual_seed(3);
  auto a = torch::randn({48, 20}), b = torch::randn({33, 20}).t();  // b: a 'T' view [20, 33]
  auto out = torch::randn({48, 33});
  auto ref = out * 0.5 + 2.0 * torch::mm(a, b);
  mm_f32_out(out, a, b, 2.0f, 0.5f);
  EXPECT_LT(rel_diff(out, ref), 1e-5);
  auto strided = torch::randn({48, 40}).narrow(1, 0, 20);  // neither layout fits after a slice step
  auto c = torch::empty({48, 33});
  mm_f32_out(c, strided.index({torch::indexing::Slice(), torch::indexing::Slice(0, 20)}), b);
  EXPECT_LT(rel_diff(c, torch::mm(strided, b)), 1e-5);
  EXPECT_THROW(mm_f32_out(c, a, a), c10::Error);  // [48, 20] x [48, 20]
  // a transposed a times a thin b (the low-rank Q = Mᵀ·P̂), b in both layouts
  auto m = torch::randn({300, 70}), p = torch::randn({300, 16}), q = torch::empty({70, 16});
  mm_f32_out(q, m.t(), p);
  EXPECT_LT(rel_diff(q, torch::mm(m.t(), p)), 1e-5);
  auto pt = torch::randn({16, 300});
  mm_f32_out(q, m.t(), pt.t(), 0.5f);
  EXPECT_LT(rel_diff(q, 0.5 * torch::mm(m.t(), pt.t())), 1e-5);
}

TEST(Gemm, BatchedMatmulMatchesAtenOnPermutedViews) {
  torch::manual_seed(5);
  // as the attention: q, k from a permuted [s, b, heads, 3, hd] tensor, k transposed
  auto qkv = torch::randn({12, 2, 3, 3, 8}).permute({3, 1, 2, 0, 4});  // [3, b, heads, s, hd]
  auto run = [&](bool ours) {
    auto x = qkv.detach().clone().requires_grad_(true);
    auto q = x[0], k = x[1].transpose(-2, -1), v = x[2];
    auto scores = ours ? gemm_bmm(q, k) : torch::matmul(q, k);  // [b, heads, s, s]
    auto ctx = ours ? gemm_bmm(scores.softmax(-1), v) : torch::matmul(scores.softmax(-1), v);
    (ctx * torch::linspace(-1, 1, ctx.numel()).view(ctx.sizes())).sum().backward();
    return std::vector<torch::Tensor>{scores.detach(), ctx.detach(), x.grad()};
  };
  const auto ours = run(true), ref = run(false);
  for (size_t i = 0; i < ours.size(); ++i) {
    ASSERT_EQ(ours[i].sizes(), ref[i].sizes());
    EXPECT_LT(rel_diff(ours[i], ref[i]), 1e-5) << "output " << i;
  }
}

TEST(Gemm, BatchedMatmulOnStridedMatricesFallsBackAndMatches) {
  torch::manual_seed(6);
  using torch::indexing::Slice;
  using torch::indexing::None;
  // last dimension with stride 2: no unit stride, so not the pointer path; and a batch of 1
  const auto a = torch::randn({2, 3, 5, 8}).index({Slice(), Slice(), Slice(), Slice(None, None, 2)});  // [2, 3, 5, 4]
  const auto b = torch::randn({2, 3, 4, 6});
  EXPECT_LT(rel_diff(gemm_bmm(a, b), torch::matmul(a, b)), 1e-5);
  const auto a1 = torch::randn({1, 7, 3}), b1 = torch::randn({1, 3, 9});
  EXPECT_LT(rel_diff(gemm_bmm(a1, b1), torch::matmul(a1, b1)), 1e-5);
}

TEST(Gemm, LibraryIsNamed) {
  const std::string lib = gemm_library();
  EXPECT_TRUE(lib.rfind("oneDNN ", 0) == 0 || lib.rfind("ATen", 0) == 0) << lib;
  EXPECT_EQ(gemm_uses_onednn(), lib.rfind("oneDNN ", 0) == 0);
}

}  // namespace
}  // namespace optcc

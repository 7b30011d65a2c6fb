// chunked_lm_cross_entropy (models/chunked_loss.h) against the plain cross-entropy on the whole
// batch's logits over the true vocabulary: loss and gradients, fp32 to 1e-6 relative, bf16 to its
// rounding; the padded rows of the weight get exactly zero gradient.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include "models/chunked_loss.h"

namespace optcc {
namespace {

namespace F = torch::nn::functional;

struct Case {
  torch::Tensor h, w, labels;
};

Case make_case(int64_t n, int64_t vocab, int64_t hidden, torch::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  return {torch::randn({n, hidden}, gen).to(dtype).requires_grad_(),
          (torch::randn({vocab, hidden}, gen) * 0.5).to(dtype).requires_grad_(), torch::randint(0, vocab, {n}, gen)};
}

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() /
         b.to(torch::kDouble).abs().max().item<double>();
}

// The plain form: all logits, the first `vocab` columns, fp32 cross-entropy (what GptModel::head_loss
// does below the threshold).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> plain(const Case& c, const torch::Tensor& upstream,
                                                              int64_t vocab) {
  auto h = c.h.detach().clone().requires_grad_(), w = c.w.detach().clone().requires_grad_();
  const auto loss = F::cross_entropy(torch::mm(h, w.t()).narrow(1, 0, vocab).to(torch::kFloat), c.labels);
  (loss * upstream).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

TEST(ChunkedLoss, EqualsThePlainCrossEntropyAndItsGradientsInFp32) {
  // 37 rows (chunks of 8 leave a short last one), a weight of 64 rows for a vocabulary of 50.
  auto c = make_case(37, 64, 16, torch::kFloat);
  c.labels = c.labels.remainder(50);
  const auto upstream = torch::tensor(1.7f);
  for (int64_t vocab : {50, 64}) {
    const auto [loss0, gh0, gw0] = plain(c, upstream, vocab);
    for (int64_t chunk : {1, 8, 37, 100}) {
      auto h = c.h.detach().clone().requires_grad_(), w = c.w.detach().clone().requires_grad_();
      const auto loss = chunked_lm_cross_entropy(h, w, c.labels, vocab, chunk);
      EXPECT_EQ(loss.dim(), 0);
      EXPECT_EQ(loss.scalar_type(), torch::kFloat);
      EXPECT_LE(rel(loss, loss0), 1e-6) << vocab << " " << chunk;
      (loss * upstream).backward();
      EXPECT_LE(rel(h.grad(), gh0), 1e-6) << vocab << " " << chunk;
      EXPECT_LE(rel(w.grad(), gw0), 1e-6) << vocab << " " << chunk;
      if (vocab < 64) {
        EXPECT_EQ(w.grad().narrow(0, vocab, 64 - vocab).abs().max().item<float>(), 0.0f) << chunk;
      }
    }
  }
  EXPECT_EQ(chunked_loss_rows(50304), kChunkedLossBytes / (4 * 50304));
  EXPECT_EQ(chunked_loss_rows(int64_t{1} << 40), 1);
  EXPECT_THROW(chunked_lm_cross_entropy(c.h, c.w, c.labels.narrow(0, 0, 5), 50, 8), c10::Error);
  EXPECT_THROW(chunked_lm_cross_entropy(c.h, c.w, c.labels, 65, 8), c10::Error);  // more columns than rows
}

TEST(ChunkedLoss, Bf16MatchesThePlainFormToItsRounding) {
  const auto c = make_case(64, 96, 32, torch::kBFloat16);
  const auto upstream = torch::tensor(1.0f);
  const auto [loss0, gh0, gw0] = plain(c, upstream, 96);
  auto h = c.h.detach().clone().requires_grad_(), w = c.w.detach().clone().requires_grad_();
  const auto loss = chunked_lm_cross_entropy(h, w, c.labels, 96, 16);
  EXPECT_LE(rel(loss, loss0), 1e-5);  // the same bf16 logits, fp32 from there on
  loss.backward();
  EXPECT_EQ(h.grad().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(w.grad().scalar_type(), torch::kBFloat16);
  EXPECT_LE(rel(h.grad(), gh0), 2e-2);  // bf16 GEMMs of the gradient (8 bits of mantissa)
  EXPECT_LE(rel(w.grad(), gw0), 2e-2);
}

}  // namespace
}  // namespace optcc

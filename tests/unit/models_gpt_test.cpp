// GPT model: shapes, tied embedding, padded vocabulary, causality, init, FLOP count.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "compat/fused_attention.h"
#include "compat/torch_compat.h"
#include "models/gpt.h"
#include "models/presets.h"
#include "models/tensor_parallel.h"

namespace optcc {
namespace {

GptOptions tiny(int64_t vocab = 100, int64_t padded = 128) {
  GptOptions o;
  o.num_layers = 2;
  o.hidden_size = 32;
  o.num_heads = 4;
  o.seq_len = 16;
  o.max_positions = 16;
  o.vocab_size = vocab;
  o.padded_vocab_size = padded;
  o.seed = 5;
  return o;
}

TEST(Gpt, ForwardShapesSequenceFirst) {
  GptModel m(tiny());
  auto tokens = torch::randint(0, 100, {3, 16}, torch::kLong);
  auto logits = m->forward(tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{16, 3, 100}));  // [s, b, V], padded rows excluded
  EXPECT_EQ(logits.scalar_type(), torch::kFloat);
  auto shorter = m->forward(tokens.narrow(1, 0, 5));
  EXPECT_EQ(shorter.sizes(), (std::vector<int64_t>{5, 3, 100}));
}

TEST(Gpt, ParameterShapesAndCount) {
  auto o = tiny();
  GptModel m(o);
  auto params = m->named_parameters();
  EXPECT_EQ(params["embedding.weight"].sizes(), (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(params["position_embedding"].sizes(), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(params["blocks.0.attn.qkv.weight"].sizes(), (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(params["blocks.1.mlp.fc1.weight"].sizes(), (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(params["blocks.1.mlp.fc2.weight"].sizes(), (std::vector<int64_t>{32, 128}));
  // Closed form: embeddings + L * (12h^2 + 13h) + final LN 2h.
  const int64_t h = 32, L = 2;
  EXPECT_EQ(count_parameters(m), 128 * h + 16 * h + L * (12 * h * h + 13 * h) + 2 * h);
  for (const auto& p : params) EXPECT_EQ(p.key().find("lm_head"), std::string::npos) << "untied output layer";
}

TEST(Gpt, TiedEmbeddingGetsOutputGradientAndPaddingNone) {
  GptModel m(tiny());
  // Inputs use tokens 0..4 only; labels too. Rows 5..99 are never looked up as inputs, so any
  // gradient they get comes from the (tied) output layer's softmax. Padded rows 100..127 get none.
  auto samples = torch::randint(0, 5, {2, 17}, torch::kLong);
  m->loss(samples).backward();
  auto g = m->word_embedding().grad();
  ASSERT_TRUE(g.defined());
  EXPECT_GT(g.narrow(0, 5, 95).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(g.narrow(0, 100, 28).abs().sum().item<double>(), 0.0);
}

TEST(Gpt, InitialLossNearLogVocab) {
  GptModel m(tiny(1000, 1024));
  m->eval();
  torch::NoGradGuard ng;
  auto loss = m->loss(torch::randint(0, 1000, {4, 17}, torch::kLong)).item<double>();
  EXPECT_NEAR(loss, std::log(1000.0), 0.1);
}

TEST(Gpt, CausalFutureTokensDoNotChangeEarlierLogits) {
  GptModel m(tiny());
  m->eval();
  torch::NoGradGuard ng;
  auto a = torch::randint(0, 100, {1, 16}, torch::kLong);
  auto b = a.clone();
  b[0][10] = (a[0][10].item<int64_t>() + 1) % 100;
  auto la = m->forward(a), lb = m->forward(b);
  EXPECT_TRUE(torch::equal(la.narrow(0, 0, 10), lb.narrow(0, 0, 10)));
  EXPECT_FALSE(torch::allclose(la.narrow(0, 10, 6), lb.narrow(0, 10, 6)));
}

TEST(Gpt, InitDeterministicAndScaled) {
  GptModel a(tiny()), b(tiny());
  auto o = tiny();
  o.seed = 6;
  GptModel c(o);
  auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  for (const auto& p : pa) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  EXPECT_FALSE(torch::equal(pa["embedding.weight"], pc["embedding.weight"]));
  // Residual output projections use std / sqrt(2L) = 0.02 / 2 = 0.01 (L = 2).
  EXPECT_NEAR(pa["blocks.0.mlp.fc2.weight"].std().item<double>(), 0.01, 0.001);
  EXPECT_NEAR(pa["blocks.0.mlp.fc1.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_EQ(pa["blocks.0.mlp.fc1.bias"].abs().sum().item<double>(), 0.0);
}

TEST(Gpt, NoDecayNames) {
  EXPECT_TRUE(is_no_decay_parameter("blocks.0.attn.qkv.bias"));
  EXPECT_TRUE(is_no_decay_parameter("blocks.0.ln1.weight"));
  EXPECT_TRUE(is_no_decay_parameter("final_ln.weight"));
  EXPECT_FALSE(is_no_decay_parameter("blocks.0.attn.qkv.weight"));
  EXPECT_FALSE(is_no_decay_parameter("embedding.weight"));
}

TEST(Gpt, TrainFlopsClosedForm) {
  // Megatron: 72 B s L h^2 (1 + s/(6h) + V/(12 L h)).
  GptOptions o;
  o.num_layers = 24;
  o.hidden_size = 1024;
  o.seq_len = 1024;
  o.vocab_size = 51200;
  const double B = 512, s = 1024, L = 24, h = 1024, V = 51200;
  const double megatron = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h));
  EXPECT_NEAR(gpt_train_flops(o, 512) / megatron, 1.0, 1e-12);
}

TEST(Presets, PaperSizes) {
  auto* p = find_model_preset("gpt-2.5b");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->num_layers, 52);
  EXPECT_EQ(p->hidden_size, 1920);
  EXPECT_EQ(p->num_heads, 24);
  EXPECT_EQ(find_model_preset("gpt-8.3b")->hidden_size, 3072);
  EXPECT_EQ(find_model_preset("gpt-175b")->seq_len, 2048);
  EXPECT_EQ(find_model_preset("nope"), nullptr);
}

}  // namespace
}  // namespace optcc

// Tensor-parallel GPT vs. the single-rank GPT: same loss, and every gradient shard equals the
// matching slice of the single-rank gradient (fp32 tolerance).
#include "tests/support/gloo_ranks.h"

namespace optcc {
namespace {

class GptTp : public ::testing::TestWithParam<int> {};

TEST_P(GptTp, LossAndGradientShardsMatchSingleRank) {
  const int t = GetParam();
  auto o = tiny(100, 128);
  at::manual_seed(3);
  auto samples = torch::randint(0, 100, {2, 17}, torch::kLong);
  GptModel ref(o);
  auto ref_loss = ref->loss(samples);
  ref_loss.backward();
  auto ref_grads = ref->named_parameters();
  testing::run_ranks(t, [&](const testing::RankContext& ctx) {
    auto tp = ctx.world_group();
    GptModel m(o, tp.get());
    auto loss = m->loss(samples);
    loss.backward();
    EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-5);
    for (const auto& p : m->named_parameters()) {
      auto full = ref_grads[p.key()].grad();
      auto mine = p.value().grad();
      ASSERT_TRUE(mine.defined()) << p.key();
      torch::Tensor expect = full;
      if (!full.sizes().equals(mine.sizes())) {  // sharded: find the dim that differs
        const int64_t dim = full.size(0) != mine.size(0) ? 0 : 1;
        expect = full.narrow(dim, ctx.rank * mine.size(dim), mine.size(dim));
      }
      EXPECT_TRUE(torch::allclose(mine, expect, 1e-4, 1e-6)) << p.key() << " on TP rank " << ctx.rank;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(TpSizes, GptTp, ::testing::Values(2, 4));

// Mixed precision (GptOptions::compute_dtype): the same weights (fp32 masters, same seed) give the
// fp32 loss within bf16 / fp16 rounding; the stage activations are in the compute dtype, the loss
// and logits fp32, and every gradient comes back fp32 and close in direction to fp32's.
class GptPrecision : public ::testing::TestWithParam<c10::ScalarType> {};

TEST_P(GptPrecision, LowPrecisionFollowsFp32WithFp32MastersAndGradients) {
  torch::manual_seed(3);
  auto samples = torch::randint(0, 100, {4, 17}, torch::kLong);
  GptModel ref(tiny());
  auto o = tiny();
  o.compute_dtype = GetParam();
  GptModel low(o);
  auto loss_ref = ref->loss(samples);
  auto loss_low = low->loss(samples);
  EXPECT_EQ(loss_low.scalar_type(), torch::kFloat);
  EXPECT_NEAR(loss_low.item<double>(), loss_ref.item<double>(), 0.01);
  EXPECT_EQ(low->embed(samples.narrow(1, 0, 16)).scalar_type(), GetParam());
  EXPECT_EQ(low->forward(samples.narrow(1, 0, 16)).scalar_type(), torch::kFloat);
  loss_ref.backward();
  loss_low.backward();
  const auto pr = ref->named_parameters(), pl = low->named_parameters();
  for (const auto& p : pl) {
    ASSERT_EQ(p.value().scalar_type(), torch::kFloat) << p.key();
    const auto g = p.value().grad(), gr = pr[p.key()].grad();
    ASSERT_TRUE(g.defined()) << p.key();
    ASSERT_EQ(g.scalar_type(), torch::kFloat) << p.key();
    if (gr.norm().item<double>() < 1e-6) continue;  // e.g. padding rows only
    const double cosine = (g * gr).sum().item<double>() / (g.norm() * gr.norm()).item<double>();
    EXPECT_GT(cosine, 0.98) << p.key();
  }
}

// fp16 joins once it trains (loss scaling; LibTorch 1.13 also lacks CPU fp16 GEMMs).
INSTANTIATE_TEST_SUITE_P(MixedPrecision, GptPrecision, ::testing::Values(torch::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

// CastCache (models/tensor_parallel.h): in bf16, m micro-batches between optimizer steps cast the fp32
// masters once, not m times; AdamW's in-place step makes the next forward cast again (the cast then
// equals the updated master's); and the accumulated fp32 gradients are bit for bit those of a model
// that casts at every use (one fresh model per micro-batch shares nothing, so each casts anew).
TEST(GptCastCache, BfMastersCastOncePerOptimizerStepWithTheSameGradients) {
  torch::manual_seed(4);
  auto o = tiny();
  o.compute_dtype = torch::kBFloat16;
  GptModel cached(o);
  std::vector<torch::Tensor> micro;
  for (int i = 0; i < 3; ++i) micro.push_back(torch::randint(0, 100, {2, 17}, torch::kLong));
  const int64_t before = CastCache::casts_made();
  for (const auto& mb : micro) cached->loss(mb).backward();
  const int64_t per_step = CastCache::casts_made() - before;
  // 2 layers x (qkv, proj, fc1, fc2) x (weight, bias) + the tied output layer's weight: 17 casts,
  // made by the first micro-batch; the other two reuse them
  EXPECT_EQ(per_step, 2 * 4 * 2 + 1);
  // The same gradients as separate casts: three fresh models of the same weights, one micro-batch each.
  std::vector<torch::Tensor> summed;
  for (const auto& mb : micro) {
    GptModel fresh(o);
    fresh->loss(mb).backward();
    const auto ps = fresh->parameters();
    if (summed.empty()) {
      for (const auto& p : ps) summed.push_back(p.grad().clone());
    } else {
      for (size_t i = 0; i < ps.size(); ++i) summed[i].add_(ps[i].grad());
    }
  }
  const auto pc = cached->parameters();
  for (size_t i = 0; i < pc.size(); ++i) EXPECT_TRUE(torch::equal(pc[i].grad(), summed[i])) << "parameter " << i;
  // AdamW's step updates the masters in place: the next forward casts anew, from the new values.
  torch::optim::AdamW opt(cached->parameters(), torch::optim::AdamWOptions(1e-2));
  opt.step();
  const int64_t after_step = CastCache::casts_made();
  auto loss = cached->loss(micro[0]);
  EXPECT_EQ(CastCache::casts_made() - after_step, per_step);
  GptModel reference(o);  // same init; copy the stepped masters in and compare the loss bit for bit
  {
    torch::NoGradGuard no_grad;
    const auto pr = reference->parameters();
    for (size_t i = 0; i < pc.size(); ++i) pr[i].copy_(pc[i]);
  }
  EXPECT_EQ(loss.item<float>(), reference->loss(micro[0]).item<float>());
}

// model.attention: which kernel a forward pass uses (models/gpt.h AttentionKernel).
TEST(GptAttention, AutoPicksFusedOnlyOnAGpuWithoutDropout) {
  using K = AttentionKernel;
  const K fused_if_built = kHasFusedAttention ? K::kFused : K::kExplicit;
  EXPECT_EQ(attention_kernel_used(K::kAuto, /*on_gpu=*/true, 0.0, /*training=*/true), fused_if_built);
  EXPECT_EQ(attention_kernel_used(K::kAuto, true, 0.1, false), fused_if_built);  // evaluation draws no dropout
  EXPECT_EQ(attention_kernel_used(K::kAuto, true, 0.1, true), K::kExplicit);
  EXPECT_EQ(attention_kernel_used(K::kAuto, false, 0.0, true), K::kExplicit);   // CPU ranks keep oneDNN's GEMMs
  EXPECT_EQ(attention_kernel_used(K::kExplicit, true, 0.0, true), K::kExplicit);
  EXPECT_EQ(attention_kernel_used(K::kFused, false, 0.0, true), K::kFused);
  for (const auto& name : attention_kernel_names()) EXPECT_EQ(attention_kernel_name(attention_kernel(name)), name);
  EXPECT_THROW(attention_kernel("flash"), std::invalid_argument);
  auto o = tiny();
  o.attention = K::kFused;
  o.attention_dropout = 0.1;
  EXPECT_THROW(GptModel{o}, c10::Error);  // fused draws no dropout: refused, not ignored
}

// The fused kernel computes what the explicit one does: same loss and gradients (fp32), on the CPU
// and, where there is one, on the GPU (also in bf16, within its rounding).
void expect_fused_matches_explicit(const torch::Device& device, c10::ScalarType dtype, double loss_tol, double min_cosine) {
  torch::manual_seed(11);
  auto samples = torch::randint(0, 100, {3, 17}, torch::kLong).to(device);
  auto make = [&](AttentionKernel k) {
    auto o = tiny();
    o.attention = k;
    o.compute_dtype = dtype;
    GptModel m(o);
    m->to(device);
    return m;
  };
  GptModel ex = make(AttentionKernel::kExplicit), fu = make(AttentionKernel::kFused);
  const auto loss_ex = ex->loss(samples), loss_fu = fu->loss(samples);
  EXPECT_NEAR(loss_fu.item<double>(), loss_ex.item<double>(), loss_tol);
  loss_ex.backward();
  loss_fu.backward();
  const auto pe = ex->named_parameters(), pf = fu->named_parameters();
  for (const auto& p : pf) {
    const auto g = p.value().grad().to(torch::kDouble), ge = pe[p.key()].grad().to(torch::kDouble);
    if (ge.norm().item<double>() < 1e-6) continue;  // padding rows
    const double cosine = (g * ge).sum().item<double>() / (g.norm() * ge.norm()).item<double>();
    EXPECT_GT(cosine, min_cosine) << p.key();
    EXPECT_NEAR(g.norm().item<double>(), ge.norm().item<double>(), (1 - min_cosine) * 10 * ge.norm().item<double>()) << p.key();
  }
}

TEST(GptAttention, FusedMatchesExplicitOnCpu) {
  if (!kHasFusedAttention) GTEST_SKIP() << "needs LibTorch >= 2.0 (at::scaled_dot_product_attention); this is " << build_description();
  expect_fused_matches_explicit(torch::kCPU, torch::kFloat, 1e-5, 1 - 1e-6);
}

TEST(GptAttention, FusedMatchesExplicitOnGpu) {
  if (!kHasFusedAttention || !torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a GPU and LibTorch >= 2.0; this is " << build_description();
  }
  expect_fused_matches_explicit(torch::Device(torch::kCUDA, 0), torch::kFloat, 1e-4, 1 - 1e-5);
  expect_fused_matches_explicit(torch::Device(torch::kCUDA, 0), torch::kBFloat16, 0.02, 0.98);
}

}  // namespace
}  // namespace optcc

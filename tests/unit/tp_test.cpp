// Tensor parallelism on Gloo with ranks as threads: the four mappings in closed form, and every
// sharded layer against its unsharded equivalent built from the same (seed, tag) — outputs, input
// gradients and the weight-gradient shards — for t in {1, 2, 4}.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "models/gpt.h"
#include "models/tensor_parallel.h"
#include "tests/support/gloo_ranks.h"

namespace optcc {
namespace {

namespace F = torch::nn::functional;
using testing::RankContext;
using testing::run_ranks;

void expect_close(const torch::Tensor& got, const torch::Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_LT((got - want).abs().max().item<double>(), tol) << what;
}

// Rank r's block r of `n` along `dim`, for a group of t.
torch::Tensor shard(const torch::Tensor& full, int64_t dim, int r, int t) {
  const int64_t n = full.size(dim) / t;
  return full.narrow(dim, r * n, n);
}

torch::Tensor randn(torch::IntArrayRef sizes, uint64_t seed) { return init_full_normal(sizes, 1.0, seed, 0); }

class Tp : public ::testing::TestWithParam<int> {};

TEST(TpMappings, FreeWithoutGroup) {
  auto x = torch::ones({2, 4}, torch::requires_grad());
  EXPECT_TRUE(copy_to_tp_region(x, nullptr).is_same(x));
  EXPECT_TRUE(reduce_from_tp_region(x, nullptr).is_same(x));
  EXPECT_TRUE(scatter_to_tp_region(x, nullptr).is_same(x));
  EXPECT_TRUE(gather_from_tp_region(x, nullptr).is_same(x));
}

// The shared init helper draws what the single-rank GPT draws for the same (seed, tag), so a TP
// model built from it starts from the same weights (word embedding: tag 1; block 1's fc1: 100 + 8 + 2).
TEST(TpInit, FullWeightsMatchGptModel) {
  GptOptions o;
  o.num_layers = 2, o.hidden_size = 16, o.num_heads = 2, o.seq_len = 8, o.max_positions = 8;
  o.vocab_size = 100, o.padded_vocab_size = 128, o.seed = 42;
  GptModel m(o);
  EXPECT_TRUE(torch::equal(m->word_embedding(), init_full_normal({128, 16}, o.init_std, o.seed, 1)));
  auto fc1 = m->blocks[1]->as<BlockImpl>()->mlp->fc1->weight;
  EXPECT_TRUE(torch::equal(fc1, init_full_normal({64, 16}, o.init_std, o.seed, 110)));
}

TEST_P(Tp, CopyToIdentityForwardSumsGradients) {
  const int t = GetParam();
  run_ranks(t, [&](const RankContext& ctx) {
    TrafficMeter meter;
    auto tp = ctx.world_group(&meter);
    auto x = torch::arange(6, torch::kFloat).view({2, 3}).requires_grad_();
    auto y = copy_to_tp_region(x, tp.get());
    EXPECT_TRUE(torch::equal(y, x));
    y.backward(torch::full({2, 3}, float(ctx.rank + 1)));  // rank-specific grads are summed
    EXPECT_TRUE(torch::equal(x.grad(), torch::full({2, 3}, t * (t + 1) / 2.0f)));
    x.mutable_grad() = torch::Tensor();
    copy_to_tp_region(x, tp.get()).backward(torch::full({2, 3}, 3.0f));  // same grad everywhere: t x
    EXPECT_TRUE(torch::equal(x.grad(), torch::full({2, 3}, 3.0f * t)));
    EXPECT_EQ(meter.at(Traffic::kTensorParallel, Link::kIntraNode).calls, t > 1 ? 2 : 0);
  });
}

TEST_P(Tp, ReduceFromSumsForwardPassesGradient) {
  const int t = GetParam();
  run_ranks(t, [&](const RankContext& ctx) {
    auto tp = ctx.world_group();
    auto x = torch::full({2, 3}, float(ctx.rank + 1), torch::requires_grad());
    auto y = reduce_from_tp_region(x, tp.get());
    EXPECT_TRUE(torch::equal(y, torch::full({2, 3}, t * (t + 1) / 2.0f)));
    EXPECT_TRUE(torch::equal(x, torch::full({2, 3}, float(ctx.rank + 1))));  // input untouched
    auto g = torch::arange(6, torch::kFloat).view({2, 3});
    y.backward(g);
    EXPECT_TRUE(torch::equal(x.grad(), g));
  });
}

TEST_P(Tp, ScatterAndGatherAreConjugate) {
  const int t = GetParam();
  run_ranks(t, [&](const RankContext& ctx) {
    auto tp = ctx.world_group();
    const int r = ctx.rank;
    // scatter: own block forward; backward gathers every rank's (r + 1) block.
    auto x = torch::arange(2 * 4 * t, torch::kFloat).view({2, 4 * t}).requires_grad_();
    auto y = scatter_to_tp_region(x, tp.get());
    EXPECT_TRUE(torch::equal(y, shard(x, 1, r, t)));
    y.backward(torch::full({2, 4}, float(r + 1)));
    for (int j = 0; j < t; ++j) EXPECT_TRUE(torch::equal(shard(x.grad(), 1, j, t), torch::full({2, 4}, float(j + 1))));
    // gather: rank j's block j forward; backward keeps own block of the gradient.
    auto z = torch::full({2, 3}, float(r), torch::requires_grad());
    auto g = gather_from_tp_region(z, tp.get());
    ASSERT_EQ(g.sizes(), (std::vector<int64_t>{2, 3 * t}));
    for (int j = 0; j < t; ++j) EXPECT_TRUE(torch::equal(shard(g, 1, j, t), torch::full({2, 3}, float(j))));
    auto dg = torch::arange(2 * 3 * t, torch::kFloat).view({2, 3 * t});
    g.backward(dg);
    EXPECT_TRUE(torch::equal(z.grad(), shard(dg, 1, r, t)));
    // round trip on a 3-D tensor: gather(scatter(x)) == x, gradient passes through.
    auto w = torch::arange(3 * 2 * 2 * t, torch::kFloat).view({3, 2, 2 * t}).requires_grad_();
    auto back = gather_from_tp_region(scatter_to_tp_region(w, tp.get()), tp.get());
    EXPECT_TRUE(torch::equal(back, w));
    back.backward(w.detach() * 2);
    EXPECT_TRUE(torch::equal(w.grad(), w.detach() * 2));
  });
}

// Unsharded reference: y = linear(x, W, b), loss = sum(y * G); values and gradients.
struct LinearRef {
  torch::Tensor x, w, b, g, y, dx, dw, db;
  LinearRef(int64_t in, int64_t out, uint64_t tag) {
    x = randn({3, 5, in}, 1).requires_grad_();
    w = init_full_normal({out, in}, 0.5, 7, tag).requires_grad_();
    b = randn({out}, 2).requires_grad_();
    g = randn({3, 5, out}, 3);
    y = F::linear(x, w, b);
    (y * g).sum().backward();
    y = y.detach(), dx = x.grad(), dw = w.grad(), db = b.grad();
  }
};

TEST_P(Tp, ColumnParallelLinearMatchesUnsharded) {
  const int t = GetParam();
  const LinearRef ref(8, 12, 11);
  run_ranks(t, [&](const RankContext& ctx) {
    auto tp = ctx.world_group();
    const int r = ctx.rank;
    ColumnParallelLinear layer(8, 12, tp.get(), /*gather_output=*/true, 0.5, 7, 11);
    EXPECT_TRUE(torch::equal(layer->weight, shard(ref.w.detach(), 0, r, t)));  // init = full-weight rows
    {
      torch::NoGradGuard no_grad;
      layer->bias.copy_(shard(ref.b.detach(), 0, r, t));
    }
    auto x = ref.x.detach().clone().requires_grad_();
    auto y = layer->forward(x);
    expect_close(y, ref.y, 1e-6, "y");
    (y * ref.g).sum().backward();
    expect_close(x.grad(), ref.dx, 1e-5, "dx");
    expect_close(layer->weight.grad(), shard(ref.dw, 0, r, t), 1e-5, "dW rows");
    expect_close(layer->bias.grad(), shard(ref.db, 0, r, t), 1e-5, "db");
    if (t > 1) {  // out not divisible by t: a named error at construction
      EXPECT_THROW(ColumnParallelLinear(8, 4 * t + 1, tp.get(), true, 0.5, 7, 11), c10::Error);
    }
  });
}

TEST_P(Tp, RowParallelLinearMatchesUnsharded) {
  const int t = GetParam();
  const LinearRef ref(12, 8, 12);
  run_ranks(t, [&](const RankContext& ctx) {
    auto tp = ctx.world_group();
    const int r = ctx.rank;
    RowParallelLinear layer(12, 8, tp.get(), /*input_is_parallel=*/false, 0.5, 7, 12);
    EXPECT_TRUE(torch::equal(layer->weight, shard(ref.w.detach(), 1, r, t)));  // init = full-weight columns
    {
      torch::NoGradGuard no_grad;
      layer->bias.copy_(ref.b.detach());  // non-zero: must be added once, not t times
    }
    auto x = ref.x.detach().clone().requires_grad_();
    auto y = layer->forward(x);
    expect_close(y, ref.y, 1e-6, "y");
    (y * ref.g).sum().backward();
    expect_close(x.grad(), ref.dx, 1e-5, "dx");
    expect_close(layer->weight.grad(), shard(ref.dw, 1, r, t), 1e-5, "dW columns");
    expect_close(layer->bias.grad(), ref.db, 1e-5, "db");
  });
}

TEST_P(Tp, ColumnThenRowMlpMatchesUnsharded) {
  const int t = GetParam();
  auto x0 = randn({4, 2, 8}, 4);
  auto w1 = init_full_normal({16, 8}, 0.5, 9, 1).requires_grad_();
  auto w2 = init_full_normal({8, 16}, 0.5, 9, 2).requires_grad_();
  auto g = randn({4, 2, 8}, 5);
  auto xr = x0.clone().requires_grad_();
  auto yr = F::linear(F::gelu(F::linear(xr, w1)), w2);
  (yr * g).sum().backward();
  run_ranks(t, [&](const RankContext& ctx) {
    auto tp = ctx.world_group();
    const int r = ctx.rank;
    ColumnParallelLinear fc1(8, 16, tp.get(), /*gather_output=*/false, 0.5, 9, 1);
    RowParallelLinear fc2(16, 8, tp.get(), /*input_is_parallel=*/true, 0.5, 9, 2);
    auto x = x0.clone().requires_grad_();
    auto h = fc1->forward(x);
    EXPECT_EQ(h.size(-1), 16 / t);
    auto y = fc2->forward(F::gelu(h));
    // y sums the ranks' partial products (all-reduce) where the unsharded GEMM sums over all 16 at once:
    // a different fp32 order. LibTorch 1.13 stays under 1e-6; 2.6's GEMM kernels give 1.07e-6 at TP 2.
    expect_close(y, yr.detach(), 2e-6, "y");
    (y * g).sum().backward();
    expect_close(x.grad(), xr.grad(), 1e-5, "dx");
    expect_close(fc1->weight.grad(), shard(w1.grad(), 0, r, t), 1e-5, "dW1 rows");
    expect_close(fc2->weight.grad(), shard(w2.grad(), 1, r, t), 1e-5, "dW2 columns");
  });
}

TEST_P(Tp, VocabParallelEmbeddingMatchesUnsharded) {
  const int t = GetParam();
  const int64_t vp = 128, h = 6;
  auto tokens = torch::tensor({0, 1, 31, 32, 63, 64, 95, 96, 127, 5, 40, 100, 5, 77, 0, 127}, torch::kLong).view({4, 4});
  auto w = init_full_normal({vp, h}, 0.5, 3, 1).requires_grad_();
  auto g = randn({4, 4, h}, 6);
  auto yr = F::embedding(tokens, w);
  (yr * g).sum().backward();
  run_ranks(t, [&](const RankContext& ctx) {
    auto tp = ctx.world_group();
    const int r = ctx.rank;
    VocabParallelEmbedding emb(vp, h, tp.get(), 0.5, 3, 1);
    EXPECT_EQ(emb->vocab_start(), r * vp / t);
    EXPECT_EQ(emb->vocab_end(), (r + 1) * vp / t);
    auto y = emb->forward(tokens);
    // y sums the ranks' partial products (all-reduce) where the unsharded GEMM sums over all 16 at once:
    // a different fp32 order. LibTorch 1.13 stays under 1e-6; 2.6's GEMM kernels give 1.07e-6 at TP 2.
    expect_close(y, yr.detach(), 2e-6, "y");
    (y * g).sum().backward();
    expect_close(emb->weight.grad(), shard(w.grad(), 0, r, t), 1e-5, "dW rows");
  });
}

// Cross-entropy over the true vocabulary V of padded logits [4, 6, 128]; the padded columns hold
// 1e4 and must be ignored. V = 60 leaves whole shards of padding at t = 4.
TEST_P(Tp, VocabParallelCrossEntropyIgnoresPaddingAndMatchesTorch) {
  const int t = GetParam();
  const int64_t vp = 128;
  for (int64_t v : {100, 60}) {
    SCOPED_TRACE("true vocab " + std::to_string(v));
    auto logits = randn({4, 6, vp}, 7) * 3;
    logits.narrow(-1, v, vp - v).fill_(1e4);
    // Every shard's true range is hit, including its first and last column.
    auto labels = torch::tensor({0, 31, 32, 59, 1, 30, 33, 45, 2, 3, 50, 58, 10, 20, 31, 32, 0, 59, 7, 8, 9, 40, 41, 42},
                                torch::kLong);
    if (v == 100) labels.index_put_({torch::tensor({4, 5, 6, 7, 8})}, torch::tensor({63, 64, 95, 96, 99}));
    labels = labels.view({4, 6});
    auto w = randn({4, 6}, 8).abs();
    auto lr = logits.clone().requires_grad_();
    auto loss_ref = F::cross_entropy(lr.narrow(-1, 0, v).reshape({-1, v}), labels.reshape({-1}),
                                     F::CrossEntropyFuncOptions().reduction(torch::kNone))
                        .view({4, 6});
    (loss_ref * w).sum().backward();
    run_ranks(t, [&](const RankContext& ctx) {
      auto tp = ctx.world_group();
      auto local = shard(logits, -1, ctx.rank, t).clone().requires_grad_();
      auto loss = vocab_parallel_cross_entropy(local, labels, ctx.rank * vp / t, v, tp.get());
      expect_close(loss, loss_ref.detach(), 1e-5, "loss");
      (loss * w).sum().backward();
      expect_close(local.grad(), shard(lr.grad(), -1, ctx.rank, t), 1e-5, "dlogits");
    });
  }
}

// Embedding -> tied output layer -> cross-entropy: the shard's gradient sums both uses.
TEST_P(Tp, TiedEmbeddingLogitsAndLossMatchUnsharded) {
  const int t = GetParam();
  const int64_t v = 100, vp = 128, h = 8;
  auto tokens = torch::tensor({3, 40, 99, 64, 0, 97, 33, 70, 12, 96}, torch::kLong).view({5, 2});
  auto labels = torch::tensor({40, 99, 64, 0, 97, 33, 70, 12, 96, 31}, torch::kLong).view({5, 2});
  auto w = init_full_normal({vp, h}, 0.5, 4, 1).requires_grad_();
  auto loss_ref = F::cross_entropy(F::linear(F::embedding(tokens, w), w).narrow(-1, 0, v).reshape({-1, v}),
                                   labels.reshape({-1}));
  loss_ref.backward();
  run_ranks(t, [&](const RankContext& ctx) {
    auto tp = ctx.world_group();
    VocabParallelEmbedding emb(vp, h, tp.get(), 0.5, 4, 1);
    auto logits = parallel_lm_logits(emb->forward(tokens), emb->weight, tp.get());
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{5, 2, vp / t}));
    auto loss = vocab_parallel_cross_entropy(logits, labels, emb->vocab_start(), v, tp.get()).mean();
    expect_close(loss, loss_ref.detach(), 1e-5, "loss");
    loss.backward();
    expect_close(emb->weight.grad(), shard(w.grad(), 0, ctx.rank, t), 1e-5, "dW rows");
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Tp, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace optcc

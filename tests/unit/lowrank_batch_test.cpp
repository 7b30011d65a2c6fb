// The batched low-rank path (lowrank_batch.h) on CPU tensors: the orthonormalisation's contract,
// the device-side normal draws, the ATen-operation count of one batched encode (must not grow with
// the rank r or the batch B), and PowerSGD's batched path against its per-matrix one.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include "compression/codecs.h"
#include "compression/lowrank_batch.h"
#include "compression/orthogonalize.h"
#include "compression/powersgd.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/op_counter.h"
#include "tests/support/reducer_support.h"

namespace optcc {
namespace {

using testing::RankContext;
using testing::run_ranks;
using testing::seeded_randn;

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

// Every column of every matrix of q [B, n, k] unit or exactly zero, the unit ones orthogonal.
void expect_orthonormal_or_zero(const torch::Tensor& q, double tol) {
  for (int64_t b = 0; b < q.size(0); ++b) {
    const auto m = q[b];
    const auto gram = m.t().mm(m);  // [k, k]
    for (int64_t j = 0; j < q.size(2); ++j) {
      const double d = gram[j][j].item<double>();
      if (max_abs(m.select(1, j)) == 0) continue;
      EXPECT_NEAR(d, 1.0, tol) << "matrix " << b << " column " << j;
    }
    EXPECT_LE(max_abs(gram - torch::diag(gram.diagonal())), tol) << "matrix " << b;
  }
}

TEST(OrthogonalizeBatched, SpansWhatPerMatrixQrSpansWithPositiveDiagonal) {
  auto m = seeded_randn({5, 200, 16}, 1);
  auto q = m.clone();
  orthogonalize_batched_(q);
  expect_orthonormal_or_zero(q, 1e-5);
  for (int64_t b = 0; b < 5; ++b) {
    auto one = m[b].clone();
    orthogonalize_qr_(one);
    // The same projector (the span of the columns), whatever the columns' signs.
    EXPECT_LE(max_abs(q[b].mm(q[b].t()) - one.mm(one.t())), 1e-5) << b;
    // R = QᵀM upper triangular with a positive diagonal (the unique QR of a full-rank matrix).
    const auto r = q[b].t().mm(m[b]);
    EXPECT_GT(r.diagonal().min().item<double>(), 0) << b;
    EXPECT_LE(max_abs(torch::tril(r, -1)), 1e-4 * max_abs(r)) << b;
  }
  auto again = q.clone();  // an orthonormal input comes back as itself
  orthogonalize_batched_(again);
  EXPECT_LE(max_abs(again - q), 1e-5);
}

TEST(OrthogonalizeBatched, ZeroAndDependentColumnsComeOutZeroAndNanStaysNan) {
  auto m = seeded_randn({4, 64, 8}, 2);
  m[0].select(1, 3).zero_();                                     // a zero column
  m[1].select(1, 5).copy_(m[1].select(1, 0) * 2 - m[1].select(1, 1));  // dependent on earlier ones
  m[2].zero_();                                                  // a zero matrix
  m[3][7][2] = std::nanf("");                                    // a NaN
  auto q = m.clone();
  orthogonalize_batched_(q);
  EXPECT_EQ(max_abs(q[0].select(1, 3)), 0.0);
  EXPECT_EQ(max_abs(q[1].select(1, 5)), 0.0);
  EXPECT_EQ(max_abs(q[2]), 0.0);
  EXPECT_TRUE(torch::isnan(q[3]).any().item<bool>());
  expect_orthonormal_or_zero(q.narrow(0, 0, 3), 1e-5);
  // The contract the compressors rely on: ‖A − QQᵀA‖ ≤ ‖A‖ for any A.
  for (int64_t b = 0; b < 3; ++b) {
    const auto a = seeded_randn({64, 30}, 10 + b);
    EXPECT_LE((a - q[b].mm(q[b].t().mm(a))).norm().item<double>(), a.norm().item<double>() * (1 + 1e-6)) << b;
  }
}

TEST(CounterNormal, DeterministicPerCallMeanZeroVarianceOneAndResumable) {
  CounterNormal a(714), b(714), c(715);
  const auto opt = torch::TensorOptions().dtype(torch::kFloat);
  const auto a0 = a.draw({1 << 16}, opt), b0 = b.draw({1 << 16}, opt), c0 = c.draw({1 << 16}, opt);
  EXPECT_TRUE(torch::equal(a0, b0));  // same (seed, counter): same draws
  EXPECT_FALSE(torch::equal(a0, c0));
  EXPECT_EQ(a.counter(), 1u);
  EXPECT_TRUE(torch::isfinite(a0).all().item<bool>());
  // 65,536 draws: the mean's standard error is 0.0039, the variance's 0.0055.
  EXPECT_LT(std::abs(a0.mean().item<double>()), 0.02);
  EXPECT_LT(std::abs(a0.var().item<double>() - 1.0), 0.03);
  EXPECT_LT(std::abs((a0 > 0).to(torch::kFloat).mean().item<double>() - 0.5), 0.01);
  const auto a1 = a.draw({8, 4}, opt);  // the next call: other draws
  EXPECT_FALSE(torch::equal(a1.view({-1}), a0.narrow(0, 0, 32)));
  std::stringstream blob;
  {
    torch::serialize::OutputArchive out;
    a.save(out, "g");
    out.save_to(blob);
  }
  CounterNormal d(1);
  torch::serialize::InputArchive in;
  in.load_from(blob);
  ASSERT_TRUE(d.load(in, "g"));
  EXPECT_EQ(d.seed(), 714u);
  EXPECT_TRUE(torch::equal(a.draw({100}, opt), d.draw({100}, opt)));
  EXPECT_FALSE(d.load(in, "absent"));
}

TEST(PrepareQBatched, RefillsZeroColumnsAndKeepsTheOthers) {
  auto q = seeded_randn({3, 40, 6}, 3);
  q[1].select(1, 2).zero_();
  q[2].zero_();
  CounterNormal gen(5);
  auto kept = q[0].clone();
  orthogonalize_qr_(kept);
  prepare_q_batched_(q, gen);
  expect_orthonormal_or_zero(q, 1e-5);
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t j = 0; j < 6; ++j) EXPECT_GT(max_abs(q[b].select(1, j)), 0) << b << " " << j;
  }
  EXPECT_LE(max_abs(q[0].mm(q[0].t()) - kept.mm(kept.t())), 1e-5);  // untouched matrices keep their span
}

// The kernel-count invariant: one batched encode (Q's upkeep, P = MQ, P̂, Q = MᵀP̂) issues the same
// number of computing ATen operations (op_counter.h: leaf ops that are not views or allocations)
// for every rank r and batch size B. (All dispatcher calls grow with B on CPU only through the views
// linalg_qr takes of each matrix for LAPACK; those launch nothing.)
TEST(LowRankBatch, EncodeOpCountGrowsNeitherWithRankNorWithBatch) {
  std::map<std::pair<int64_t, int64_t>, testing::OpCount> counts;
  for (int64_t r : {4, 16, 64}) {
    for (int64_t b : {1, 8, 32}) {
      const auto m = seeded_randn({b, 96, 128}, 7);
      auto q = seeded_randn({b, 128, r}, 8);
      auto p = torch::empty({b, 96, r});
      CounterNormal gen(9);
      counts[{r, b}] = testing::count_aten_ops([&] {
        prepare_q_batched_(q, gen);
        lowrank_encode_p(m, q, p);
        lowrank_encode_q(m, p, q);
      });
    }
  }
  const auto& first = counts.begin()->second;
  EXPECT_GT(first.kernels, 10);  // the callback saw the operations at all
  EXPECT_EQ(first.kernels_by_name.at("aten::bmm"), 2);
  for (const auto& [key, n] : counts) {
    EXPECT_EQ(n.kernels, first.kernels) << "r " << key.first << ", B " << key.second;
    EXPECT_EQ(n.kernels_by_name, first.kernels_by_name) << "r " << key.first << ", B " << key.second;
    std::cout << "batched encode, r " << key.first << ", B " << key.second << ": " << n.kernels
              << " computing ATen ops (" << n.all << " dispatcher calls)\n";
  }
  // The per-matrix tensor-operation MGS (what non-CPU tensors had before) grows with r: the proxy sees it.
  auto m4 = seeded_randn({128, 4}, 1), m16 = seeded_randn({128, 16}, 1);
  const auto mgs4 = testing::count_aten_ops([&] { orthogonalize_mgs_tensor_ops_(m4); }).kernels;
  const auto mgs16 = testing::count_aten_ops([&] { orthogonalize_mgs_tensor_ops_(m16); }).kernels;
  EXPECT_GT(mgs16, 3 * mgs4);
}

// PowerSGD's batched path (what CUDA tensors take) against its per-matrix path on CPU, from the same
// warm-start Q, on 2 ranks: the same gradients and residuals to fp32 rounding, every rank alike.
TEST(PowerSgdBatched, MatchesThePerMatrixPathFromTheSameQ) {
  for (std::string ef : {"averaged", "local"}) {
    run_ranks(2, [&](const RankContext& ctx) {
      auto comm = ctx.world_group();
      PowerSgdOptions o;
      o.rank = 4;
      o.ef_residual = ef;
      o.orthogonalize = "qr";
      PowerSgdReducer per(o), bat(o);
      bat.use_batched_on_cpu(true);
      for (int64_t step = 0; step < 4; ++step) {
        // Two tensors of one shape (one group of B = 2), one of another, and raw ones.
        std::vector<torch::Tensor> g{seeded_randn({32, 16}, 100 * ctx.rank + step), seeded_randn({16}, 7 + step),
                                     seeded_randn({32, 16}, 200 + 100 * ctx.rank + step),
                                     seeded_randn({64, 48}, 300 + 100 * ctx.rank + step)};
        if (step == 0) {
          for (size_t i : {0, 2, 3}) {
            const auto q0 = seeded_randn({g[i].size(1), 4}, 50 + i);
            per.set_q(i, q0);
            bat.set_q(i, q0);
          }
        }
        auto gp = testing::clone_all(g), gb = testing::clone_all(g);
        per.reduce(gp, *comm, step);
        bat.reduce(gb, *comm, step);
        for (size_t i = 0; i < g.size(); ++i) {
          EXPECT_LE(max_abs(gp[i] - gb[i]), 2e-4 * max_abs(gp[i])) << ef << " step " << step << " tensor " << i;
          if (i != 1) {
            EXPECT_LE(max_abs(per.error(i) - bat.error(i)), 2e-4 * max_abs(per.error(i))) << ef << " " << i;
          }
        }
        testing::expect_identical_on_all_ranks(*comm, gb);
        EXPECT_EQ(bat.error_feedback_bytes(), per.error_feedback_bytes());
      }
    });
  }
}

// Zero and rank-deficient gradients on the batched path: ‖M − out‖ ≤ ‖M‖ each step, and the warm
// start recovers (zero columns of Q refilled from the device draws); save/load continues bit for bit.
TEST(PowerSgdBatched, RecoversAfterZeroGradientsAndResumesBitIdentically) {
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    PowerSgdOptions o;
    o.rank = 4;
    PowerSgdReducer a(o);
    a.use_batched_on_cpu(true);
    const auto low = seeded_randn({60, 3}, 1).mm(seeded_randn({3, 40}, 2));  // rank 3, the same on both ranks
    for (int64_t step = 0; step < 3; ++step) {
      std::vector<torch::Tensor> g{step == 0 ? torch::zeros({60, 40}) : low.clone(), torch::zeros({60, 40})};
      const auto m0 = g[0].clone();
      a.reduce(g, *comm, step);
      EXPECT_LE((m0 - g[0]).norm().item<double>(), m0.norm().item<double>() * (1 + 1e-6) + 1e-6) << step;
      if (step == 2) {  // rank 3 ≤ r: exact again
        EXPECT_LE(max_abs(g[0] - low), 1e-4 * max_abs(low));
      }
      EXPECT_EQ(max_abs(g[1]), 0.0);
    }
    std::stringstream blob;
    {
      torch::serialize::OutputArchive out;
      a.save(out);
      out.save_to(blob);
    }
    PowerSgdReducer b(o);
    b.use_batched_on_cpu(true);
    torch::serialize::InputArchive in;
    in.load_from(blob);
    b.load(in);
    std::vector<torch::Tensor> ga{seeded_randn({60, 40}, 10 + ctx.rank), seeded_randn({60, 40}, 20 + ctx.rank)};
    auto gb = testing::clone_all(ga);
    a.reduce(ga, *comm, 3);
    b.reduce(gb, *comm, 3);
    for (size_t i = 0; i < ga.size(); ++i) {
      EXPECT_TRUE(torch::equal(ga[i], gb[i])) << i;
      EXPECT_TRUE(torch::equal(a.error(i), b.error(i))) << i;
    }
  });
}

// The CB `lowrank` codec's batched path (what CUDA messages take), run on CPU: a message of rank ≤ r
// comes back exact after one warm-start message, also after a zero message (Q refilled), any message's
// error is at most its norm, and a saved codec continues with the same payloads.
TEST(LowRankCodecBatched, ExactForLowRankRecoversAfterZeroAndResumes) {
  MatrixView view;
  view.hidden = 40;
  LowRankCodec codec(view, 4, 714);
  codec.use_batched_on_cpu(true);
  const auto low = (seeded_randn({60, 3}, 1).mm(seeded_randn({3, 40}, 2))).view({-1});  // rank 3
  for (const auto& x : {low, torch::zeros({2400}), low, seeded_randn({2400}, 3), low}) {
    const auto y = codec.decode(codec.encode(x), x.numel());
    EXPECT_LE((x - y).norm().item<double>(), x.norm().item<double>() * (1 + 1e-6) + 1e-6);
  }
  const auto y = codec.decode(codec.encode(low), low.numel());
  EXPECT_LE(max_abs(y - low), 1e-4 * max_abs(low));
  ASSERT_TRUE(codec.q().defined());
  EXPECT_EQ(codec.q().sizes(), (std::vector<int64_t>{40, 4}));
  std::stringstream blob;
  {
    torch::serialize::OutputArchive out;
    codec.save(out);
    out.save_to(blob);
  }
  LowRankCodec other(view, 4, 1);
  other.use_batched_on_cpu(true);
  torch::serialize::InputArchive in;
  in.load_from(blob);
  other.load(in);
  const auto x = seeded_randn({2400}, 4);
  const auto a = codec.encode(x), b = other.encode(x);
  ASSERT_EQ(a.parts.size(), b.parts.size());
  for (size_t i = 0; i < a.parts.size(); ++i) EXPECT_TRUE(torch::equal(a.parts[i], b.parts[i])) << i;
}

}  // namespace
}  // namespace optcc

// DP gradient reducers on 1, 2 and 4 Gloo ranks as threads: exact means, PowerSGD invariants
// (EF conservation, identical outputs, low-rank exactness), BR-01/03/04/05 cases, byte formulas.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "compression/cast_reducer.h"
#include "compression/grad_reducer.h"
#include "compression/orthogonalize.h"
#include "compression/powersgd.h"
#include "compression/qsgd_reducer.h"
#include "compression/randomk_reducer.h"
#include "compression/signsgd_reducer.h"
#include "compression/topk_reducer.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/reducer_support.h"

namespace optcc {
namespace {

using testing::RankContext;
using testing::run_ranks;

using testing::clone_all;
using testing::expect_identical_on_all_ranks;
using testing::gather_all;
using testing::make_grads;

torch::Tensor randn(std::vector<int64_t> shape, uint64_t seed) { return testing::seeded_randn(shape, seed); }

PowerSgdOptions psgd(int64_t rank, std::string ef = "averaged") {
  PowerSgdOptions o;
  o.rank = rank;
  o.ef_residual = std::move(ef);
  return o;
}

// ---- registry -------------------------------------------------------------------------------

TEST(GradReducerRegistry, UnknownNameListsKnownNamesWithHelp) {
  Registry<GradReducer> reg;
  register_builtin_grad_reducers(reg);
  EXPECT_EQ(reg.names(), (std::vector<std::string>{"bf16", "fp16", "none", "powersgd", "qsgd", "randomk", "signsgd", "topk"}));
  try {
    reg.create("powrsgd");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'powrsgd'"), std::string::npos) << msg;
    for (const auto& n : reg.names()) EXPECT_NE(msg.find("\n  " + n + ": " + reg.help(n)), std::string::npos) << msg;
  }
}

TEST(GradReducerRegistry, UnknownOptionKeyNamesTheKeyAndKnownKeys) {
  Registry<GradReducer> reg;
  register_builtin_grad_reducers(reg);
  try {
    reg.create("powersgd", YAML::Load("{rank: 4, rnak: 8}"));
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown option 'rnak'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("min_compression_rate"), std::string::npos) << msg;
  }
  EXPECT_THROW(reg.create("fp16", YAML::Load("{rank: 4}")), std::invalid_argument);
  EXPECT_THROW(reg.create("powersgd", YAML::Load("{rank: four}")), std::invalid_argument);
  EXPECT_THROW(reg.create("powersgd", YAML::Load("{ef_residual: global}")), std::invalid_argument);
  auto r = reg.create("powersgd", YAML::Load("{rank: 8, ef_residual: local, orthogonalize: qr, seed: 3}"));
  EXPECT_EQ(r->name().rfind("powersgd(rank=8,", 0), 0u) << r->name();
  EXPECT_NE(r->name().find("ef_residual=local"), std::string::npos);
  EXPECT_EQ(reg.create("none")->name(), "none");
}

// ---- orthogonalisation ----------------------------------------------------------------------

TEST(Orthogonalize, MgsAndQrGiveOrthonormalColumns) {
  for (bool qr : {false, true}) {
    auto m = randn({100, 8}, 7);
    qr ? orthogonalize_qr_(m) : orthogonalize_mgs_(m);
    EXPECT_TRUE(torch::allclose(m.t().mm(m), torch::eye(8), 0, 1e-5)) << (qr ? "qr" : "mgs");
  }
}

TEST(Orthogonalize, ZeroColumnStaysExactlyZeroEvenWithoutEpsilon) {
  for (double eps : {1e-8, 0.0}) {
    auto m = randn({50, 4}, 8);
    m.select(1, 2).zero_();
    orthogonalize_mgs_(m, eps);
    EXPECT_TRUE(torch::isfinite(m).all().item<bool>());
    EXPECT_TRUE(torch::equal(m.select(1, 2), torch::zeros({50})));
    auto other = torch::cat({m.narrow(1, 0, 2), m.narrow(1, 3, 1)}, 1);
    EXPECT_TRUE(torch::allclose(other.t().mm(other), torch::eye(3), 0, 1e-5));
    auto z = torch::zeros({6, 3});
    orthogonalize_mgs_(z, eps);
    EXPECT_TRUE(torch::equal(z, torch::zeros({6, 3})));
  }
  auto z = torch::zeros({6, 3});
  orthogonalize_qr_(z);
  EXPECT_TRUE(torch::equal(z, torch::zeros({6, 3})));
}

// The property the low-rank compressors need: every column unit length or exactly zero, the
// unit ones orthogonal (so m·mᵀ is a projector), for inputs of rank below the column count and
// nearly dependent ones (pass 2). Both MGS forms (CPU kernel, tensor operations) and QR.
TEST(Orthogonalize, RankDeficientInputsGiveOrthonormalOrZeroColumns) {
  struct Case {
    std::string name;
    torch::Tensor m;
    int64_t rank;  // columns expected to stay (-1: all)
  };
  auto near = randn({100, 8}, 30);
  near.select(1, 5).copy_(near.select(1, 1) * 3 + randn({100}, 31) * 1e-3);  // 1e-3 relative: a real direction
  auto dup = randn({100, 8}, 32);
  dup.select(1, 6).copy_(dup.select(1, 2) * -2);
  std::vector<Case> cases = {
      {"constant", torch::full({100, 8}, 0.375f), 1},
      {"rank3", randn({100, 3}, 33).mm(randn({3, 8}, 34)), 3},
      {"duplicate column", dup, 7},
      {"nearly dependent", near, 8},
      {"wide", randn({3, 8}, 35), 3},
  };
  using Method = std::pair<std::string, std::function<void(torch::Tensor&)>>;
  for (const auto& [method, orth] :
       {Method{"mgs", [](torch::Tensor& t) { orthogonalize_mgs_(t); }},
        Method{"mgs tensor ops", [](torch::Tensor& t) { orthogonalize_mgs_tensor_ops_(t); }},
        Method{"qr", [](torch::Tensor& t) { orthogonalize_qr_(t); }}}) {
    for (const auto& c : cases) {
      auto m = c.m.clone();
      orth(m);
      const std::string what = method + " " + c.name;
      ASSERT_TRUE(torch::isfinite(m).all().item<bool>()) << what;
      const auto norms = m.norm(2, {0});  // [8]
      const auto kept = norms > 0;
      EXPECT_TRUE(torch::allclose(norms.masked_select(kept), torch::ones({kept.sum().item<int64_t>()}), 0, 1e-5))
          << what << " " << norms;
      EXPECT_EQ(kept.sum().item<int64_t>(), c.rank) << what << " " << norms;
      const auto gram = m.t().mm(m);
      const auto off = gram - torch::diag(gram.diagonal());
      EXPECT_LE(off.abs().max().item<double>(), 1e-5) << what;
    }
  }
}

// ---- identity reducers on 1, 2, 4 ranks -----------------------------------------------------

class Reducers : public ::testing::TestWithParam<int> {};

TEST_P(Reducers, NoneIsTheExactMeanAndMatchesTheBaselineBitForBit) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    // Dyadic values (k/8): every sum order is exact, and ÷ n (a power of 2) too -> 0 ULP.
    std::vector<torch::Tensor> grads{torch::arange(12, torch::kFloat).view({3, 4}).mul(0.125 * (ctx.rank + 1)),
                                     torch::full({5}, 0.5f * ctx.rank)};
    NoneReducer none;
    none.reduce(grads, *comm, 0);
    const float tri = n * (n + 1) / 2.0f;
    EXPECT_TRUE(torch::equal(grads[0], torch::arange(12, torch::kFloat).view({3, 4}).mul(0.125 * tri / n)));
    EXPECT_TRUE(torch::equal(grads[1], torch::full({5}, 0.5f * (n - 1) * n / 2 / n)));
    // Random values: bit-identical to Megatron's local-DDP recipe (cat, ÷ n, all-reduce).
    auto g = make_grads(ctx.rank, 0);
    auto ref = flatten_fp32(g).div_(n);
    comm->all_reduce(ref, Traffic::kDataParallel);
    none.reduce(g, *comm, 1);
    EXPECT_TRUE(torch::equal(flatten_fp32(g), ref));
    EXPECT_EQ(none.raw_bytes(), (512 + 16 + 96 + 3072) * 4);
    EXPECT_EQ(none.payload_bytes(), n == 1 ? 0 : none.raw_bytes());
    expect_identical_on_all_ranks(*comm, g);
  });
}

TEST_P(Reducers, Fp16AndBf16AreTheMeanWithinTheirPrecision) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    for (auto wire : {torch::kHalf, torch::kBFloat16}) {
      auto g = make_grads(ctx.rank, 0);
      auto all = gather_all(*comm, g);  // exact inputs of every rank
      auto mean = all.sum(0).div(n);
      CastReducer red(wire);
      red.reduce(g, *comm, 0);
      const double tol = wire == torch::kHalf ? 2e-3 : 1.6e-2;  // ~2 half-ulps of |x| ≤ 4, n terms
      EXPECT_TRUE(torch::allclose(flatten_fp32(g), mean, tol, tol * n)) << red.name();
      EXPECT_EQ(red.payload_bytes(), n == 1 ? 0 : red.raw_bytes() / 2);
      expect_identical_on_all_ranks(*comm, g);
    }
  });
}

// parallel.grad_reduce_dtype: compute: NoneReducer with a 16-bit wire is, bit for bit, the closed
// form of its header: round_wire(g_r · S / n) summed in fp32 over the ranks, rounded once, ÷ S.
// S = 1024 (an fp16 loss scale) and S = 1 (bf16). Two bytes per element handed to the wire.
TEST_P(Reducers, NoneWithA16BitWireIsTheMeanSummedInFp32) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    for (auto [wire, scale] : {std::pair{torch::kHalf, 1024.0}, std::pair{torch::kBFloat16, 1.0}}) {
      auto g = make_grads(ctx.rank, 0);
      auto all = gather_all(*comm, g);  // [n, Σ numel] exact inputs of every rank
      NoneReducer none(wire);
      none.set_wire_scale(scale);
      none.reduce(g, *comm, 0);
      const auto expect = n == 1 ? all[0] : all.mul(scale / n).to(wire).to(torch::kFloat).sum(0).to(wire).to(torch::kFloat).mul(1.0 / scale);
      EXPECT_TRUE(torch::equal(flatten_fp32(g), expect)) << c10::toString(wire) << " world " << n;
      EXPECT_EQ(none.payload_bytes(), n == 1 ? 0 : none.raw_bytes() / 2);
      EXPECT_EQ(none.wire_overflow_limit(n), wire == torch::kHalf ? 65504.0 * n : std::numeric_limits<double>::infinity());
      expect_identical_on_all_ranks(*comm, g);
    }
  });
  EXPECT_THROW(NoneReducer(torch::kInt), std::invalid_argument);
  EXPECT_THROW(NoneReducer(torch::kHalf).set_wire_scale(0.0), std::invalid_argument);
}

// ---- PowerSGD invariants on 1, 2, 4 ranks ---------------------------------------------------

TEST_P(Reducers, PowerSgdConservesErrorFeedbackAndAgreesAcrossRanks) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    for (std::string variant : {"averaged", "local"}) {
      PowerSgdReducer red(psgd(4, variant));
      for (int64_t step = 0; step < 3; ++step) {
        auto g = make_grads(ctx.rank, step);
        std::vector<torch::Tensor> compensated;  // grad + old EF, per compressed tensor (0 and 3)
        for (size_t i : {0, 3}) {
          auto old = red.error(i);
          compensated.push_back(g[i].reshape({g[i].size(0), -1}) + (old.defined() ? old : torch::zeros({1})));
        }
        red.reduce(g, *comm, step);
        ASSERT_TRUE(red.records()[0].compressed && red.records()[3].compressed);
        ASSERT_FALSE(red.records()[1].compressed || red.records()[2].compressed);
        for (int k = 0; k < 2; ++k) {
          const size_t i = k == 0 ? 0 : 3;
          auto out = g[i].reshape({g[i].size(0), -1});
          auto ef = red.error(i);
          if (variant == "averaged") {  // averaged reconstruction + residual = compensated input
            EXPECT_TRUE(torch::allclose(out + ef, compensated[k], 1e-6, 1e-6)) << variant << " step " << step;
          } else {  // own reconstruction (compensated − EF) has rank ≤ r and averages to the output
            auto own = compensated[k] - ef;
            EXPECT_LE(torch::linalg_matrix_rank(own.to(torch::kDouble), 1e-5, 0.0, false).item<int64_t>(), 4);
            auto mean_own = own.clone();
            comm->all_reduce(mean_own, Traffic::kControl);
            EXPECT_TRUE(torch::allclose(mean_own.div_(n), out, 1e-6, 1e-6)) << variant << " step " << step;
          }
        }
        expect_identical_on_all_ranks(*comm, g);
      }
    }
  });
}

TEST_P(Reducers, ByteCountsFollowTheFormulas) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    TrafficMeter meter;
    auto comm = ctx.world_group(&meter);
    PowerSgdReducer red(psgd(4));
    auto g = make_grads(ctx.rank, 0);
    red.reduce(g, *comm, 0);
    const int64_t p = (32 * 4 + 64 * 4) * 4, q = (16 * 4 + 48 * 4) * 4, raw = (16 + 96) * 4;
    EXPECT_EQ(red.payload_bytes(), p + q + raw);
    EXPECT_EQ(red.raw_bytes(), (512 + 16 + 96 + 3072) * 4);
    EXPECT_EQ(red.records()[3].sent_bytes, (64 + 48) * 4 * 4);
    EXPECT_EQ(red.records()[3].rank, 4);
    auto wire = [n](int64_t x) { return 2 * (n - 1) * x / n; };
    EXPECT_EQ(meter.at(Traffic::kDataParallel, Link::kIntraNode).bytes, wire(p) + wire(q) + wire(raw));
    EXPECT_EQ(meter.at(Traffic::kDataParallel, Link::kIntraNode).calls, n == 1 ? 0 : 3);
    EXPECT_EQ(meter.at(Traffic::kControl, Link::kIntraNode).bytes, wire(4));  // non-finite flag
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Reducers, ::testing::Values(1, 2, 4));

// ---- single worker: exactness ---------------------------------------------------------------

// Direct: the first step (random Q) already reproduces M, since P = M Q spans col(M); warm start
// keeps it. Rank < r too: MGS's second pass zeroes the dependent columns of P (the reference's
// single pass normalised their rounding residue into vectors not orthogonal to the others, so
// P̂ P̂ᵀ was no projector and the error O(1)).
TEST(PowerSgd, ReproducesARankAtMostRMatrixInOneStepAndWithWarmStart) {
  for (auto [k, method] : {std::pair<int64_t, std::string>{4, "mgs"}, {4, "qr"}, {3, "mgs"}, {3, "qr"}, {1, "mgs"},
                           {1, "qr"}}) {
    run_ranks(1, [&](const RankContext& ctx) {
      auto comm = ctx.world_group();
      auto m = randn({64, k}, 11).mm(randn({k, 48}, 12));  // rank k ≤ r = 4
      PowerSgdOptions o = psgd(4);
      o.orthogonalize = method;
      PowerSgdReducer red(o);
      for (int64_t step = 0; step < 3; ++step) {  // step 0: random Q (direct); 1, 2: warm start
        std::vector<torch::Tensor> g{m.clone()};
        red.reduce(g, *comm, step);
        ASSERT_TRUE(red.records()[0].compressed);
        EXPECT_TRUE(torch::allclose(g[0], m, 1e-5, 1e-5))
            << method << " rank " << k << " step " << step << " max err " << (g[0] - m).abs().max().item<float>();
      }
    });
  }
}

// ---- every reducer: never worse than sending nothing ----------------------------------------

// Gradient matrices [100, 48] that low-rank and quantising reducers find hard (as act_codec_test's).
torch::Tensor hard_gradient(const std::string& kind, uint64_t seed) {
  const int64_t rows = 100, cols = 48;
  if (kind == "zero") return torch::zeros({rows, cols});
  if (kind == "constant") return torch::full({rows, cols}, 0.375f);
  if (kind == "rank1") return randn({rows, 1}, seed).mm(randn({1, cols}, seed + 1));
  if (kind == "rank3") return randn({rows, 3}, seed).mm(randn({3, cols}, seed + 1));
  if (kind == "padded") {
    auto m = randn({rows, cols}, seed);
    m.narrow(0, rows / 2, rows / 2).zero_();
    return m;
  }
  if (kind == "random") return randn({rows, cols}, seed);
  if (kind == "tiny") return randn({rows, cols}, seed) * 1e-30;
  if (kind == "guard") return randn({rows, 1}, seed).mm(randn({1, cols}, seed + 1)) * 1e-10;  // ‖P‖ ~ the 1e-8 guard
  if (kind == "spikes") {
    auto m = randn({rows, cols}, seed) * 1e-3;
    m.select(1, 7).fill_(50.0f);
    m.select(1, 8).fill_(-40.0f);
    return m;
  }
  throw std::invalid_argument("unknown gradient kind " + kind);
}

// Values beyond fp16's range are left out: the fp16 reducer's all-reduce overflows to inf past
// 65504 (cast_reducer.h), as NCCL's and Gloo's fp16 sums do.
const std::vector<std::string> kGradientKinds = {"zero",   "constant", "rank1", "rank3", "padded",
                                                 "random", "tiny",     "guard", "spikes"};

torch::Tensor residual_of(const GradReducer& red) {
  if (const auto* p = dynamic_cast<const PowerSgdReducer*>(&red)) return p->error(0);
  if (const auto* e = dynamic_cast<const ElementwiseReducer*>(&red)) return e->error(0);
  return torch::Tensor();
}

class ReducerBound : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// On 1 rank, and on 2 ranks with identical inputs (the mean is the input): for the compensated
// input c = grad + residual, ‖out − c‖ ≤ ‖c‖, out = 0 exactly for c = 0, no NaN; with error
// feedback out + new residual = c; PowerSGD reproduces gradients of rank ≤ r. Three steps with
// three different gradients of the kind, so warm starts and residuals are exercised.
// At the three precisions: fp32 gradients, and bf16 / fp16 gradient tensors (the reducers' state
// stays fp32, cast at the boundary). The 16-bit output is the fp32 result rounded once, so the
// bound gains that rounding (unit roundoff u: 2⁻⁸ bf16, 2⁻¹¹ fp16; for fp16 also its subnormals,
// ≤ 2⁻²⁵ per element), and out + residual = c holds up to it.
TEST_P(ReducerBound, ErrorNeverExceedsTheInputNorm) {
  const auto& [name, kind] = GetParam();
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const double u = dtype == torch::kFloat ? 0.0 : dtype == torch::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    for (int world : {1, 2}) {
      run_ranks(world, [&](const RankContext& ctx) {
        auto comm = ctx.world_group();
        Registry<GradReducer> reg;
        register_builtin_grad_reducers(reg);
        auto red = reg.create(name);
        for (int64_t step = 0; step < 3; ++step) {
          const auto g0 = hard_gradient(kind, 60 + step).to(dtype);  // the same on every rank
          const auto old = residual_of(*red);
          const auto c = old.defined() ? g0.to(torch::kFloat) + old.view_as(g0) : g0.to(torch::kFloat);
          std::vector<torch::Tensor> g{g0.clone()};
          red->reduce(g, *comm, step);
          const std::string what =
              fmt::format("{} {} {} world {} step {}", name, kind, c10::toString(dtype), world, step);
          ASSERT_EQ(g[0].scalar_type(), dtype) << what;
          ASSERT_TRUE(torch::isfinite(g[0]).all().item<bool>()) << what;
          const auto out = g[0].to(torch::kDouble);
          const double err = (out - c.to(torch::kDouble)).norm().item<double>();  // double: 1e-30² underflows in fp32
          const double norm = c.to(torch::kDouble).norm().item<double>();
          const double subnormal = dtype == torch::kHalf ? std::sqrt(double(c.numel())) * std::ldexp(1.0, -25) : 0.0;
          if (norm == 0) {
            EXPECT_TRUE(torch::equal(g[0].to(torch::kFloat), torch::zeros_like(c))) << what;
          } else {
            EXPECT_LE(err, norm * (1 + 1e-6 + 2 * u) + subnormal) << what << ": error " << err << " > norm " << norm;
          }
          const auto ef = residual_of(*red);
          if (ef.defined()) {
            const double slack = 1e-6 * std::max(1.0, c.abs().max().item<double>()) +
                                 u * out.abs().max().item<double>() + (dtype == torch::kHalf ? std::ldexp(1.0, -24) : 0.0);
            EXPECT_LE((out + ef.view_as(c).to(torch::kDouble) - c.to(torch::kDouble)).abs().max().item<double>(), slack)
                << what << ": decoded + residual != input";
          }
          // From a random Q (step 0). Later steps add the previous step's rounding-level residual to
          // another gradient (full rank, amplified by a Q tuned to the previous gradient): bound only.
          // fp32 only: rounding a rank-1 matrix to 16 bits makes it full rank.
          if (name == "powersgd" && dtype == torch::kFloat && step == 0 &&
              (kind == "constant" || kind == "rank1" || kind == "rank3")) {
            EXPECT_LE(err, 1e-5 * norm) << what << ": rank <= 4 is not reproduced";
          }
        }
      });
    }
  }
}

TEST(ReducerBound, CoversEveryRegisteredReducer) {
  Registry<GradReducer> reg;
  register_builtin_grad_reducers(reg);
  EXPECT_EQ(reg.names(), (std::vector<std::string>{"bf16", "fp16", "none", "powersgd", "qsgd", "randomk", "signsgd", "topk"}));
}

INSTANTIATE_TEST_SUITE_P(AllReducersAllGradients, ReducerBound,
                         ::testing::Combine(::testing::Values("bf16", "fp16", "none", "powersgd", "qsgd", "randomk",
                                                              "signsgd", "topk"),
                                            ::testing::ValuesIn(kGradientKinds)),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// After a zero gradient Q was all zero, after a rank-1 one it had three zero columns; without the
// refill they stayed zero for ever and PowerSGD sent nothing (or one direction) from then on,
// while the error feedback grew. Now the next gradient of rank ≤ r comes back exactly.
TEST(PowerSgd, WarmStartRecoversAfterZeroAndRankDeficientGradients) {
  for (std::string method : {"mgs", "qr"}) {
    run_ranks(2, [&](const RankContext& ctx) {
      auto comm = ctx.world_group();
      PowerSgdOptions o = psgd(4);
      o.orthogonalize = method;
      o.error_feedback = false;
      PowerSgdReducer red(o);
      int64_t step = 0;
      for (const auto& before : {torch::zeros({100, 48}), torch::full({100, 48}, 0.5f)}) {
        std::vector<torch::Tensor> g{before.clone()};
        red.reduce(g, *comm, step++);
        const auto rank3 = hard_gradient("rank3", 70);
        g = {rank3.clone()};
        red.reduce(g, *comm, step++);
        EXPECT_LE((g[0] - rank3).abs().max().item<double>(), 1e-5 * rank3.abs().max().item<double>())
            << method << " after " << before.abs().max().item<double>();
        expect_identical_on_all_ranks(*comm, g);
      }
    });
  }
}

// ---- bug cases ------------------------------------------------------------------------------

TEST(PowerSgd, Br04RawVersusCompressedDecisions) {
  for (int64_t r : {16, 4}) {
    run_ranks(2, [&](const RankContext& ctx) {
      auto comm = ctx.world_group();
      const uint64_t s = 100 * ctx.rank;
      std::vector<torch::Tensor> g{randn({8, 8}, s + 1), randn({4096}, s + 2), randn({2, 1000000}, s + 3),
                                   torch::zeros({64, 64}), randn({512, 512}, s + 5)};
      auto in = clone_all(g);
      PowerSgdOptions o = psgd(r);  // min_compression_rate 2 (default)
      PowerSgdReducer red(o);
      red.set_tensor_names({"G1", "G2", "G3", "G4", "G5"});
      red.reduce(g, *comm, 0);
      const auto& rec = red.records();
      EXPECT_EQ(rec[0].name, "G1");
      for (int i : {0, 1, 2}) EXPECT_FALSE(rec[i].compressed) << rec[i].name << " r=" << r;
      for (int i : {3, 4}) EXPECT_TRUE(rec[i].compressed) << rec[i].name << " r=" << r;
      EXPECT_EQ(rec[3].rank, r);
      EXPECT_EQ(rec[4].rank, r);
      EXPECT_EQ(rec[2].sent_bytes, 2 * 1000000 * 4);  // G3: r_eff 2, (2+1e6)·2 > 2e6 -> raw
      EXPECT_EQ(rec[4].sent_bytes, (512 + 512) * r * 4);
      // Raw tensors are the exact mean (two ranks: a + b is order-free, ÷ 2 exact).
      auto all = comm->all_gather(flatten_fp32({in[0], in[1], in[2]}).unsqueeze(0), Traffic::kControl, 0);
      EXPECT_TRUE(torch::equal(flatten_fp32({g[0], g[1], g[2]}), (all[0] + all[1]).div(2)));
      EXPECT_TRUE(torch::equal(g[3], torch::zeros({64, 64})));  // G4: exact zeros, no NaN
      EXPECT_TRUE(torch::equal(red.error(3), torch::zeros({64, 64})));
      EXPECT_FALSE(red.error(0).defined() || red.error(1).defined() || red.error(2).defined());
      EXPECT_TRUE(torch::isfinite(g[4]).all().item<bool>());
      expect_identical_on_all_ranks(*comm, g);
    });
  }
}

TEST(PowerSgd, Br05BothResidualVariantsByHand) {
  for (std::string variant : {"averaged", "local"}) {
    run_ranks(2, [&](const RankContext& ctx) {
      auto comm = ctx.world_group();
      PowerSgdOptions o = psgd(1, variant);
      o.min_compression_rate = 0;  // a 2×2 rank-1 matrix has rate 1: compress it anyway
      PowerSgdReducer red(o);
      red.set_q(0, torch::tensor({{1.0f}, {1.0f}}) / std::sqrt(2.0f));
      auto g0 = ctx.rank == 0 ? torch::tensor({{1.0f, 0.0f}, {0.0f, 0.0f}}) : torch::tensor({{0.0f, 0.0f}, {0.0f, 1.0f}});
      std::vector<torch::Tensor> g{g0.clone()};
      red.reduce(g, *comm, 0);
      // P = G Q summed = [1,1]/√2 -> P̂ = [1,1]/√2; Q_i = G_iᵀ P̂; mean Q = [1,1]/(2√2); out = 1/4.
      EXPECT_TRUE(torch::allclose(g[0], torch::full({2, 2}, 0.25f), 0, 1e-6));
      torch::Tensor ef;
      if (variant == "averaged") {  // EF = G − out
        ef = ctx.rank == 0 ? torch::tensor({{0.75f, -0.25f}, {-0.25f, -0.25f}})
                           : torch::tensor({{-0.25f, -0.25f}, {-0.25f, 0.75f}});
        EXPECT_TRUE(torch::allclose(g[0] + red.error(0), g0, 0, 1e-6));
      } else {  // EF = G − P̂ Q_iᵀ: own reconstruction [[½,0],[½,0]] (rank 0), [[0,½],[0,½]] (rank 1)
        ef = ctx.rank == 0 ? torch::tensor({{0.5f, 0.0f}, {-0.5f, 0.0f}}) : torch::tensor({{0.0f, -0.5f}, {0.0f, 0.5f}});
        auto own = ctx.rank == 0 ? torch::tensor({{0.5f, 0.0f}, {0.5f, 0.0f}}) : torch::tensor({{0.0f, 0.5f}, {0.0f, 0.5f}});
        EXPECT_TRUE(torch::allclose(own + red.error(0), g0, 0, 1e-6));
      }
      EXPECT_TRUE(torch::allclose(red.error(0), ef, 0, 1e-6)) << variant << "\n" << red.error(0);
      expect_identical_on_all_ranks(*comm, g);
    });
  }
}

TEST(PowerSgd, Br01HalfGradientsStayFiniteWithFp32Internals) {
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    // Shrunk from [1024, 4096]: half the entries 3e4, so column sums of squares overflow fp16.
    auto mask = torch::rand({256, 1024}, at::make_generator<at::CPUGeneratorImpl>(ctx.rank + 5)) < 0.5;
    auto m = torch::where(mask, torch::full({256, 1024}, 3.0e4f), randn({256, 1024}, ctx.rank)).to(torch::kHalf);
    ASSERT_TRUE(torch::isinf(m.to(torch::kHalf).pow(2).sum(0)).any().item<bool>());
    PowerSgdReducer red(psgd(4));
    std::vector<torch::Tensor> g{m.clone()};
    red.reduce(g, *comm, 0);
    EXPECT_EQ(g[0].scalar_type(), torch::kHalf);
    EXPECT_EQ(red.error(0).scalar_type(), torch::kFloat);
    EXPECT_EQ(red.q(0).scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::isfinite(g[0]).all().item<bool>());
    EXPECT_TRUE(torch::isfinite(red.error(0)).all().item<bool>());
    expect_identical_on_all_ranks(*comm, g);
  });
}

TEST(PowerSgd, Br01NonFiniteOnOneRankSkipsOnAllRanksLeavingStateUntouched) {
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    PowerSgdReducer red(psgd(4));
    auto g = make_grads(ctx.rank, 0);
    red.reduce(g, *comm, 0);
    auto ef = red.error(3).clone(), q = red.q(3).clone();
    auto bad = make_grads(ctx.rank, 1);
    if (ctx.rank == 1) bad[3][5][7] = std::numeric_limits<float>::infinity();
    auto before = clone_all(bad);
    EXPECT_THROW(red.reduce(bad, *comm, 1), NonFiniteGradients);
    EXPECT_TRUE(torch::equal(red.error(3), ef));
    EXPECT_TRUE(torch::equal(red.q(3), q));
    for (size_t i = 0; i < bad.size(); ++i) EXPECT_TRUE(torch::equal(bad[i], before[i]));
  });
}

TEST(PowerSgd, WarmupIsDerivedFromTheGlobalStep) {
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    PowerSgdOptions o = psgd(4);
    o.warmup_steps = 5;
    PowerSgdReducer red(o);
    auto g = make_grads(ctx.rank, 0);
    red.reduce(g, *comm, 4);  // still warm-up: baseline, no state
    for (const auto& r : red.records()) EXPECT_FALSE(r.compressed);
    EXPECT_FALSE(red.error(3).defined());
    g = make_grads(ctx.rank, 1);
    red.reduce(g, *comm, 5);  // first compressed step, whatever the call count
    EXPECT_TRUE(red.records()[3].compressed);
  });
}

TEST(PowerSgd, Br03SaveLoadContinuesBitIdentically) {
  for (bool warm : {true, false}) {
    run_ranks(2, [&](const RankContext& ctx) {
      auto comm = ctx.world_group();
      PowerSgdOptions o = psgd(4);
      o.warmup_steps = 1;
      o.warm_start = warm;
      PowerSgdReducer a(o);
      for (int64_t step = 0; step < 3; ++step) {
        auto g = make_grads(ctx.rank, step);
        a.reduce(g, *comm, step);
      }
      std::stringstream blob;
      {
        torch::serialize::OutputArchive out;
        a.save(out);
        out.save_to(blob);
      }
      PowerSgdReducer b(o);
      torch::serialize::InputArchive in;
      in.load_from(blob);
      b.load(in);
      auto ga = make_grads(ctx.rank, 3), gb = clone_all(ga);
      a.reduce(ga, *comm, 3);
      b.reduce(gb, *comm, 3);
      for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(torch::equal(ga[i], gb[i])) << "warm " << warm << " i " << i;
      EXPECT_TRUE(torch::equal(a.error(3), b.error(3)));
      PowerSgdReducer c(psgd(8));
      blob.clear();
      blob.seekg(0);
      torch::serialize::InputArchive in2;
      in2.load_from(blob);
      EXPECT_THROW(c.load(in2), std::invalid_argument);
    });
  }
}

// The results attribute dp_ef_residual comes from the reducer itself: PowerSGD's option, n/a elsewhere.
TEST(GradReducer, EfResidualIsTheReducersOwnChoice) {
  Registry<GradReducer> r;
  register_builtin_grad_reducers(r);
  EXPECT_EQ(r.create("powersgd")->ef_residual(), "averaged");
  EXPECT_EQ(r.create("powersgd", YAML::Load("{ef_residual: local}"))->ef_residual(), "local");
  for (const char* name : {"none", "fp16", "bf16", "topk", "randomk", "qsgd", "signsgd"}) {
    EXPECT_EQ(r.create(name)->ef_residual(), "n/a") << name;
  }
}

}  // namespace
}  // namespace optcc

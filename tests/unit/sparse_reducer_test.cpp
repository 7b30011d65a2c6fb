// Element-wise DP reducers (topk, randomk, qsgd, signsgd) on 1, 2 and 4 Gloo ranks as threads:
// EF conservation against independent references, identical outputs, hand examples, byte
// formulas, save/load, non-finite skips, options and registry.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <sstream>

#include "compression/grad_reducer.h"
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

torch::Tensor randn(std::vector<int64_t> shape, uint64_t seed) { return testing::seeded_randn(shape, seed); }

// A stage's gradients: 512, 13, 105 and 3072 elements (odd sizes: partial bit bytes and buckets).
std::vector<torch::Tensor> make_grads(int rank, int64_t step) {
  const uint64_t s = 1000 * rank + 10 * step;
  return {randn({32, 16}, s + 1), randn({13}, s + 2), randn({7, 5, 3}, s + 3), randn({64, 48}, s + 4)};
}

// Every rank's `t` flattened, [world, numel] fp32 (Traffic::kControl: not counted as DP).
torch::Tensor gather_rows(Communicator& comm, const torch::Tensor& t) {
  return comm.all_gather(t.reshape({1, -1}).to(torch::kFloat), Traffic::kControl, 0);
}

std::unique_ptr<ElementwiseReducer> make(const std::string& kind, const std::string& yaml = "{}") {
  Registry<GradReducer> reg;
  register_builtin_grad_reducers(reg);
  auto r = reg.create(kind, YAML::Load(yaml));
  auto* e = dynamic_cast<ElementwiseReducer*>(r.get());
  if (!e) throw std::logic_error(kind + " is not an ElementwiseReducer");
  r.release();
  return std::unique_ptr<ElementwiseReducer>(e);
}

// ---- independent references of one rank's decoded message ------------------------------------

torch::Tensor topk_ref(const torch::Tensor& c, int64_t k) {  // the k largest |c| kept (no ties)
  auto kth = std::get<0>(c.abs().sort(0, /*descending=*/true))[k - 1];
  return torch::where(c.abs() >= kth, c, torch::zeros_like(c));
}

torch::Tensor signsgd_ref(const torch::Tensor& c) {  // mean |c| · sign, sign(0) = +1
  return torch::where(c >= 0, torch::ones_like(c), -torch::ones_like(c)) * c.abs().mean();
}

torch::Tensor randomk_ref(const torch::Tensor& c, const torch::Tensor& idx) {
  return torch::zeros_like(c).index_copy_(0, idx, c.index_select(0, idx));
}

// own = a valid QSGD decode of c: per bucket own·s/‖c_b‖ is an integer in [−s, s] with c's sign.
void expect_on_qsgd_grid(const torch::Tensor& c, const torch::Tensor& own, int64_t b, int64_t s) {
  const int64_t n = c.numel(), nb = (n + b - 1) / b;
  auto cb = torch::constant_pad_nd(c, {0, nb * b - n}).view({nb, b});
  auto ob = torch::constant_pad_nd(own, {0, nb * b - n}).view({nb, b});
  auto level = ob * s / cb.norm(2, {1}, true);
  EXPECT_LT((level - level.round()).abs().max().item<float>(), 1e-3);
  EXPECT_LE(level.abs().max().item<float>(), s + 1e-3);
  EXPECT_TRUE(torch::all(level * cb >= -1e-6).item<bool>());  // same sign (or zero)
}

// ---- invariants on 1, 2, 4 ranks ----------------------------------------------------------------

class SparseReducers : public ::testing::TestWithParam<int> {};

TEST_P(SparseReducers, ErrorFeedbackIsConservedAndTheOutputIsTheMeanOfDecodedMessages) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    for (std::string spec : {"topk", "randomk", "signsgd", "qsgd"}) {
      auto red = spec == "qsgd" ? make(spec, "{error_feedback: true, bucket_size: 64, levels: 8}") : make(spec);
      for (int64_t step = 0; step < 3; ++step) {
        auto g = make_grads(ctx.rank, step);
        std::vector<torch::Tensor> c;  // grad + old EF, flat
        for (size_t i = 0; i < g.size(); ++i) {
          auto old = red->error(i);
          c.push_back(g[i].reshape({-1}) + (old.defined() ? old : torch::zeros({1})));
        }
        red->reduce(g, *comm, step);
        for (size_t i = 0; i < g.size(); ++i) {
          ASSERT_TRUE(red->records()[i].compressed) << spec << " tensor " << i;
          const auto ef = red->error(i);
          ASSERT_EQ(ef.scalar_type(), torch::kFloat);
          torch::Tensor own;  // this rank's decoded message, computed independently
          if (spec == "topk") {
            own = topk_ref(c[i], dynamic_cast<TopKReducer&>(*red).k_for(c[i].numel()));
          } else if (spec == "randomk") {
            own = randomk_ref(c[i], dynamic_cast<RandomKReducer&>(*red).indices(step, i, c[i].numel()));
          } else if (spec == "signsgd") {
            own = signsgd_ref(c[i]);
          } else {  // qsgd draws are private: own = c − EF must lie on the grid
            own = c[i] - ef;
            expect_on_qsgd_grid(c[i], own, 64, 8);
          }
          EXPECT_TRUE(torch::allclose(own + ef, c[i], 1e-6, 1e-6)) << spec << " step " << step << " tensor " << i;
          auto rows = gather_rows(*comm, own);
          auto mean = rows[0].clone();
          for (int r = 1; r < n; ++r) mean.add_(rows[r]);
          EXPECT_TRUE(torch::allclose(g[i].reshape({-1}), mean.div_(n), 1e-6, 1e-6)) << spec << " step " << step;
        }
        testing::expect_identical_on_all_ranks(*comm, g);
      }
    }
  });
}

TEST_P(SparseReducers, ByteCountsFollowTheFormulas) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    TrafficMeter meter;
    auto comm = ctx.world_group(&meter);
    auto gather = [n](int64_t x) { return (n - 1) * x; };
    auto all_reduce = [n](int64_t x) { return 2 * (n - 1) * x / n; };
    const int64_t raw = (512 + 13 + 105 + 3072) * 4;
    struct Case {
      std::string kind, yaml;
      std::vector<int64_t> sent;  // per tensor
      int64_t dp_wire;
      int calls;
    };
    const std::vector<Case> cases{
        // k = round(0.01·N) ≥ 1: 5, (13 < min_numel: raw 52 bytes), 1, 31; 8 bytes per entry; + raw all-reduce.
        {"topk", "{min_numel: 20}", {40, 52, 8, 248}, gather(8 * 37) + all_reduce(52), 2},
        // k = 8 values of 4 bytes per tensor, one all-reduce.
        {"randomk", "{count: 8}", {32, 32, 32, 32}, all_reduce(128), 1},
        // N + 4·⌈N/512⌉.
        {"qsgd", "{}", {516, 17, 109, 3096}, gather(3738), 1},
        // bits 4: ⌈N/2⌉ + 4·⌈N/512⌉.
        {"qsgd", "{bits: 4, levels: 7}", {260, 11, 57, 1560}, gather(1888), 1},
        // ⌈N/8⌉ + 4.
        {"signsgd", "{}", {68, 6, 18, 388}, gather(480), 1},
    };
    for (const auto& k : cases) {
      meter.reset();
      auto red = make(k.kind, k.yaml);
      auto g = make_grads(ctx.rank, 0);
      red->reduce(g, *comm, 0);
      int64_t payload = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_EQ(red->records()[i].sent_bytes, k.sent[i]) << k.kind << " tensor " << i;
        EXPECT_EQ(red->records()[i].compressed, !(k.kind == "topk" && i == 1)) << k.kind << " tensor " << i;
        EXPECT_EQ(red->records()[i].rank, 0);
        payload += k.sent[i];
      }
      EXPECT_EQ(red->payload_bytes(), payload) << k.kind;
      EXPECT_EQ(red->raw_bytes(), raw);
      EXPECT_EQ(meter.at(Traffic::kDataParallel, Link::kIntraNode).bytes, k.dp_wire) << k.kind;
      EXPECT_EQ(meter.at(Traffic::kDataParallel, Link::kIntraNode).calls, n == 1 ? 0 : k.calls) << k.kind;
      EXPECT_EQ(meter.at(Traffic::kControl, Link::kIntraNode).bytes, all_reduce(4)) << k.kind;  // non-finite flag
    }
  });
}

// QSGD's 4-bit wire carries the same codes as its int8 wire: results and error feedback are
// bit-identical for levels <= 7, at half the code bytes.
TEST_P(SparseReducers, QsgdFourBitWireEqualsTheInt8Wire) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    auto eight = make("qsgd", "{levels: 7, bucket_size: 64, error_feedback: true, seed: 3}");
    auto four = make("qsgd", "{levels: 7, bucket_size: 64, error_feedback: true, seed: 3, bits: 4}");
    for (int64_t step = 0; step < 2; ++step) {
      auto a = make_grads(ctx.rank, step), b = make_grads(ctx.rank, step);
      eight->reduce(a, *comm, step);
      four->reduce(b, *comm, step);
      for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i << " step " << step;
      EXPECT_LT(four->payload_bytes(), eight->payload_bytes() * 6 / 10);
    }
    for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(torch::equal(eight->error(i), four->error(i))) << "EF " << i;
  });
  EXPECT_THROW(make("qsgd", "{bits: 4}"), std::invalid_argument);  // 16 levels do not fit 4 bits
  EXPECT_THROW(make("qsgd", "{bits: 2, levels: 1}"), std::invalid_argument);
}

TEST_P(SparseReducers, RandomKSharesItsIndicesAndAveragesExactlyThere) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    RandomKOptions o;
    o.fraction = 0.25;
    o.seed = 9;
    RandomKReducer red(o);
    for (int64_t step = 0; step < 3; ++step) {
      // Dyadic values (k/8, |x| ≤ 16): sums in any order and ÷ n (a power of 2) are exact.
      auto in = torch::randint(-128, 128, {40, 10}, at::make_generator<at::CPUGeneratorImpl>(ctx.rank * 7 + step),
                               torch::kFloat).div_(8);
      auto old = red.error(0);
      auto c = in.reshape({-1}) + (old.defined() ? old : torch::zeros({1}));
      std::vector<torch::Tensor> g{in.clone()};
      red.reduce(g, *comm, step);
      auto idx = red.indices(step, 0, 400);
      ASSERT_EQ(idx.numel(), 100);
      EXPECT_EQ(std::get<0>(torch::_unique(idx)).numel(), 100);  // without replacement
      auto idx_all = comm->all_gather(idx.unsqueeze(0), Traffic::kControl, 0);
      for (int r = 1; r < n; ++r) EXPECT_TRUE(torch::equal(idx_all[r], idx_all[0]));
      auto c_all = gather_rows(*comm, c);
      auto mean = c_all.sum(0).div(n);  // exact
      auto expected = torch::zeros({400}).index_copy_(0, idx, mean.index_select(0, idx));
      EXPECT_TRUE(torch::equal(g[0].reshape({-1}), expected)) << "step " << step;
      EXPECT_TRUE(torch::equal(red.error(0), c.clone().index_fill_(0, idx, 0.0)));  // unsent entries stay
      EXPECT_FALSE(torch::equal(red.indices(step + 1, 0, 400), idx));  // a new draw every step
    }
    EXPECT_FALSE(torch::equal(red.indices(0, 0, 400), red.indices(0, 1, 400)));  // and every tensor
  });
}

TEST_P(SparseReducers, HalfGradientsUseFp32InternalsAndStayIdentical) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
      for (std::string kind : {"topk", "randomk", "signsgd", "qsgd"}) {
        auto red = make(kind, kind == "qsgd" ? "{error_feedback: true}" : "{}");
        auto g = make_grads(ctx.rank, 0);
        for (auto& t : g) t = t.to(dtype);
        red->reduce(g, *comm, 0);
        for (size_t i = 0; i < g.size(); ++i) {
          EXPECT_EQ(g[i].scalar_type(), dtype);
          EXPECT_EQ(red->error(i).scalar_type(), torch::kFloat) << kind;
        }
        testing::expect_identical_on_all_ranks(*comm, g);
      }
    }
  });
}

// topk's, randomk's and qsgd's tensor forms (what gradients on a GPU get: EF and messages on the device)
// on CPU tensors, against the raw loops: the same gradients out and the same EF, bit for bit, over 3
// steps, with EF on and off, ties at topk's k-th magnitude, qsgd's partial buckets and 4-bit codes;
// 3 ranks so that ÷ dp is not a power of two.
TEST(SparseReducersTensorForm, TopkRandomkAndQsgdEqualTheRawLoopsBitForBit) {
  for (const int n : {1, 3}) {
    run_ranks(n, [&](const RankContext& ctx) {
      auto comm = ctx.world_group();
      for (const auto& [kind, yaml] : std::vector<std::pair<std::string, std::string>>{
               {"topk", "{fraction: 0.1}"}, {"topk", "{count: 40, error_feedback: false}"},
               {"randomk", "{fraction: 0.1, seed: 5}"}, {"randomk", "{count: 40, error_feedback: false}"},
               {"qsgd", "{error_feedback: true, bucket_size: 100, levels: 8}"},  // 13 and 105: partial buckets
               {"qsgd", "{bits: 4, levels: 7, bucket_size: 64}"}}) {
        auto loops = make(kind, yaml), tensors = make(kind, yaml);
        ASSERT_TRUE(tensors->has_tensor_form());
        tensors->use_tensor_form_on_cpu(true);
        for (int64_t step = 0; step < 3; ++step) {
          auto a = make_grads(ctx.rank, step);
          a[3].narrow(0, 0, 8).fill_(3.0f);  // 384 tied magnitudes: the k-th largest falls among them
          auto b = clone_all(a);
          loops->reduce(a, *comm, step);
          tensors->reduce(b, *comm, step);
          for (size_t i = 0; i < a.size(); ++i) {
            SCOPED_TRACE(kind + yaml + " ranks " + std::to_string(n) + " step " + std::to_string(step) + " tensor " +
                         std::to_string(i));
            EXPECT_TRUE(torch::equal(a[i], b[i]));
            const auto ea = loops->error(i), eb = tensors->error(i);
            ASSERT_EQ(ea.defined(), eb.defined());
            if (ea.defined()) {
              EXPECT_TRUE(torch::equal(ea, eb));
            }
          }
        }
      }
    });
  }
}

// signsgd's tensor form against the raw loops: the same signs everywhere; the scale ‖c‖₁/N is summed in
// another order (double, then rounded to fp32), so outputs and EF agree to fp32 rounding, not bit for bit.
TEST(SparseReducersTensorForm, SignsgdEqualsTheRawLoopsUpToTheScalesRounding) {
  for (const int n : {1, 3}) {
    run_ranks(n, [&](const RankContext& ctx) {
      auto comm = ctx.world_group();
      for (const std::string yaml : {"{}", "{error_feedback: false}"}) {
        auto loops = make("signsgd", yaml), tensors = make("signsgd", yaml);
        tensors->use_tensor_form_on_cpu(true);
        for (int64_t step = 0; step < 3; ++step) {
          auto a = make_grads(ctx.rank, step);
          a[0].narrow(0, 0, 2).zero_();  // sign(0) = +1
          auto b = clone_all(a);
          loops->reduce(a, *comm, step);
          tensors->reduce(b, *comm, step);
          for (size_t i = 0; i < a.size(); ++i) {
            SCOPED_TRACE(yaml + " ranks " + std::to_string(n) + " step " + std::to_string(step) + " tensor " +
                         std::to_string(i));
            EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << (a[i] - b[i]).abs().max().item<float>();
            const auto ea = loops->error(i), eb = tensors->error(i);
            ASSERT_EQ(ea.defined(), eb.defined());
            if (ea.defined()) {
              EXPECT_TRUE(torch::allclose(ea, eb, 1e-5, 1e-6));
            }
          }
        }
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, SparseReducers, ::testing::Values(1, 2, 4));

// ---- hand examples on 2 ranks -------------------------------------------------------------------

TEST(TopK, KeepsTheKLargestAndCarriesTheRestByHand) {
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    auto red = make("topk", "{count: 2}");
    auto g0 = ctx.rank == 0 ? torch::tensor({0.5f, -3.0f, 1.0f, 2.0f, 0.0f, 0.125f, -0.25f, 0.75f})
                            : torch::tensor({-4.0f, 0.25f, 3.0f, -1.0f, 0.5f, 0.0f, 0.0f, 1.5f});
    std::vector<torch::Tensor> g{g0.view({2, 4}).clone()};
    red->reduce(g, *comm, 0);
    // Rank 0 sends {1: −3, 3: 2}, rank 1 {0: −4, 2: 3}; mean ÷ 2.
    EXPECT_TRUE(torch::equal(g[0], torch::tensor({-2.0f, -1.5f, 1.5f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f}).view({2, 4})));
    auto ef = ctx.rank == 0 ? torch::tensor({0.5f, 0.0f, 1.0f, 0.0f, 0.0f, 0.125f, -0.25f, 0.75f})
                            : torch::tensor({0.0f, 0.25f, 0.0f, -1.0f, 0.5f, 0.0f, 0.0f, 1.5f});
    EXPECT_TRUE(torch::equal(red->error(0), ef));
    // Zero gradients: the residual alone competes. Rank 0 sends {2: 1, 7: 0.75}, rank 1 {7: 1.5, 3: −1}.
    g = {torch::zeros({2, 4})};
    red->reduce(g, *comm, 1);
    EXPECT_TRUE(torch::equal(g[0], torch::tensor({0.0f, 0.0f, 0.5f, -0.5f, 0.0f, 0.0f, 0.0f, 1.125f}).view({2, 4})));
    ef = ctx.rank == 0 ? torch::tensor({0.5f, 0.0f, 0.0f, 0.0f, 0.0f, 0.125f, -0.25f, 0.0f})
                       : torch::tensor({0.0f, 0.25f, 0.0f, 0.0f, 0.5f, 0.0f, 0.0f, 0.0f});
    EXPECT_TRUE(torch::equal(red->error(0), ef));
    EXPECT_EQ(red->payload_bytes(), 2 * 8);
  });
}

TEST(TopK, TiesGoToTheSmallestIndicesAndTheResidualKeepsTheRest) {
  run_ranks(1, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    auto red = make("topk", "{count: 3}");
    std::vector<torch::Tensor> g{torch::tensor({1.0f, -2.0f, 2.0f, 0.5f, -2.0f, 2.0f, 0.0f, 0.25f})};
    red->reduce(g, *comm, 0);
    EXPECT_TRUE(torch::equal(g[0], torch::tensor({0.0f, -2.0f, 2.0f, 0.0f, -2.0f, 0.0f, 0.0f, 0.0f})));
    EXPECT_TRUE(torch::equal(red->error(0), torch::tensor({1.0f, 0.0f, 0.0f, 0.5f, 0.0f, 2.0f, 0.0f, 0.25f})));
  });
}

TEST(SignSgd, ScaledSignsWithZeroAsPlusByHand) {
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    auto red = make("signsgd");
    std::vector<torch::Tensor> g{ctx.rank == 0 ? torch::tensor({1.0f, -3.0f, 0.0f, 2.0f})
                                               : torch::tensor({-1.0f, -1.0f, 2.0f, 0.0f})};
    red->reduce(g, *comm, 0);
    // Rank 0: scale 6/4 = 1.5, signs + − + +; rank 1: scale 1, signs − − + +.
    EXPECT_TRUE(torch::equal(g[0], torch::tensor({0.25f, -1.25f, 1.25f, 1.25f})));
    EXPECT_TRUE(torch::equal(red->error(0), ctx.rank == 0 ? torch::tensor({-0.5f, -1.5f, -1.5f, 0.5f})
                                                          : torch::tensor({0.0f, 0.0f, 1.0f, -1.0f})));
    g = {torch::zeros({4})};
    red->reduce(g, *comm, 1);
    // Rank 0: c = EF, scale 1, − − − +; rank 1: scale 0.5, + + + −.
    EXPECT_TRUE(torch::equal(g[0], torch::tensor({-0.25f, -0.25f, -0.25f, 0.25f})));
    EXPECT_TRUE(torch::equal(red->error(0), ctx.rank == 0 ? torch::tensor({0.5f, -0.5f, -0.5f, -0.5f})
                                                          : torch::tensor({-0.5f, -0.5f, 0.5f, -0.5f})));
    EXPECT_EQ(red->payload_bytes(), 1 + 4);
  });
}

TEST(Qsgd, ValuesOnTheGridAreReconstructedExactly) {
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    auto red = make("qsgd", "{levels: 5, bucket_size: 4, error_feedback: true, seed: 3}");
    for (int64_t step = 0; step < 4; ++step) {  // whatever the draws
      // Rank 0: bucket (3, 4, 0, 0) norm 5 -> levels 3, 4; a zero bucket. Rank 1: (0, 0, −6, 8)
      // norm 10 -> levels 3, 4; (1, 0, 0, 0) norm 1 -> level 5.
      std::vector<torch::Tensor> g{ctx.rank == 0 ? torch::tensor({3.0f, 4.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f})
                                                 : torch::tensor({0.0f, 0.0f, -6.0f, 8.0f, 1.0f, 0.0f, 0.0f, 0.0f})};
      red->reduce(g, *comm, step);
      EXPECT_TRUE(torch::equal(g[0], torch::tensor({1.5f, 2.0f, -3.0f, 4.0f, 0.5f, 0.0f, 0.0f, 0.0f}))) << g[0];
      EXPECT_TRUE(torch::equal(red->error(0), torch::zeros({8})));
      EXPECT_EQ(red->payload_bytes(), 8 + 2 * 4);
    }
  });
}

TEST(Qsgd, IsUnbiasedAndRandomised) {
  run_ranks(1, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    QsgdOptions o;
    o.levels = 4;
    o.bucket_size = 16;  // ‖bucket‖ ≈ 4: level spacing ≈ 1, per-draw variance ≤ 1/4
    QsgdReducer red(o);
    auto x = randn({256}, 21);
    auto sum = torch::zeros({256});
    const int trials = 400;
    torch::Tensor first;
    for (int t = 0; t < trials; ++t) {
      std::vector<torch::Tensor> g{x.clone()};
      red.reduce(g, *comm, t);
      if (t == 0) first = g[0].clone();
      if (t == 1) {
        EXPECT_FALSE(torch::equal(g[0], first));  // a new draw every step
      }
      sum += g[0];
    }
    auto err = sum / trials - x;  // σ of each entry ≤ 0.5/√400 = 0.025
    EXPECT_LT(err.abs().max().item<float>(), 0.2);
    EXPECT_LT(std::abs(err.mean().item<float>()), 0.01);  // σ ≤ 0.025/16
  });
}

// ---- raw path, state, failures ------------------------------------------------------------------

TEST(ElementwiseReducer, TensorsGoRawExactlyWhenCompressionSavesNoBytes) {
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    const uint64_t s = 100 * ctx.rank;
    auto grads = [&] { return std::vector<torch::Tensor>{randn({1}, s + 1), randn({2}, s + 2), randn({3}, s + 3), randn({64}, s + 4)}; };
    // compressed? per tensor (N = 1, 2, 3, 64)
    const std::vector<std::pair<std::string, std::vector<bool>>> cases{
        {"topk", {false, false, true, true}},               // 8k ≥ 4N iff 2k ≥ N (k = 1)
        {"randomk", {false, true, true, true}},             // k = 1 ≥ N only for N = 1
        {"randomk", {false, false, false, true}},           // with count 3: k ≥ N for N ≤ 3
        {"qsgd", {false, true, true, true}},                // N + 4 ≥ 4N iff N = 1 (one bucket)
        {"signsgd", {false, true, true, true}},             // 5 ≥ 4N iff N = 1
        {"signsgd", {false, false, false, false}},          // min_numel 65
    };
    for (size_t c = 0; c < cases.size(); ++c) {
      const auto& [kind, expect] = cases[c];
      const std::string yaml = c == 2 ? "{count: 3}" : c == 5 ? "{min_numel: 65}" : "{}";
      auto red = make(kind, yaml);
      auto g = grads();
      auto in = clone_all(g);
      red->reduce(g, *comm, 0);
      for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_EQ(red->records()[i].compressed, expect[i]) << kind << " " << yaml << " tensor " << i;
        if (expect[i]) continue;
        EXPECT_EQ(red->records()[i].sent_bytes, in[i].numel() * 4);
        EXPECT_FALSE(red->error(i).defined());
        auto all = gather_rows(*comm, in[i]);
        EXPECT_TRUE(torch::equal(g[i], (all[0] + all[1]).div(2).view_as(g[i])));  // exact mean (2 ranks)
      }
      testing::expect_identical_on_all_ranks(*comm, g);
    }
  });
}

TEST(ElementwiseReducer, SaveLoadContinuesBitIdentically) {
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    for (std::string kind : {"topk", "randomk", "qsgd", "signsgd"}) {
      const std::string yaml = kind == "qsgd" ? "{error_feedback: true, seed: 5}" : "{}";
      auto a = make(kind, yaml);
      for (int64_t step = 0; step < 2; ++step) {
        auto g = make_grads(ctx.rank, step);
        a->reduce(g, *comm, step);
      }
      std::stringstream blob;
      {
        torch::serialize::OutputArchive out;
        a->save(out);
        out.save_to(blob);
      }
      auto b = make(kind, yaml), fresh = make(kind, yaml);
      torch::serialize::InputArchive in;
      in.load_from(blob);
      b->load(in);
      auto ga = make_grads(ctx.rank, 2), gb = clone_all(ga), gf = clone_all(ga);
      a->reduce(ga, *comm, 2);
      b->reduce(gb, *comm, 2);
      fresh->reduce(gf, *comm, 2);
      for (size_t i = 0; i < ga.size(); ++i) {
        EXPECT_TRUE(torch::equal(ga[i], gb[i])) << kind << " tensor " << i;
        EXPECT_TRUE(torch::equal(a->error(i), b->error(i))) << kind << " tensor " << i;
      }
      EXPECT_FALSE(torch::equal(ga[3], gf[3])) << kind << ": the state should matter";
      // Another reducer's checkpoint is refused.
      auto other = make(kind == "topk" ? "signsgd" : "topk");
      blob.clear();
      blob.seekg(0);
      torch::serialize::InputArchive in2;
      in2.load_from(blob);
      EXPECT_THROW(other->load(in2), std::invalid_argument) << kind;
    }
  });
}

TEST(ElementwiseReducer, NonFiniteOnOneRankSkipsOnAllRanksLeavingStateUntouched) {
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    for (std::string kind : {"topk", "randomk", "qsgd", "signsgd"}) {
      auto red = make(kind, kind == "qsgd" ? "{error_feedback: true}" : "{}");
      auto g = make_grads(ctx.rank, 0);
      red->reduce(g, *comm, 0);
      auto ef = red->error(3).clone();
      auto bad = make_grads(ctx.rank, 1);
      if (ctx.rank == 1) bad[3][5][7] = std::numeric_limits<float>::quiet_NaN();
      auto before = clone_all(bad);
      EXPECT_THROW(red->reduce(bad, *comm, 1), NonFiniteGradients) << kind;
      EXPECT_TRUE(torch::equal(red->error(3), ef)) << kind;
      for (size_t i = 0; i < bad.size(); ++i) EXPECT_TRUE(torch::equal(bad[i].nan_to_num(), before[i].nan_to_num()));
    }
  });
}

TEST(ElementwiseReducer, ChangedGradientShapeAgainstSavedResidualThrows) {
  run_ranks(1, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    auto red = make("topk");
    std::vector<torch::Tensor> g{randn({64}, 1)};
    red->reduce(g, *comm, 0);
    g = {randn({128}, 2)};
    EXPECT_THROW(red->reduce(g, *comm, 1), std::invalid_argument);
  });
}

// ---- options and registry -----------------------------------------------------------------------

void expect_invalid(const std::string& kind, const std::string& yaml, const std::vector<std::string>& words) {
  try {
    make(kind, yaml);
    ADD_FAILURE() << kind << " " << yaml << ": no throw";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
  }
}

TEST(SparseReducerOptions, BadKeysTypesAndValuesThrowNamingTheKey) {
  expect_invalid("topk", "{fracton: 0.1}", {"topk", "unknown option 'fracton'", "fraction, count"});
  expect_invalid("randomk", "{rank: 4}", {"randomk", "'rank'", "seed"});
  expect_invalid("qsgd", "{level: 4}", {"qsgd", "'level'", "levels, bucket_size"});
  expect_invalid("signsgd", "{fraction: 0.1}", {"signsgd", "'fraction'", "error_feedback, min_numel"});
  expect_invalid("topk", "{fraction: 0}", {"topk", "'fraction'", "(0, 1]", "0"});
  expect_invalid("topk", "{fraction: 1.5}", {"topk", "'fraction'", "1.5"});
  expect_invalid("randomk", "{fraction: 0.1, count: 3}", {"randomk", "'fraction'", "'count'"});
  expect_invalid("randomk", "{count: -1}", {"randomk", "'count'", "-1"});
  expect_invalid("topk", "{count: many}", {"topk", "'count'", "integer", "many"});
  expect_invalid("topk", "{min_numel: -5}", {"topk", "'min_numel'", "-5"});
  expect_invalid("qsgd", "{levels: 128}", {"qsgd", "'levels'", "[1, 127]", "128"});
  expect_invalid("qsgd", "{levels: 0}", {"qsgd", "'levels'", "0"});
  expect_invalid("qsgd", "{bucket_size: 0}", {"qsgd", "'bucket_size'", ">= 1"});
  expect_invalid("qsgd", "{seed: x}", {"qsgd", "'seed'", "integer"});
  expect_invalid("signsgd", "{error_feedback: maybe}", {"signsgd", "'error_feedback'", "bool"});
  expect_invalid("signsgd", "[1, 2]", {"signsgd", "must be a map"});
  TopKOptions bad;
  bad.fraction = 2;
  EXPECT_THROW(TopKReducer{bad}, std::invalid_argument);  // the struct path checks too
}

TEST(SparseReducerOptions, DefaultsAndNames) {
  EXPECT_EQ(make("topk")->name(), "topk(fraction=0.01, error_feedback=true, min_numel=0)");
  EXPECT_EQ(make("topk", "{count: 7, error_feedback: false}")->name(), "topk(count=7, error_feedback=false, min_numel=0)");
  EXPECT_EQ(make("randomk")->name(), "randomk(fraction=0.01, error_feedback=true, min_numel=0, seed=0)");
  EXPECT_EQ(make("qsgd")->name(), "qsgd(levels=16, bucket_size=512, error_feedback=false, min_numel=0, seed=0)");
  EXPECT_EQ(make("signsgd")->name(), "signsgd(error_feedback=true, min_numel=0)");
  TopKReducer t(TopKOptions{});
  EXPECT_EQ(t.k_for(1), 1);
  EXPECT_EQ(t.k_for(149), 1);
  EXPECT_EQ(t.k_for(150), 2);  // round half away from zero
  EXPECT_EQ(t.k_for(100000), 1000);
  TopKOptions c;
  c.count = 10;
  EXPECT_EQ(TopKReducer(c).k_for(4), 4);
  EXPECT_EQ(TopKReducer(c).k_for(1000), 10);
}

TEST(SparseReducerOptions, RegistryListsTheNewReducers) {
  Registry<GradReducer> reg;
  register_builtin_grad_reducers(reg);
  EXPECT_EQ(reg.names(), (std::vector<std::string>{"bf16", "fp16", "none", "powersgd", "qsgd", "randomk", "signsgd",
                                                   "topk"}));
  EXPECT_NE(reg.help("topk").find("fraction, count, error_feedback, min_numel"), std::string::npos);
  EXPECT_NE(reg.help("randomk").find("seed"), std::string::npos);
  EXPECT_NE(reg.help("qsgd").find("levels, bucket_size"), std::string::npos);
  EXPECT_NE(reg.help("signsgd").find("error_feedback, min_numel"), std::string::npos);
}

}  // namespace
}  // namespace optcc

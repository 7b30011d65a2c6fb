// Pipeline runner and StageLink on Gloo, ranks as threads: a toy chain of tanh layers split over
// stages must give the single-process loss and gradients for 1F1B, GPipe, ZB-H1 (its weight
// gradients deferred to W) and interleaved 1F1B, with and without
// scatter-gather, for m below and above the stage count (BR-12); bytes follow stage_link.h's rule;
// asymmetric payloads keep their shapes (BR-11); a stage that skips its step ends in a named error.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "harness/parallel/layout.h"
#include "harness/parallel/pipeline_runner.h"
#include "kernels/gemm.h"
#include "tests/support/gloo_ranks.h"

namespace optcc {
namespace {

using ::testing::HasSubstr;
using testing::RankContext;
using testing::run_ranks;

constexpr int64_t kS = 8, kB = 2;                        // sequence, micro-batch size
const std::vector<int64_t> kWidths{16, 16, 16, 16, 16};  // L = 4 layers, h = 16 throughout

// The toy model and its data, built once on the main thread from a fixed seed; read-only in ranks.
struct Toy {
  int m = 1;                                // micro-batches
  std::vector<int64_t> widths;              // [L+1]: layer l maps widths[l] -> widths[l+1]
  std::vector<torch::Tensor> w, bias;       // [L] x [h_l, h_l+1], [h_l+1]
  torch::Tensor alpha;                      // [] learnable scale of the "embedding"
  std::vector<torch::Tensor> data, target;  // [m] x [s, b, h_0], [s, b, h_L]
  int layers() const { return static_cast<int>(widths.size()) - 1; }
};

Toy make_toy(int m, std::vector<int64_t> widths) {
  torch::manual_seed(1234);
  Toy t;
  t.m = m;
  t.widths = std::move(widths);
  for (int l = 0; l < t.layers(); ++l) {
    t.w.push_back(torch::randn({t.widths[l], t.widths[l + 1]}) / std::sqrt(double(t.widths[l])));
    t.bias.push_back(0.1 * torch::randn({t.widths[l + 1]}));
  }
  t.alpha = torch::tensor(0.9f);
  for (int i = 0; i < m; ++i) {
    t.data.push_back(torch::randn({kS, kB, t.widths.front()}));
    t.target.push_back(0.5 * torch::randn({kS, kB, t.widths.back()}));
  }
  return t;
}

// Layers of the chain on stage `stage` of `stages` with `chunks` model chunks: chunk c holds virtual
// stage j = c * stages + stage, layers [j L / (stages chunks), (j + 1) L / (stages chunks)) (one
// chunk: [first, last) of an even split). Stage 0 owns the embedding (alpha * data[mb], run by its
// chunk 0), the last stage the loss mean((y - target[mb])^2) / m (after its last chunk).
class ToyStage : public StageFunctions {
 public:
  ToyStage(const Toy& toy, int stage, int stages, int chunks = 1)
      : toy_(toy), embed_(stage == 0), loss_(stage == stages - 1) {
    auto own = [&](const std::string& name, const torch::Tensor& t) {
      params_[name] = t.clone().requires_grad_(true);
    };
    if (embed_) own("alpha", toy.alpha);
    const int virtual_stages = stages * chunks;
    for (int c = 0; c < chunks; ++c) {
      const int j = c * stages + stage;
      chunk_layers_.push_back({j * toy.layers() / virtual_stages, (j + 1) * toy.layers() / virtual_stages});
      for (int l = chunk_layers_.back().first; l < chunk_layers_.back().second; ++l) {
        own(fmt::format("w{}", l), toy.w[l]);
        own(fmt::format("b{}", l), toy.bias[l]);
      }
    }
  }

  torch::Tensor forward(int mb, int chunk, const torch::Tensor& input) override {
    const bool embeds = embed_ && chunk == 0;
    const bool heads = loss_ && chunk == static_cast<int>(chunk_layers_.size()) - 1;
    torch::Tensor x = embeds ? params_["alpha"] * toy_.data[mb] : input;  // [s, b, h_first]
    const auto [first, last] = chunk_layers_.at(chunk);
    for (int l = first; l < last; ++l) {  // x·w + b through gemm_linear, whose W ZB-H1 defers
      x = torch::tanh(gemm_linear(x, params_[fmt::format("w{}", l)].t(), params_[fmt::format("b{}", l)]));
    }
    if (!heads) return x;  // [s, b, h_last]
    return (x - toy_.target[mb]).pow(2).mean() / toy_.m;
  }

  StageLinkShapes shapes() const {  // of chunk 0 (interleaved toys have one width throughout)
    return {{kS, kB, toy_.widths[chunk_layers_[0].first]}, {kS, kB, toy_.widths[chunk_layers_[0].second]}};
  }
  std::map<std::string, torch::Tensor> grads() const {
    std::map<std::string, torch::Tensor> g;
    for (const auto& [name, p] : params_) g[name] = p.grad();
    return g;
  }

 private:
  const Toy& toy_;
  bool embed_, loss_;
  std::vector<std::pair<int, int>> chunk_layers_;  // [chunks] of [first, last) layers
  std::map<std::string, torch::Tensor> params_;
};

struct Reference {
  double loss = 0;
  std::map<std::string, torch::Tensor> grads;
};

Reference reference(const Toy& toy) {  // the whole chain in one process, summed over micro-batches
  ToyStage all(toy, 0, 1);
  Reference r;
  for (int mb = 0; mb < toy.m; ++mb) {
    torch::Tensor loss = all.forward(mb, 0, {});
    r.loss += loss.item<double>();
    loss.backward();
  }
  r.grads = all.grads();
  return r;
}

struct RankOutcome {
  int stage = 0, tp = 0;
  PipelineStepResult step;
  std::map<std::string, torch::Tensor> grads;
  TrafficMeter meter;
};

using CodecFactory = std::function<std::shared_ptr<MessageCodec>(int stage, int tp)>;

// One step of `schedule` with DP = 1: pipeline groups inter-node, TP groups intra-node, one meter.
std::vector<RankOutcome> run_toy(const Toy& toy, int stages, int tp, const std::string& schedule,
                                 CodecFactory codec = {}, int chunks = 1) {
  const RankLayout layout({tp, stages, 1}, tp);
  std::vector<RankOutcome> out(layout.world());
  run_ranks(layout.world(), [&](const RankContext& ctx) {
    RankOutcome& me = out[ctx.rank];
    const RankCoord c = layout.coord(ctx.rank);
    me.stage = c.pp;
    me.tp = c.tp;
    auto pp = ctx.group(layout.pp_group(ctx.rank), fmt::format("pp_tp{}", c.tp), &me.meter,
                        Link::kInterNode);
    auto tpg = ctx.group(layout.tp_group(ctx.rank), fmt::format("tp_pp{}", c.pp), &me.meter,
                         Link::kIntraNode);
    ToyStage fn(toy, c.pp, stages, chunks);
    StageLink link(*pp, tpg.get(), fn.shapes(), torch::kFloat, codec ? codec(c.pp, c.tp) : nullptr, chunks);
    me.step = run_pipeline_step(*make_schedule(schedule, chunks), fn, link, toy.m);
    me.grads = fn.grads();
  });
  return out;
}

void expect_matches_reference(const std::vector<RankOutcome>& ranks, const Reference& ref,
                              int stages, int m) {
  for (const RankOutcome& r : ranks) {
    SCOPED_TRACE(fmt::format("stage {} tp {}", r.stage, r.tp));
    if (r.stage == stages - 1) {
      EXPECT_NEAR(r.step.loss, ref.loss, 1e-6);
      EXPECT_EQ(r.step.microbatch_losses.size(), size_t(m));
    } else {
      EXPECT_EQ(r.step.loss, 0.0);
    }
    ASSERT_FALSE(r.grads.empty());
    for (const auto& [name, g] : r.grads) {
      ASSERT_TRUE(g.defined()) << name;
      EXPECT_LT((g - ref.grads.at(name)).abs().max().item<double>(), 1e-5) << name;
    }
  }
}

// ---- 1F1B / GPipe vs. the single-process reference ----

using Case = std::tuple<std::pair<int, int>, int, std::string>;  // (stages, tp), m, schedule

class PipelineVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineVsReference, LossGradientsAndBytes) {
  const auto [dims, m, schedule] = GetParam();
  const auto [stages, tp] = dims;
  const Toy toy = make_toy(m, kWidths);
  const std::vector<RankOutcome> ranks = run_toy(toy, stages, tp, schedule);
  expect_matches_reference(ranks, reference(toy), stages, m);
  // ZB-H1's W ran every layer's weight GEMM of every micro-batch (deferred from B); nothing else defers.
  for (const RankOutcome& r : ranks) {
    const int64_t layers = 4 / stages;  // gemm_linear calls per micro-batch on this stage
    EXPECT_EQ(r.step.deferred_weight_grads, schedule == "zb_h1" ? m * layers : 0) << "stage " << r.stage;
    EXPECT_EQ(r.step.deferred_peak_bytes > 0, schedule == "zb_h1") << "stage " << r.stage;
    EXPECT_GT(r.step.compute_seconds, 0.0);  // part of the step, the rest in calls
    EXPECT_LE(r.step.compute_seconds, r.step.seconds);
  }

  // stage_link.h: slice N/t*4 bytes per message on the pipeline link (inter); the receiver's
  // all-gather (t-1)*N/t*4 on the TP link (intra), under the same class.
  const int64_t slice = kS * kB * 16 * 4 / tp, gather = (tp - 1) * slice;
  for (const RankOutcome& r : ranks) {
    SCOPED_TRACE(fmt::format("stage {} tp {}", r.stage, r.tp));
    const bool first = r.stage == 0, last = r.stage == stages - 1;
    EXPECT_EQ(r.meter.at(Traffic::kPipelineForward, Link::kInterNode).bytes, last ? 0 : m * slice);
    EXPECT_EQ(r.meter.at(Traffic::kPipelineForward, Link::kIntraNode).bytes,
              first ? 0 : m * gather);
    EXPECT_EQ(r.meter.at(Traffic::kPipelineBackward, Link::kInterNode).bytes,
              first ? 0 : m * slice);
    EXPECT_EQ(r.meter.at(Traffic::kPipelineBackward, Link::kIntraNode).bytes,
              last ? 0 : m * gather);
    EXPECT_EQ(r.meter.at(Traffic::kTensorParallel, Link::kIntraNode).bytes, 0);
    // p2p_bytes: the sends alone (the pipeline link here), never the all-gather.
    for (Traffic c : {Traffic::kPipelineForward, Traffic::kPipelineBackward}) {
      EXPECT_EQ(r.meter.at(c, Link::kInterNode).p2p_bytes, r.meter.at(c, Link::kInterNode).bytes);
      EXPECT_EQ(r.meter.at(c, Link::kIntraNode).p2p_bytes, 0);
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto& [dims, m, schedule] = info.param;
  return fmt::format("pp{}_tp{}_m{}_{}", dims.first, dims.second, m, schedule);
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineVsReference,
                         ::testing::Combine(::testing::Values(std::make_pair(2, 1),
                                                              std::make_pair(4, 1),
                                                              std::make_pair(2, 2)),
                                            ::testing::Values(1, 2, 3, 8),
                                            ::testing::Values("1f1b", "gpipe", "zb_h1")),
                         case_name);

// ---- Interleaved 1F1B (v model chunks per stage) vs. the single-process reference ----

using InterleavedCase = std::tuple<std::pair<int, int>, int, int>;  // (stages, tp), m, chunks

class InterleavedVsReference : public ::testing::TestWithParam<InterleavedCase> {};

// L = 8 layers of width 16: every virtual stage holds 8 / (p v) of them. Every (chunk, micro-batch)
// crosses one boundary each way, around the ring: stage 0 receives no activation for its chunk 0
// and sends it no gradient; the last stage sends no activation from its last chunk.
TEST_P(InterleavedVsReference, LossGradientsAndBytes) {
  const auto [dims, m, v] = GetParam();
  const auto [stages, tp] = dims;
  const Toy toy = make_toy(m, std::vector<int64_t>(9, 16));
  const std::vector<RankOutcome> ranks = run_toy(toy, stages, tp, "interleaved_1f1b", {}, v);
  expect_matches_reference(ranks, reference(toy), stages, m);
  const int64_t slice = kS * kB * 16 * 4 / tp, gather = (tp - 1) * slice;
  for (const RankOutcome& r : ranks) {
    SCOPED_TRACE(fmt::format("stage {} tp {}", r.stage, r.tp));
    const int64_t first = r.stage == 0, last = r.stage == stages - 1;
    EXPECT_EQ(r.meter.at(Traffic::kPipelineForward, Link::kInterNode).bytes, m * (v - last) * slice);
    EXPECT_EQ(r.meter.at(Traffic::kPipelineForward, Link::kIntraNode).bytes, m * (v - first) * gather);
    EXPECT_EQ(r.meter.at(Traffic::kPipelineBackward, Link::kInterNode).bytes, m * (v - first) * slice);
    EXPECT_EQ(r.meter.at(Traffic::kPipelineBackward, Link::kIntraNode).bytes, m * (v - last) * gather);
  }
}

std::string interleaved_name(const ::testing::TestParamInfo<InterleavedCase>& info) {
  const auto& [dims, m, v] = info.param;
  return fmt::format("pp{}_tp{}_m{}_v{}", dims.first, dims.second, m, v);
}

INSTANTIATE_TEST_SUITE_P(Chunks, InterleavedVsReference,
                         ::testing::Values(InterleavedCase{{2, 1}, 2, 2}, InterleavedCase{{2, 1}, 4, 2},
                                           InterleavedCase{{2, 2}, 4, 2}, InterleavedCase{{4, 1}, 8, 2},
                                           InterleavedCase{{2, 1}, 4, 4}),
                         interleaved_name);

// ---- StageLink on its own: Megatron vocabulary, scatter-gather values, checks ----

TEST(StageLink, VocabularyDeliversValuesWithAndWithoutScatterGather) {
  const RankLayout layout({2, 2, 1}, 2);  // tp 2, pp 2
  run_ranks(4, [&](const RankContext& ctx) {
    const RankCoord c = layout.coord(ctx.rank);
    TrafficMeter meter;
    auto pp =
        ctx.group(layout.pp_group(ctx.rank), fmt::format("pp{}", c.tp), &meter, Link::kInterNode);
    auto tpg = ctx.group(layout.tp_group(ctx.rank), fmt::format("tp{}", c.pp), &meter);
    // N = 256: scatter-gather (t | N); N = 15: whole tensors.
    for (std::vector<int64_t> shape : {std::vector<int64_t>{kS, kB, 16}, {3, 1, 5}}) {
      StageLink link(*pp, tpg.get(), {shape, shape});
      EXPECT_EQ(link.scatter_gather(shape), shape[0] == kS);
      const int64_t numel = shape[0] * shape[1] * shape[2];
      const auto value = [&](int mb) {
        return torch::arange(numel, torch::kFloat).view(shape) + 100 * mb;
      };
      if (link.is_first_stage()) {
        EXPECT_THROW(link.send_forward(torch::zeros({2, 2}), 0), std::invalid_argument);
        EXPECT_FALSE(link.recv_forward(0).defined());
        // Refused before anything is posted: a peer that is not the next virtual stage, a chunk
        // this one-chunk link does not have, a receive from before the first virtual stage.
        const auto refusal = [&](P2PMessage m) {
          try {
            link.execute({{m}, PipePhase::kWarmup, false}, {m.dir == P2PDir::kSendForward ? value(0) : torch::Tensor()});
          } catch (const std::invalid_argument& e) {
            return std::string(e.what());
          }
          return std::string("accepted");
        };
        EXPECT_THAT(refusal({P2PDir::kSendForward, 0, 0}), HasSubstr("the peer must be stage 1 (chunk 0)"));
        EXPECT_THAT(refusal({P2PDir::kSendForward, 0, 1, 1, 1}), HasSubstr("no virtual stage at that end"));
        EXPECT_THAT(refusal({P2PDir::kRecvForward, 0, 1}), HasSubstr("no virtual stage at that end"));
        link.send_forward(value(0), 0);
        torch::Tensor g0 = link.send_forward_recv_backward(value(1), 1, 0);
        EXPECT_TRUE(torch::equal(g0, -value(0)));
        EXPECT_FALSE(g0.requires_grad());
        EXPECT_TRUE(torch::equal(link.recv_backward(1), -value(1)));
      } else {
        torch::Tensor x0 = link.recv_forward(0);
        EXPECT_TRUE(torch::equal(x0.detach(), value(0)));
        EXPECT_TRUE(x0.is_leaf() && x0.requires_grad());
        torch::Tensor x1 = link.send_backward_recv_forward(-x0.detach(), 0, 1);
        EXPECT_EQ(x1.sizes(), at::IntArrayRef(shape));
        EXPECT_TRUE(torch::equal(x1.detach(), value(1)));
        link.send_backward(-x1.detach(), 1);
      }
    }
    // Sent: 2 messages of N = 256 as 128-element slices, then 2 of N = 15 whole (fp32).
    const Traffic sent = c.pp == 0 ? Traffic::kPipelineForward : Traffic::kPipelineBackward;
    EXPECT_EQ(meter.at(sent, Link::kInterNode).bytes, 2 * 128 * 4 + 2 * 15 * 4);
  });
}

// ---- BR-11: asymmetric payloads in bidirectional exchanges, h changing with the stage ----

// Lossless stand-in for CB's P/Q: a backward slice [L] travels as two tensors [L/8, 2] and
// [L/4, 3] (the second scaled by 2 on the wire); forward messages pass unchanged. Records the
// (micro-batch, flush) of every backward message it encodes or decodes.
class SplitCodec : public IdentityCodec {
 public:
  std::vector<std::pair<int, bool>> encoded, decoded;
  std::vector<std::vector<int64_t>> wire_shapes(const P2PMessage& msg, const P2PCall& call,
                                                int64_t n) const override {
    if (forward(msg)) return IdentityCodec::wire_shapes(msg, call, n);
    return {{n / 8, 2}, {n / 4, 3}};
  }
  std::vector<torch::Tensor> encode(const P2PMessage& msg, const P2PCall& call,
                                    const torch::Tensor& s) override {
    if (forward(msg)) return {s};
    encoded.emplace_back(msg.microbatch, call.flush);
    const int64_t n = s.numel();
    return {s.narrow(0, 0, n / 4).reshape({n / 8, 2}),
            2 * s.narrow(0, n / 4, 3 * n / 4).reshape({n / 4, 3})};
  }
  torch::Tensor decode(const P2PMessage& msg, const P2PCall& call,
                       const std::vector<torch::Tensor>& w, int64_t n) override {
    if (forward(msg)) return w.at(0);
    decoded.emplace_back(msg.microbatch, call.flush);
    return torch::cat({w.at(0).view({-1}), w.at(1).view({-1}) / 2});
  }

 private:
  static bool forward(const P2PMessage& m) {
    return m.dir == P2PDir::kSendForward || m.dir == P2PDir::kRecvForward;
  }
};

TEST(PipelineMixedShapes, TwoTensorGradientsAndChangingWidthArriveIntact) {
  for (auto [stages, tp] : {std::pair{2, 2}, std::pair{4, 1}}) {
    SCOPED_TRACE(fmt::format("pp {} tp {}", stages, tp));
    const Toy toy = make_toy(3, {16, 12, 20, 8, 24});  // boundaries [8, 2, 20] (pp 2) or 12/20/8
    std::mutex mu;
    std::map<std::pair<int, int>, std::shared_ptr<SplitCodec>> codecs;  // (stage, tp) -> codec
    const auto ranks = run_toy(toy, stages, tp, "1f1b", [&](int stage, int tp_rank) {
      std::lock_guard<std::mutex> lock(mu);
      return codecs[{stage, tp_rank}] = std::make_shared<SplitCodec>();
    });
    expect_matches_reference(ranks, reference(toy), stages, toy.m);
    for (int k = 1; k < stages; ++k) {  // both ends of every gradient agree on mb and flush
      for (int t = 0; t < tp; ++t) {
        const SplitCodec& sender = *codecs[{k, t}];
        const SplitCodec& receiver = *codecs[{k - 1, t}];
        EXPECT_EQ(sender.encoded.size(), size_t(toy.m));
        EXPECT_EQ(sender.encoded, receiver.decoded) << "stage " << k;
      }
    }
  }
}

// ---- A stage that skips its step: a named CommError within the timeout, no hang ----

TEST(PipelineFailure, SkippedStageEndsInNamedTimeout) {
  const Toy toy = make_toy(2, kWidths);
  std::atomic<bool> done{false};
  std::string message;
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(
      2,
      [&](const RankContext& ctx) {
        auto pp = ctx.group({0, 1}, "pp");
        if (ctx.rank == 0) {  // joins the group, then never runs its step
          while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        ToyStage fn(toy, 1, 2);
        StageLink link(*pp, nullptr, fn.shapes());
        try {
          run_pipeline_step(OneFOneBSchedule(), fn, link, toy.m);
        } catch (const CommError& e) {
          message = e.what();
        }
        done = true;
      },
      std::chrono::milliseconds(2000));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_THAT(message, HasSubstr("pipeline stage 1 of 2, call {rf0}"));
  EXPECT_THAT(message, HasSubstr("recv_forward mb 0 from stage 0"));
  EXPECT_THAT(message, HasSubstr("recv from group rank 0"));
  EXPECT_THAT(message, HasSubstr("failed"));
  EXPECT_LT(seconds, 8.0);
}

}  // namespace
}  // namespace optcc

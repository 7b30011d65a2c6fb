// Compressors' own plans (compression/comm_plan.h) against what they do:
//   - every registered DP reducer (default options, plus the option variants that change what is
//     sent or kept, plus every scheme's compression.dp), on 2 and 3 Gloo ranks, at a warm-up step and
//     after it: the DP bytes and calls the Communicator meters equal the plan's collectives, the
//     payload equals the plan's tensor bytes, and the error-feedback and factor bytes held after
//     the call equal the plan's state bytes. A reducer added to the registry is covered without an
//     edit here (its plan is a pure virtual of GradReducer, so it cannot be added without one);
//   - the uncompressed 16-bit wire of parallel.grad_reduce_dtype: compute (make_dp_reducer);
//   - every registered pipeline codec: payload bytes and state bytes as it declares them;
//   - every LEP mode x both backward phases x every stage, and every scheme with a backward codec:
//     a PipelineCodec driven through the stage's 1F1B calls holds and sends exactly what the traffic
//     model says (compressed sends, wire bytes, the LEP buffers' peak bytes).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "compression/act_codec.h"
#include "compression/grad_reducer.h"
#include "harness/parallel/link_emulator.h"
#include "harness/parallel/schedule.h"
#include "harness/perfmodel/traffic_estimate.h"
#include "harness/train/grad_sync.h"
#include "compression/pipeline_codec.h"
#include "tests/support/gloo_ranks.h"

namespace optcc {
namespace {

using testing::RankContext;
using testing::run_ranks;

// A stage's gradient list in miniature: matrices PowerSGD compresses and keeps raw (by its rate rule),
// 1-D tensors, a 3-D tensor, a tensor below a min_numel of 64, a tensor the element-wise reducers send
// raw because their payload would not be smaller.
// An empty tensor too: raw everywhere, so it alone makes the element-wise reducers' raw all-reduce.
const std::vector<std::vector<int64_t>> kShapes = {{48, 16}, {16}, {3, 64}, {1000}, {8, 8, 4}, {2, 2}, {96, 40}, {5}, {0}};

int64_t wire_bytes(const std::vector<CommStep>& steps, int n) {
  int64_t sum = 0;
  for (const auto& s : steps) sum += s.compute ? 0 : LinkEmulator::ring_send_bytes(s.kind, s.bytes, n);
  return sum;
}

struct Case {
  std::string label;
  std::function<std::unique_ptr<GradReducer>()> make;
};

std::vector<Case> reducer_cases() {
  Registry<GradReducer> registry;
  register_builtin_grad_reducers(registry);
  std::vector<Case> cases;
  auto add = [&](const std::string& name, const std::string& yaml) {
    cases.push_back({name + " " + yaml, [name, yaml] {
                       Registry<GradReducer> r;
                       register_builtin_grad_reducers(r);
                       return r.create(name, yaml.empty() ? YAML::Node() : YAML::Load(yaml));
                     }});
  };
  for (const auto& name : registry.names()) add(name, "");  // every registered reducer, defaults
  add("powersgd", "{rank: 2, warmup_steps: 3}");
  add("powersgd", "{rank: 8, error_feedback: false, warm_start: false}");
  add("powersgd", "{rank: 4, min_compression_rate: 0}");
  add("powersgd", "{rank: 4, ef_residual: local, orthogonalize: qr}");
  add("topk", "{fraction: 0.05, min_numel: 64}");
  add("topk", "{count: 3, error_feedback: false}");
  add("randomk", "{fraction: 0.1, min_numel: 64}");
  add("qsgd", "{levels: 4, bucket_size: 64, error_feedback: true}");
  add("qsgd", "{levels: 7, bucket_size: 64, bits: 4}");
  add("signsgd", "{error_feedback: false, min_numel: 10}");
  for (const auto& scheme : compression_scheme_names()) {  // each scheme's own DP reducer
    CompressionConfig k;
    apply_compression_scheme(k, scheme);
    if (k.dp.name == "none") continue;
    const CompressorSpec spec = k.dp;
    cases.push_back({"scheme " + scheme + ": " + to_yaml_value(spec), [spec] {
                       Registry<GradReducer> r;
                       register_builtin_grad_reducers(r);
                       return r.create(spec.name, spec.options);
                     }});
  }
  return cases;
}

class ReducerPlans : public ::testing::TestWithParam<int> {};

TEST_P(ReducerPlans, EqualWhatEveryRegisteredReducerDoes) {
  const int n = GetParam();
  const auto cases = reducer_cases();
  for (const auto& c : cases) {
    for (int64_t step : {0, 5}) {
      run_ranks(n, [&](const RankContext& ctx) {
        TrafficMeter meter;
        auto comm = ctx.world_group(&meter);
        auto reducer = c.make();
        PlanContext pc;
        pc.step = step;
        pc.host_gloo = true;
        pc.group_size = n;
        const ReducerPlan plan = reducer->plan(kShapes, pc);
        std::vector<torch::Tensor> grads;
        for (size_t i = 0; i < kShapes.size(); ++i) {
          grads.push_back(torch::randn(kShapes[i], torch::TensorOptions().dtype(torch::kFloat)) * (ctx.rank + 1));
        }
        reducer->reduce(grads, *comm, step);
        const std::string what = fmt::format("{} at step {} on {} ranks", c.label, step, n);
        const auto& dp = meter.at(Traffic::kDataParallel, Link::kIntraNode);
        EXPECT_EQ(dp.bytes, wire_bytes(plan.steps, n)) << what;
        EXPECT_EQ(dp.calls, collective_count(plan.steps)) << what;
        EXPECT_EQ(reducer->payload_bytes(), collective_bytes(plan.steps)) << what;
        EXPECT_EQ(reducer->error_feedback_bytes(), plan.error_feedback_bytes) << what;
        EXPECT_EQ(reducer->factor_bytes(), plan.factor_bytes) << what;
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ReducerPlans, ::testing::Values(2, 3));

// A collective with nothing to carry is not planned (reduce() does not issue it either: the metered
// calls of EqualWhatEveryRegisteredReducerDoes): every tensor raw under PowerSGD, and an empty tensor
// alone raw under topk.
TEST(ReducerPlans, ACollectiveWithNothingToCarryIsNotPlanned) {
  Registry<GradReducer> registry;
  register_builtin_grad_reducers(registry);
  const auto psgd = registry.create("powersgd", YAML::Load("{rank: 4}"));
  const auto plan = psgd->plan({{16}, {4, 4}}, PlanContext{});  // 4x4 at rank 4: rate 0.5 < 2, raw
  ASSERT_EQ(collective_count(plan.steps), 1);
  EXPECT_EQ(plan.steps[1].what, "raw all-reduce");
  EXPECT_EQ(plan.steps[1].bytes, (16 + 16) * 4);
  EXPECT_EQ(plan.error_feedback_bytes + plan.factor_bytes, 0);
  const auto topk = registry.create("topk", YAML::Load("{fraction: 0.1}"));
  const auto sparse = topk->plan({{0}, {100, 10}}, PlanContext{});
  ASSERT_EQ(collective_count(sparse.steps), 2);  // the compressed all-gather, and the 0-byte raw all-reduce
  EXPECT_EQ(sparse.steps[2].bytes, 0);
  EXPECT_EQ(topk->plan({{100, 10}}, PlanContext{}).steps.size(), 3u);  // encode, all-gather, decode
}

// parallel.grad_reduce_dtype: compute on a bf16 run: the stage's uncompressed reducer pads its 16-bit
// buffer to the group's chunks, and the Communicator meters exactly that.
TEST(ReducerPlans, TheUncompressed16BitWireIsPaddedToTheGroup) {
  Config cfg;
  cfg.train.precision = "bf16";
  cfg.parallel.grad_reduce_dtype = "compute";
  for (int n : {2, 3}) {
    run_ranks(n, [&](const RankContext& ctx) {
      TrafficMeter meter;
      auto comm = ctx.world_group(&meter);
      auto reducer = make_dp_reducer(cfg, /*compresses=*/false);
      PlanContext pc;
      pc.group_size = n;
      const auto plan = reducer->plan(kShapes, pc);
      std::vector<torch::Tensor> grads;
      for (const auto& s : kShapes) grads.push_back(torch::ones(s));
      reducer->reduce(grads, *comm, 0);
      const int64_t numel = total_numel(kShapes);
      ASSERT_EQ(plan.steps.size(), 1u);
      EXPECT_EQ(plan.steps[0].bytes, (numel + n - 1) / n * n * 2);
      EXPECT_EQ(meter.at(Traffic::kDataParallel, Link::kIntraNode).bytes, wire_bytes(plan.steps, n)) << n;
      EXPECT_EQ(meter.at(Traffic::kDataParallel, Link::kIntraNode).calls, collective_count(plan.steps)) << n;
    });
  }
}

// ---- pipeline codecs: payload and state -------------------------------------------------------------

// Every registered codec: the payload an encode hands over has payload_bytes(numel), and the state
// it then holds (state_bytes(), the Fig. 12 P/Q component) is what state_for(numel) declares.
TEST(CodecPlans, PayloadAndStateAreWhatTheCodecDeclares) {
  const int64_t numel = 16 * 12;
  for (const auto& name : act_codec_names()) {
    YAML::Node o(YAML::NodeType::Map);
    if (name == "lowrank" || name == "int8" || name == "int4" || name == "hadamard") o["hidden"] = 16;
    if (name == "hadamard") o["tile"] = 8;
    if (name == "lowrank") o["rank"] = 4;
    if (name == "topk") o["fraction"] = 0.1;
    auto codec = make_act_codec(name, o);
    EXPECT_EQ(codec->state_bytes(), 0) << name;
    const Payload p = codec->encode(torch::randn({numel}));
    int64_t sent = 0;
    for (const auto& part : p.parts) sent += part.numel() * static_cast<int64_t>(part.element_size());
    EXPECT_EQ(sent, codec->payload_bytes(numel)) << name;
    int64_t declared = 0;
    for (const auto& s : codec->state_for(numel)) declared += total_numel({s.shape}) * 4;
    EXPECT_EQ(codec->state_bytes(), declared) << name;
  }
}

// ---- pipeline codec policy: LEP modes, phases, schemes -------------------------------------------

Config pipeline_config(int pp, int64_t micro_batches) {
  Config c;
  c.model.num_layers = 2 * pp;
  c.model.hidden_size = 16;
  c.model.num_heads = 2;
  c.model.seq_len = 8;
  c.model.vocab_size = 64;
  c.parallel.pp = pp;
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 2 * micro_batches;
  return c;
}

struct Measured {
  int64_t compressed = 0, wire = 0, lep_peak = 0;
};

// Stage k's backward sends over two steps of the schedule, through the PipelineCodec the trainer
// builds from `cfg` (the same codec options); what the second step sent, and the LEP peak of both.
Measured drive(const Config& cfg, int k) {
  const auto& comp = cfg.compression;
  auto make = [&](const CompressorSpec& s) { return make_act_codec(s.name, pipeline_codec_options(cfg, s)); };
  PipelineCodec codec(make(comp.pipeline_forward), make(comp.pipeline_backward), comp.pipeline_policy());
  const int p = static_cast<int>(cfg.parallel.pp), m = static_cast<int>(cfg.num_micro_batches());
  const int64_t slice = cfg.model.seq_len * cfg.train.micro_batch_size * cfg.model.hidden_size;
  const auto schedule = make_schedule(cfg.parallel.schedule);
  Measured out;
  for (int iteration = 0; iteration < 2; ++iteration) {
    codec.begin_step();
    codec.reset_stats();
    for (const StageStep& step : communication_plan(*schedule, k, p, m)) {
      for (const auto* calls : {&step.before, &step.after}) {
        for (const P2PCall& call : *calls) {
          for (const P2PMessage& msg : call.messages) {
            if (msg.dir == P2PDir::kSendBackward) codec.encode(msg, call, torch::randn({slice}));
          }
        }
      }
    }
    codec.end_step();
  }
  out.compressed = codec.stats().backward_compressed;
  out.wire = codec.stats().backward_wire_bytes;
  out.lep_peak = codec.lep_peak_bytes();
  return out;
}

void expect_model_equals_codec(const Config& cfg, const std::string& what) {
  const TrafficEstimate e = estimate_traffic(cfg);
  for (int k = 0; k < cfg.parallel.pp; ++k) {
    const Measured got = drive(cfg, k);
    const auto& g = e.stages[k];
    EXPECT_EQ(got.compressed, g.backward_compressed) << what << " stage " << k;
    EXPECT_EQ(got.wire, g.pp_bwd_send) << what << " stage " << k;
    EXPECT_EQ(got.lep_peak, g.lep_bytes) << what << " stage " << k;
  }
}

TEST(PipelinePlans, EveryLepModeAndPhaseHoldsAndSendsWhatTheModelSays) {
  for (int64_t m : {2, 5}) {  // fewer micro-batches than stages, and more
    for (const char* lep : {"off", "lazy", "per_microbatch", "lazy_iteration", "lazy_decay"}) {
      for (const char* phases : {"all", "epilogue"}) {
        Config c = pipeline_config(3, m);
        apply_compression_scheme(c.compression, "cb");
        c.compression.lep = parse_lep_mode(lep);
        c.compression.lep_decay = std::string(lep) == "lazy_decay" ? 0.5 : 1.0;
        c.compression.backward_phases = parse_backward_phases(phases);
        expect_model_equals_codec(c, fmt::format("lep {} phases {} m {}", lep, phases, m));
      }
    }
  }
  // The bug this replaced: the model gave lazy_iteration and lazy_decay no LEP bytes at all.
  Config c = pipeline_config(3, 4);
  apply_compression_scheme(c.compression, "cb");
  c.compression.lep = LepMode::kLazyIteration;
  EXPECT_EQ(estimate_traffic(c).stages[1].lep_bytes, 8 * 2 * 16 * 4);
}

TEST(PipelinePlans, EverySchemeSendsWhatTheModelSays) {
  for (const auto& scheme : compression_scheme_names()) {
    Config c = pipeline_config(3, 4);
    apply_compression_scheme(c.compression, scheme);
    expect_model_equals_codec(c, "scheme " + scheme);
  }
}

}  // namespace
}  // namespace optcc

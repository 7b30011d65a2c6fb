// DiLoCo and Streaming DiLoCo (compression.dp_strategy: diloco, harness/train/outer_sync.h):
//   - the schedule and the fragments in closed form;
//   - the outer step on two replicas against a hand computation (mean of the outer gradients,
//     Nesterov momentum over two rounds); τ = 0, α = 0 equals plain DiLoCo one fragment at a time,
//     bit for bit; fragments landing on their own steps, the delayed and
//     mixed update (τ, α), the tied embedding's copies, plan bytes = metered bytes of `outer`;
//   - training: one replica with outer lr 1 and no momentum = plain training (H 1-3, F 1-2);
//     replicas agree after every sync; evaluation measures the global model and leaves training
//     alone; a resume mid-period and mid-sync continues bit-identically; the config's refusals.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <functional>
#include <map>
#include <optional>

#include "harness/config/config.h"
#include "harness/parallel/distributed.h"
#include "harness/parallel/link_emulator.h"
#include "harness/train/outer_sync.h"
#include "harness/train/trainer.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/small_training.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

TEST(OuterSchedule, SyncPointsAndFragmentsInClosedForm) {
  // F = 1: the end of every period.
  EXPECT_EQ(outer_sync_point(0, 8, 1), 8);
  // F = 4, H = 8: every second step, staggered.
  for (int f = 0; f < 4; ++f) EXPECT_EQ(outer_sync_point(f, 8, 4), 2 * (f + 1));
  // H = 5, F = 2: floor(5/2) = 2, then 5.
  EXPECT_EQ(outer_sync_point(0, 5, 2), 2);
  EXPECT_EQ(outer_sync_point(1, 5, 2), 5);
  // F = H: one fragment per step.
  for (int f = 0; f < 3; ++f) EXPECT_EQ(outer_sync_point(f, 3, 3), f + 1);
  // 6 layers in 3 fragments: two each; 5 layers in 2: floor(l*2/5) = 0,0,0,1,1.
  for (int l = 0; l < 6; ++l) EXPECT_EQ(outer_fragment_of_layer(l, 6, 3), l / 2);
  const int64_t five[] = {0, 0, 0, 1, 1};
  for (int l = 0; l < 5; ++l) EXPECT_EQ(outer_fragment_of_layer(l, 5, 2), five[l]);
}

// What a final evaluation measures (outer_sync.h: the global values last landed).
TEST(OuterSchedule, LastLandedSyncInClosedForm) {
  // DiLoCo, H = 12: a 20-step run evaluates the step-12 sync; 24 steps hold every step; none before 12.
  EXPECT_EQ(outer_last_landed_sync(0, 20, 12, 1, 0), 12);
  EXPECT_EQ(outer_last_landed_sync(0, 24, 12, 1, 0), 24);
  EXPECT_EQ(outer_last_landed_sync(0, 11, 12, 1, 0), 0);
  // τ = 1: the step-24 sync lands after step 25.
  EXPECT_EQ(outer_last_landed_sync(0, 24, 12, 1, 1), 12);
  EXPECT_EQ(outer_last_landed_sync(0, 25, 12, 1, 1), 24);
  // F = 2, H = 12: fragment 0 syncs after steps 6, 18, ...; fragment 1 after 12, 24, ...
  EXPECT_EQ(outer_last_landed_sync(0, 20, 12, 2, 0), 18);
  EXPECT_EQ(outer_last_landed_sync(1, 20, 12, 2, 0), 12);
  EXPECT_EQ(outer_last_landed_sync(0, 5, 12, 2, 0), 0);
  // One step per fragment (F = H = 3) with τ = 2: at step 10, fragment 0 (after 1, 4, 7, 10) landed at 7.
  EXPECT_EQ(outer_last_landed_sync(0, 10, 3, 3, 2), 7);
  EXPECT_EQ(outer_last_landed_sync(2, 10, 3, 3, 2), 6);
}

Config tiny_config() {
  Config c;
  c.model.num_layers = 2;
  c.model.hidden_size = 16;
  c.model.num_heads = 2;
  c.model.seq_len = 8;
  c.model.vocab_size = 32;
  c.model.vocab_divisor = 16;
  c.compression.dp_strategy = "diloco";
  return c;
}

// A deterministic per-parameter direction, the same on every rank: c_i = 0.01 * (arange % 7 - 3).
torch::Tensor direction(const torch::Tensor& p) {
  return (torch::arange(p.numel(), torch::kFloat).remainder(7) - 3).mul(0.01).view(p.sizes());
}

struct Replica {
  std::map<std::string, torch::Tensor> initial;  // θ_0 (the same on every replica)
};

// Sets every parameter of the stage to θ_0 + k c (k per replica).
void set_local(GptModel& model, const std::map<std::string, torch::Tensor>& base, double k) {
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) item.value().copy_(base.at(item.key()) + k * direction(item.value()));
}

std::map<std::string, torch::Tensor> snapshot(GptModel& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

GptModel stage_model(const Config& cfg, int stage) {
  return GptModel(gpt_options(cfg), nullptr, stage_range(cfg, stage));
}

// Two replicas (DP2, one stage): replica r's local weights θ_0 + (r+1) c after each period. The
// mean outer gradient is -1.5 c; with μ = 0.5 Nesterov and outer lr 0.7:
//   round 1: m = -1.5c,               u = -1.5c + 0.5 m = -2.25c,   g1 = θ_0 + 1.575 c
//   round 2 (from g1): m = 0.5 m - 1.5c = -2.25c, u = -1.5c - 1.125c = -2.625c, g2 = g1 + 1.8375 c
// Both replicas land on g exactly as computed here (fp32, tolerance of a few ULP).
TEST(OuterSync, TwoReplicasMatchTheHandComputationOverTwoRounds) {
  Config cfg = tiny_config();
  cfg.parallel.dp = 2;
  cfg.compression.diloco.inner_steps = 3;
  cfg.compression.diloco.outer_lr = 0.7;
  cfg.compression.diloco.outer_momentum = 0.5;
  cfg.compression.diloco.nesterov = true;
  testing::run_layout({1, 1, 2}, [&](int rank, Distributed& d) {
    torch::manual_seed(1);
    GptModel model = stage_model(cfg, 0);
    const auto theta0 = snapshot(model);
    OuterSync outer(cfg, model, d.dp.get(), d.embedding.get());
    const double k = rank + 1.0;
    set_local(model, theta0, k);
    outer.after_step(1);  // not a sync step: nothing moves
    outer.after_step(2);
    for (const auto& item : model->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), theta0.at(item.key()) + k * direction(item.value()))) << item.key();
    }
    outer.after_step(3);
    std::map<std::string, torch::Tensor> g1;
    for (const auto& item : model->named_parameters()) {
      g1[item.key()] = theta0.at(item.key()) + 1.575 * direction(item.value());
      EXPECT_TRUE(torch::allclose(item.value(), g1[item.key()], 1e-6, 1e-7)) << item.key();
    }
    set_local(model, snapshot(model), k);  // round 2 starts from the landed global weights
    outer.after_step(6);
    for (const auto& item : model->named_parameters()) {
      EXPECT_TRUE(torch::allclose(item.value(), g1[item.key()] + 1.8375 * direction(item.value()), 1e-6, 1e-6))
          << item.key();
    }
    // State: backup (every parameter) + momentum (every parameter), fp32.
    int64_t params = 0;
    for (const auto& p : model->parameters()) params += p.numel();
    EXPECT_EQ(outer.state_bytes(), 2 * 4 * params);
  });
}

// Fragments land on their own steps (H = 4, F = 2 on two layers: fragment 0 = embeddings + layer 0
// after steps 2, 6, ...; fragment 1 = layer 1 + final LayerNorm after steps 4, 8, ...); τ = 1 lands
// each one step later, mixed with α = 0.25: θ = 0.25 θ_local + 0.75 g. No momentum, outer lr 1:
// g = θ_0 + 1.5 c (the replicas' mean).
TEST(OuterSync, FragmentsLandOnTheirStepsDelayedAndMixed) {
  Config cfg = tiny_config();
  cfg.parallel.dp = 2;
  cfg.compression.diloco.inner_steps = 4;
  cfg.compression.diloco.fragments = 2;
  cfg.compression.diloco.sync_delay = 1;
  cfg.compression.diloco.mix = 0.25;
  cfg.compression.diloco.outer_lr = 1.0;
  cfg.compression.diloco.outer_momentum = 0.0;
  testing::run_layout({1, 1, 2}, [&](int rank, Distributed& d) {
    torch::manual_seed(1);
    GptModel model = stage_model(cfg, 0);
    const auto theta0 = snapshot(model);
    OuterSync outer(cfg, model, d.dp.get(), d.embedding.get());
    EXPECT_EQ(outer.fragment_of("embedding.weight"), 0);
    EXPECT_EQ(outer.fragment_of("position_embedding"), 0);
    EXPECT_EQ(outer.fragment_of("blocks.0.ln1.weight"), 0);
    EXPECT_EQ(outer.fragment_of("blocks.1.mlp.fc1.weight"), 1);
    EXPECT_EQ(outer.fragment_of("final_ln.weight"), 1);
    const double k = rank + 1.0;
    set_local(model, theta0, k);
    const auto local = snapshot(model);
    outer.after_step(2);  // fragment 0 starts; lands after step 3
    for (const auto& item : model->named_parameters()) EXPECT_TRUE(torch::equal(item.value(), local.at(item.key())));
    set_local(model, theta0, 2 * k);  // the replicas went on training during the delay
    outer.after_step(3);
    for (const auto& item : model->named_parameters()) {
      const auto c = direction(item.value());
      const bool first = outer.fragment_of(item.key()) == 0;
      const torch::Tensor want =
          first ? 0.25 * (theta0.at(item.key()) + 2 * k * c) + 0.75 * (theta0.at(item.key()) + 1.5 * c)
                : theta0.at(item.key()) + 2 * k * c;
      EXPECT_TRUE(torch::allclose(item.value(), want, 1e-6, 1e-7)) << item.key();
    }
    // Fragment 1's outer gradient is taken after step 4 from the weights then: mean 2*1.5 c = 3 c.
    const auto before4 = snapshot(model);
    outer.after_step(4);
    outer.after_step(5);
    for (const auto& item : model->named_parameters()) {
      const auto c = direction(item.value());
      const torch::Tensor want = outer.fragment_of(item.key()) == 1
                                     ? 0.25 * before4.at(item.key()) + 0.75 * (theta0.at(item.key()) + 3 * c)
                                     : before4.at(item.key());
      EXPECT_TRUE(torch::allclose(item.value(), want, 1e-6, 1e-7)) << item.key();
    }
  });
}

// τ = 0, α = 0: Streaming DiLoCo is DiLoCo applied one fragment at a time. Two replicas, H = 4,
// Nesterov momentum, over two rounds: F = 2 lands fragment 0 at once after step 2 and fragment 1
// after step 4; each fragment then holds bit for bit what plain DiLoCo (F = 1, the whole model after
// step 4) computes from the same local weights, and the momentum carries into round 2 alike.
TEST(OuterSync, NoDelayNoMixIsPlainDilocoOneFragmentAtATime) {
  Config streaming = tiny_config();
  streaming.parallel.dp = 2;
  streaming.compression.diloco.inner_steps = 4;
  streaming.compression.diloco.outer_lr = 0.7;
  streaming.compression.diloco.outer_momentum = 0.5;
  Config plain = streaming;
  streaming.compression.diloco.fragments = 2;
  streaming.compression.diloco.sync_delay = 0;
  streaming.compression.diloco.mix = 0.0;
  testing::run_layout({1, 1, 2}, [&](int rank, Distributed& d) {
    torch::manual_seed(1);
    GptModel a = stage_model(streaming, 0);
    torch::manual_seed(1);
    GptModel b = stage_model(plain, 0);
    OuterSync fragmented(streaming, a, d.dp.get(), d.embedding.get());
    OuterSync whole(plain, b, d.dp.get(), d.embedding.get());
    const double k = rank + 1.0;
    for (int64_t round = 0; round < 2; ++round) {
      set_local(a, snapshot(a), k * (round + 1));
      set_local(b, snapshot(b), k * (round + 1));
      const auto local = snapshot(a);
      fragmented.after_step(4 * round + 2);
      whole.after_step(4 * round + 2);
      const auto plain_weights = snapshot(b);
      for (const auto& item : a->named_parameters()) {
        const bool landed = fragmented.fragment_of(item.key()) == 0;
        EXPECT_EQ(torch::equal(item.value(), local.at(item.key())), !landed) << item.key();
        EXPECT_TRUE(torch::equal(plain_weights.at(item.key()), local.at(item.key()))) << "plain moved " << item.key();
      }
      const auto fragment0 = snapshot(a);
      fragmented.after_step(4 * round + 4);
      whole.after_step(4 * round + 4);
      const auto b_after = snapshot(b);
      for (const auto& item : a->named_parameters()) {
        EXPECT_FALSE(torch::equal(item.value(), local.at(item.key()))) << "round " << round << " " << item.key();
        EXPECT_TRUE(torch::equal(item.value(), b_after.at(item.key()))) << "round " << round << " " << item.key();
        if (fragmented.fragment_of(item.key()) == 0) {
          EXPECT_TRUE(torch::equal(item.value(), fragment0.at(item.key()))) << "fragment 0 moved again " << item.key();
        }
      }
    }
  });
}

// PP2 x DP2: the tied word embedding's copy on the last stage takes no outer step of its own; it
// gets stage 0's global value and stays bit-identical to it. The `outer` bytes this rank's
// Communicator metered equal the reducer's plan (LinkEmulator::ring_send_bytes of each collective),
// for the uncompressed outer reducer and for 4-bit-level QSGD codes.
TEST(OuterSync, TiedCopyFollowsStageZeroAndMeteredBytesEqualThePlan) {
  for (const char* outer_spec : {"none", "{name: qsgd, levels: 7, bucket_size: 64}", "bf16"}) {
    Config cfg = tiny_config();
    cfg.parallel.pp = 2;
    cfg.parallel.dp = 2;
    cfg.compression.diloco.inner_steps = 1;
    cfg.compression.diloco.outer_momentum = 0.0;
    const YAML::Node spec = YAML::Load(outer_spec);
    cfg.compression.diloco.outer.name = spec.IsScalar() ? spec.as<std::string>() : spec["name"].as<std::string>();
    cfg.compression.diloco.outer.options = YAML::Node(YAML::NodeType::Map);
    if (spec.IsMap()) {
      for (const auto& kv : spec) {
        if (kv.first.as<std::string>() != "name") cfg.compression.diloco.outer.options[kv.first] = kv.second;
      }
    }
    std::vector<torch::Tensor> words(4);
    testing::run_layout({1, 2, 2}, [&](int rank, Distributed& d) {
      torch::manual_seed(1);
      const int stage = d.coord().pp;
      GptModel model = stage_model(cfg, stage);
      const auto theta0 = snapshot(model);
      OuterSync outer(cfg, model, d.dp.get(), d.embedding.get());
      set_local(model, theta0, d.coord().dp + 1.0);
      d.meter.reset();
      outer.after_step(1);
      words[rank] = model->word_embedding().detach().clone();
      // Plan bytes of the outer step = metered bytes of class outer.
      const auto names = outer.fragment_names(0);
      std::vector<std::vector<int64_t>> shapes;
      for (const auto& item : model->named_parameters()) {
        if (std::find(names.begin(), names.end(), item.key()) != names.end()) shapes.push_back(item.value().sizes().vec());
      }
      PlanContext ctx;
      ctx.step = 1;
      ctx.group_size = 2;
      ctx.host_gloo = true;
      const ReducerPlan plan = outer.reducer(0).plan(shapes, ctx);
      int64_t planned = 0;
      for (const auto& s : plan.steps) {
        if (!s.compute) planned += LinkEmulator::ring_send_bytes(s.kind, s.bytes, 2);
      }
      const int64_t metered = d.meter.at(Traffic::kOuter, Link::kIntraNode).bytes;
      EXPECT_GT(metered, 0) << outer_spec;
      EXPECT_EQ(metered, planned) << outer_spec << " rank " << rank;
      // The tied copy: one broadcast of the word embedding's global value, stage 0 sends it.
      const int64_t word_bytes = model->word_embedding().numel() * 4;
      EXPECT_EQ(d.meter.at(Traffic::kEmbedding, Link::kIntraNode).bytes, word_bytes / 2) << "rank " << rank;
    });
    // Both stages of both replicas hold the same word embedding.
    for (int r = 1; r < 4; ++r) EXPECT_TRUE(torch::equal(words[r], words[0])) << outer_spec << " rank " << r;
  }
}

// ---- training ----------------------------------------------------------------------------------

using testing::Dims;
using testing::TrainedRun;
using testing::train_small;

Config train_config(const testing::TempDir& dir, Dims d) { return testing::small_training_config(dir, d, "diloco"); }

float max_difference(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  float worst = 0;
  for (const auto& [name, w] : a) worst = std::max(worst, (w - b.at(name)).abs().max().item<float>());
  return worst;
}

// One replica (PP2, so the tied copy's broadcast runs too): outer lr 1 and no momentum put every
// fragment back where the inner steps left it, up to the rounding of θ_b - (θ_b - θ) in fp32.
// The losses and weights equal plain training's to that rounding, for H = 1, 2, 3 and F = 1, 2.
TEST(DilocoTraining, OneReplicaOuterLrOneNoMomentumEqualsPlainTraining) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  const Dims dims{1, 2, 1};
  Config plain = train_config(dir, dims);
  const TrainedRun base = train_small(plain, dims);
  ASSERT_EQ(base.train_losses.size(), 6u);
  for (auto [H, F] : {std::pair{1, 1}, {2, 1}, {3, 1}, {2, 2}}) {
    Config c = plain;
    c.log.run_name = fmt::format("diloco-h{}-f{}", H, F);
    c.compression.dp_strategy = "diloco";
    c.compression.diloco.inner_steps = H;
    c.compression.diloco.fragments = F;
    c.compression.diloco.outer_lr = 1.0;
    c.compression.diloco.outer_momentum = 0.0;
    const TrainedRun d = train_small(c, dims);
    ASSERT_EQ(d.train_losses.size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_NEAR(d.train_losses[i], base.train_losses[i], 1e-5) << "H " << H << " F " << F << " step " << i + 1;
    }
    EXPECT_LT(max_difference(d.parameters, base.parameters), 1e-5) << "H " << H << " F " << F;
  }
}

// DP2, one fragment, momentum: the replicas take their own AdamW steps between syncs, so their
// weights differ after a step that is not a sync step and are bit-identical after one (the outer
// mean lands alike on both), on both stages; and DiLoCo is not the all-reduce baseline.
TEST(DilocoTraining, ReplicasAgreeAfterEverySyncAndDifferBetween) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  const Dims dims{1, 2, 2};
  const RankLayout layout(ParallelDims{1, 2, 2}, 4);
  for (int64_t steps : {5, 6}) {
    Config c = train_config(dir, dims);
    c.log.run_name = fmt::format("diloco-{}", steps);
    c.train.train_steps = steps;
    c.compression.dp_strategy = "diloco";
    c.compression.diloco.inner_steps = 2;
    const TrainedRun d = train_small(c, dims);
    for (int r = 0; r < 4; ++r) {
      const RankCoord me = layout.coord(r);
      if (me.dp != 0) continue;
      RankCoord peer = me;
      peer.dp = 1;
      const float diff = max_difference(d.every_rank[r], d.every_rank[layout.rank(peer)]);
      if (steps % 2 == 0) {
        EXPECT_EQ(diff, 0.0f) << "stage " << me.pp << " after sync step " << steps;
      } else {
        EXPECT_GT(diff, 0.0f) << "stage " << me.pp << " after local step " << steps;
      }
    }
    if (steps == 6) {
      Config allreduce = train_config(dir, dims);
      allreduce.log.run_name = "allreduce";
      EXPECT_GT(max_difference(d.parameters, train_small(allreduce, dims).parameters), 1e-6f);
    }
  }
}

// Evaluation under DiLoCo measures the global model (the backup weights) and puts the replicas'
// own weights back. PP2 x DP2, H 4, F 1, α 0.5 (so even after a sync the replicas hold a mix, not
// the global model), an evaluation after every step: the global model changes only when a sync
// lands, so the validation loss is the same at steps 0-3 and at steps 4-7, bit for bit, and moves
// at 4 and at 8; training with these evaluations is bit-identical to training without them.
TEST(DilocoTraining, ValidationMeasuresTheGlobalModelAndLeavesTrainingAlone) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  const Dims dims{1, 2, 2};
  auto config = [&](int64_t eval_interval) {
    Config c = train_config(dir, dims);
    c.log.run_name = fmt::format("diloco-eval-{}", eval_interval);
    c.train.train_steps = 8;
    c.train.eval_interval = eval_interval;
    c.compression.dp_strategy = "diloco";
    c.compression.diloco.inner_steps = 4;
    c.compression.diloco.mix = 0.5;
    return c;
  };
  const TrainedRun every = train_small(config(1), dims);
  ASSERT_EQ(every.eval_losses.size(), 9u);  // steps 0..8
  const std::vector<double>& eval = every.eval_losses;
  for (int s : {1, 2, 3}) EXPECT_EQ(eval[s], eval[0]) << "step " << s << ": no sync has landed";
  for (int s : {5, 6, 7}) EXPECT_EQ(eval[s], eval[4]) << "step " << s << ": the global model of step 4";
  EXPECT_LT(eval[4], eval[0] - 1e-4) << "the sync at step 4 moved the global model";
  EXPECT_NE(eval[8], eval[4]) << "the sync at step 8 moved it again";
  const TrainedRun once = train_small(config(0), dims);
  ASSERT_EQ(once.eval_losses.size(), 1u);
  EXPECT_EQ(once.eval_losses[0], eval[8]);
  EXPECT_EQ(once.train_losses, every.train_losses);
  for (size_t r = 0; r < every.every_rank.size(); ++r) {
    EXPECT_EQ(max_difference(every.every_rank[r], once.every_rank[r]), 0.0f) << "rank " << r;
  }
}

// Streaming DiLoCo on PP2 x DP2 with a stateful 4-bit-level outer reducer (QSGD with error
// feedback), F = 2, H = 2, τ = 1, α = 0.5, Nesterov momentum: a run stopped at step 3 (fragment 0's
// sync in flight, fragment 1 mid-period) and resumed continues bit-identically.
TEST(DilocoTraining, ResumeMidPeriodAndMidSyncIsBitIdentical) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  const Dims dims{1, 2, 2};
  auto config = [&](int64_t steps, bool save) {
    Config c = train_config(dir, dims);
    c.compression.dp_strategy = "diloco";
    c.compression.diloco.inner_steps = 2;
    c.compression.diloco.fragments = 2;
    c.compression.diloco.sync_delay = 1;
    c.compression.diloco.mix = 0.5;
    c.compression.diloco.outer.name = "qsgd";
    c.compression.diloco.outer.options = YAML::Load("{levels: 7, error_feedback: true}");
    c.checkpoint.dir = dir / "ckpt";
    c.checkpoint.interval = save ? 3 : 0;
    c.checkpoint.save_final = false;
    if (steps < 6) {
      c.train.decay_steps = 6 - c.train.warmup_steps;
      c.train.train_steps = steps;
    }
    return c;
  };
  const TrainedRun full = train_small(config(6, false), dims);
  train_small(config(3, true), dims);
  const TrainedRun resumed = train_small(config(6, false), dims, dir / "ckpt");
  ASSERT_EQ(resumed.train_losses.size(), 3u);
  EXPECT_EQ(resumed.train_losses, std::vector<double>(full.train_losses.begin() + 3, full.train_losses.end()));
  EXPECT_EQ(max_difference(resumed.parameters, full.parameters), 0.0f);
}

TEST(DilocoConfig, RefusesWhatItCannotRunNamingTheKey) {
  const auto refused = [](const std::function<void(Config&)>& edit) -> std::string {
    Config c;
    c.parallel.dp = 2;
    c.compression.dp_strategy = "diloco";
    edit(c);
    try {
      c.validate(2);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refused([](Config&) {}), "");
  EXPECT_NE(refused([](Config& c) { c.compression.dp_strategy = "local_sgd"; }).find("compression.dp_strategy"), std::string::npos);
  EXPECT_NE(refused([](Config& c) { c.compression.dp.name = "powersgd"; }).find("diloco.outer"), std::string::npos);
  EXPECT_NE(refused([](Config& c) { c.compression.fused_embedding = true; }).find("compression.fused_embedding"),
            std::string::npos);
  EXPECT_NE(refused([](Config& c) { c.compression.diloco.fragments = 17; }).find("diloco.fragments"), std::string::npos);
  EXPECT_NE(refused([](Config& c) { c.compression.diloco.sync_delay = 16; }).find("diloco.sync_delay"), std::string::npos);
  EXPECT_NE(refused([](Config& c) { c.compression.diloco.mix = 1.5; }).find("diloco.mix"), std::string::npos);
  // mix 1 keeps the local weights: every global update would be thrown away.
  const std::string mix1 = refused([](Config& c) { c.compression.diloco.mix = 1; });
  EXPECT_NE(mix1.find("diloco.mix = 1: must be in [0, 1)"), std::string::npos) << mix1;
  EXPECT_NE(mix1.find("throw every global update away"), std::string::npos) << mix1;
  // Fragments: one rule, [1, min(inner_steps, layers)], and the fix says the same (no divisor needed).
  EXPECT_EQ(refused([](Config& c) {
              c.model.num_layers = 4;
              c.compression.diloco.inner_steps = 16;
              c.compression.diloco.fragments = 3;
            }), "");
  const std::string five = refused([](Config& c) {
    c.model.num_layers = 4;
    c.compression.diloco.inner_steps = 16;
    c.compression.diloco.fragments = 5;
  });
  EXPECT_NE(five.find("diloco.fragments = 5: must be in [1, min(inner_steps, model.num_layers)] = [1, 4]"),
            std::string::npos) << five;
  EXPECT_NE(five.find("Fix: use a value in [1, 4]"), std::string::npos) << five;
  EXPECT_EQ(five.find("divisor"), std::string::npos) << five;
  // compression.dp_stages selects stages of the every-step DP reduction, which DiLoCo does not run.
  const std::string stages = refused([](Config& c) { c.compression.dp_stages = DpStages::first(1); });
  EXPECT_NE(stages.find("compression.dp_stages = 1: "), std::string::npos) << stages;
  EXPECT_NE(stages.find("remove compression.dp_stages"), std::string::npos) << stages;
  const std::string wire = refused([](Config& c) { c.parallel.grad_reduce_dtype = "compute"; });
  EXPECT_NE(wire.find("parallel.grad_reduce_dtype = 'compute': "), std::string::npos) << wire;
  EXPECT_NE(wire.find("diloco.outer: bf16"), std::string::npos) << wire;
  EXPECT_NE(refused([](Config& c) { c.compression.diloco.outer.name = "zip"; }).find("diloco.outer"), std::string::npos);
  // Under allreduce a diloco: key off its default is refused with its value.
  const std::string ignored = refused([](Config& c) {
    c.compression.dp_strategy = "allreduce";
    c.compression.diloco.inner_steps = 4;
  });
  EXPECT_NE(ignored.find("diloco.inner_steps = 4"), std::string::npos) << ignored;
  // A scheme with fused embedding (cb_fe_sc also sets dp) is told to use cb, before dp is mentioned.
  const std::string fused = refused([](Config& c) { apply_compression_scheme(c.compression, "cb_fe_sc"); });
  EXPECT_NE(fused.find("compression.fused_embedding = true (set by compression.scheme = cb_fe_sc)"), std::string::npos)
      << fused;
  EXPECT_NE(fused.find("use compression.scheme: cb"), std::string::npos) << fused;
  // Keys the user set over a scheme that does not set them are not blamed on the scheme.
  const std::string user_fe = refused([](Config& c) {
    apply_compression_scheme(c.compression, "baseline");
    c.compression.fused_embedding = true;
  });
  EXPECT_NE(user_fe.find("compression.fused_embedding = true: "), std::string::npos) << user_fe;
  EXPECT_NE(user_fe.find("set compression.fused_embedding: false"), std::string::npos) << user_fe;
  const std::string user_dp = refused([](Config& c) {
    apply_compression_scheme(c.compression, "cb");
    c.compression.dp.name = "fp16";
  });
  EXPECT_NE(user_dp.find("compression.dp = 'fp16': "), std::string::npos) << user_dp;
  // A known compressor with a bad option keeps its name in the fix; an unknown name gets the list.
  const std::string bits = refused([](Config& c) {
    c.compression.diloco.outer.name = "qsgd";
    c.compression.diloco.outer.options.reset(YAML::Node(YAML::NodeType::Map));
    c.compression.diloco.outer.options["bits"] = 5;
  });
  EXPECT_NE(bits.find("Fix: keep qsgd and correct the option"), std::string::npos) << bits;
  EXPECT_NE(refused([](Config& c) { c.compression.diloco.outer.name = "zip"; }).find("Fix: pick one of"),
            std::string::npos);
  // Loaded from YAML: a section of its own, and the label names the strategy.
  const Config y = load_config_text("compression: {scheme: cb, dp_strategy: diloco}\n"
                                    "diloco: {inner_steps: 8, fragments: 2, outer: {name: qsgd, levels: 7}}\n",
                                    "test");
  EXPECT_EQ(y.compression.diloco.inner_steps, 8);
  EXPECT_EQ(y.compression.diloco.outer.name, "qsgd");
  const std::string label = compression_label(y.compression);
  EXPECT_EQ(label.rfind("cb with dp_strategy=diloco(fragments=2,inner_steps=8,", 0), 0u) << label;
  // A scheme applied later keeps the strategy.
  const Config z = load_config_text("diloco: {inner_steps: 8}\ncompression: {dp_strategy: diloco}\n", "test",
                                    {"compression.scheme=cb"});
  EXPECT_TRUE(z.compression.diloco_on());
  EXPECT_EQ(z.compression.diloco.inner_steps, 8);
}

}  // namespace
}  // namespace optcc

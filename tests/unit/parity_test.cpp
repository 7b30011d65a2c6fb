// Parity: TP x PP x DP training vs. a single-rank run of the same model, seed and data. The loss
// of every step and the final weights (each rank's shard vs. the matching slice) agree within
// fp32 tolerance; the tied embedding copies of the first and last stage stay bit-identical.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <functional>

#include "harness/parallel/distributed.h"
#include "harness/train/trainer.h"
#include "models/sharding.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/small_training.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

using testing::Dims;  // its PrintTo names the parameters in test listings

constexpr double kLossTol = 1e-6;    // relative, per step (measured <= 6e-8)
constexpr double kWeightTol = 2e-5;  // absolute, after 5 AdamW steps at lr 1e-3 (measured <= 1.2e-6)

// The small model (tests/support/small_training.h) for 5 steps, without a validation split: parity
// is about training.
Config parity_config(const testing::TempDir& dir, Dims d) {
  Config c = testing::small_training_config(dir, d, fmt::format("tp{}pp{}dp{}", d.tp, d.pp, d.dp));
  c.data.split = "100,0,0";
  c.train.train_steps = 5;
  return c;
}

torch::Tensor matching_slice(const torch::Tensor& full, const torch::Tensor& shard, int tp_rank) {
  if (full.sizes().equals(shard.sizes())) return full;
  const int64_t dim = full.size(0) != shard.size(0) ? 0 : 1;
  return full.narrow(dim, tp_rank * shard.size(dim), shard.size(dim));
}

// One layout with `schedule` (and `chunks` model chunks per stage) against the single rank.
void expect_parity(const Dims dims, const std::string& schedule = "1f1b", int chunks = 1) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  TrainOptions opt;
  opt.quiet = true;
  opt.keep_parameters = true;
  const auto ref = run_training(parity_config(dir, {1, 1, 1}), opt);  // also builds the index cache

  const int world = dims.tp * dims.pp * dims.dp;
  Config cfg = parity_config(dir, dims);
  cfg.parallel.schedule = schedule;
  cfg.parallel.virtual_stages = chunks;
  std::vector<TrainSummary> out(world);
  testing::run_layout({dims.tp, dims.pp, dims.dp},
                      [&](int rank, Distributed& dist) { out[rank] = run_training(cfg, opt, dist); });

  double max_loss_rel = 0, max_weight = 0;
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(out[r].train_losses.size(), 5u);
    for (int s = 0; s < 5; ++s) {
      max_loss_rel = std::max(max_loss_rel, std::abs(out[r].train_losses[s] / ref.train_losses[s] - 1));
    }
    const int tp_rank = r % dims.tp, stage = r / (dims.tp * dims.dp);
    const StageRange range = stage_range(cfg, stage);
    EXPECT_EQ(range.chunks, chunks);
    for (const auto& [name, shard] : out[r].parameters) {
      const auto it = ref.parameters.find(whole_model_name(name, range));
      ASSERT_NE(it, ref.parameters.end()) << name;
      auto expect = matching_slice(it->second, shard, tp_rank);
      max_weight = std::max(max_weight, (shard - expect).abs().max().item<double>());
    }
  }
  // Tied copies: stage 0's and the last stage's word embedding of the same (tp, dp) are identical.
  if (dims.pp > 1) {
    const int last = (dims.pp - 1) * dims.tp * dims.dp;
    for (int i = 0; i < dims.tp * dims.dp; ++i) {
      EXPECT_TRUE(torch::equal(out[i].parameters.at("embedding.weight"), out[last + i].parameters.at("embedding.weight")))
          << "tied embedding copies diverged on rank " << i;
    }
  }
  ::testing::Test::RecordProperty("max_loss_rel_diff", std::to_string(max_loss_rel));
  ::testing::Test::RecordProperty("max_weight_abs_diff", std::to_string(max_weight));
  std::printf("layout tp=%d pp=%d dp=%d, %s (v = %d): max relative loss diff %.3g, max weight diff %.3g\n", dims.tp,
              dims.pp, dims.dp, schedule.c_str(), chunks, max_loss_rel, max_weight);
  EXPECT_LT(max_loss_rel, kLossTol);
  EXPECT_LT(max_weight, kWeightTol);
}

class Parity : public ::testing::TestWithParam<Dims> {};

TEST_P(Parity, LossesAndFinalWeightsMatchSingleRank) { expect_parity(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Layouts, Parity,
                         ::testing::Values(Dims{2, 1, 1}, Dims{1, 2, 1}, Dims{1, 1, 2}, Dims{2, 2, 1}, Dims{1, 4, 1},
                                           Dims{2, 2, 2}),
                         [](const auto& info) {
                           return fmt::format("tp{}pp{}dp{}", info.param.tp, info.param.pp, info.param.dp);
                         });

// Interleaved 1F1B, two chunks of one layer per stage (4 layers on 2 stages): the ring of
// messages, the round-robin layers and the tied embedding on stage 0's chunk 0 and the last
// stage's chunk 1 give the single rank's training (m = 4 at dp 1, 2 at dp 2).
class ParityInterleaved : public ::testing::TestWithParam<Dims> {};

TEST_P(ParityInterleaved, LossesAndFinalWeightsMatchSingleRank) { expect_parity(GetParam(), "interleaved_1f1b", 2); }

INSTANTIATE_TEST_SUITE_P(Layouts, ParityInterleaved, ::testing::Values(Dims{1, 2, 1}, Dims{2, 2, 2}),
                         [](const auto& info) {
                           return fmt::format("tp{}pp{}dp{}_v2", info.param.tp, info.param.pp, info.param.dp);
                         });

// ZB-H1: each backward split into B (input gradient) and W (the linear layers' weight-gradient
// GEMMs, deferred, kernels/gemm.h), W scheduled into the bubbles; the same gradients, so the same
// training.
class ParityZbH1 : public ::testing::TestWithParam<Dims> {};

TEST_P(ParityZbH1, LossesAndFinalWeightsMatchSingleRank) { expect_parity(GetParam(), "zb_h1"); }

INSTANTIATE_TEST_SUITE_P(Layouts, ParityZbH1, ::testing::Values(Dims{1, 2, 1}, Dims{2, 2, 2}, Dims{1, 4, 1}),
                         [](const auto& info) {
                           return fmt::format("tp{}pp{}dp{}", info.param.tp, info.param.pp, info.param.dp);
                         });

}  // namespace
}  // namespace optcc

// Traffic of one step, as written to /traffic by rank 0, equals the closed forms (docs/design.md §9 with
// ring collectives; stage_link.h for the scatter-gather split) for every rank of TP2 x PP2 x DP2.
#include <H5Cpp.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "harness/train/run_records.h"

namespace optcc {
namespace {

std::vector<int64_t> read_column(H5::H5File& f, const std::string& path) {
  auto ds = f.openDataSet(path);
  hsize_t n = 0;
  ds.getSpace().getSimpleExtentDims(&n);
  std::vector<int64_t> v(n);
  ds.read(v.data(), H5::PredType::NATIVE_INT64);
  return v;
}

TEST(Traffic, MeasuredBytesEqualFormulas) {
  const Dims dims{2, 2, 2};
  const int world = 8;
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  Config cfg = parity_config(dir, dims);
  cfg.train.train_steps = 3;
  TrainOptions opt;
  opt.quiet = true;
  opt.keep_parameters = true;
  std::vector<TrainSummary> out(world);
  testing::run_layout({dims.tp, dims.pp, dims.dp},
                      [&](int rank, Distributed& dist) { out[rank] = run_training(cfg, opt, dist); });
  H5::H5File f(out[0].results_path, H5F_ACC_RDONLY);
  const auto step = read_column(f, "/traffic/step"), rank = read_column(f, "/traffic/rank");
  const auto cls = read_column(f, "/traffic/class"), bytes = read_column(f, "/traffic/bytes");
  const auto p2p_bytes = read_column(f, "/traffic/p2p_bytes");
  std::map<std::pair<int64_t, int64_t>, int64_t> measured, measured_p2p;  // (rank, class) -> bytes in step 2
  for (size_t i = 0; i < step.size(); ++i) {
    if (step[i] == 2) measured[{rank[i], cls[i]}] += bytes[i], measured_p2p[{rank[i], cls[i]}] += p2p_bytes[i];
  }
  const int64_t t = 2, d = 2, s = 16, b = 2, h = 32, m = 2, layers = 2;
  const int64_t N4 = s * b * h * 4;                  // one activation message, bytes
  const int64_t allreduce = [&](int64_t x) { return 2 * (t - 1) * x / t; }(N4);
  for (int r = 0; r < world; ++r) {
    const int stage = r / (dims.tp * dims.dp);
    const bool first = stage == 0, last = stage == dims.pp - 1;
    int64_t theta = 0;
    for (const auto& [name, p] : out[r].parameters) theta += p.numel();
    // TP: per micro-batch 4 all-reduces of [s,b,h] per layer (2 forward, 2 backward), the
    // vocab-parallel embedding's forward all-reduce on the first stage, the tied output layer's
    // backward all-reduce and the cross-entropy's 3 all-reduces of [s*b] on the last stage.
    const int64_t tp = m * ((4 * layers + first + last) * allreduce + (last ? 3 * 2 * (t - 1) * s * b * 4 / t : 0));
    const int64_t pp_fwd = m * (last ? 0 : N4 / t) + m * (first ? 0 : (t - 1) * N4 / t);
    const int64_t pp_bwd = m * (first ? 0 : N4 / t) + m * (last ? 0 : (t - 1) * N4 / t);
    const int64_t dp = 2 * (d - 1) * theta * 4 / d;
    const int64_t embedding = (first || last) ? 2 * (2 - 1) * (64 / t) * h * 4 / 2 : 0;
    EXPECT_EQ((measured[{r, 0}]), tp) << "tp bytes of rank " << r;
    EXPECT_EQ((measured[{r, 1}]), pp_fwd) << "pp_fwd bytes of rank " << r;
    EXPECT_EQ((measured[{r, 2}]), pp_bwd) << "pp_bwd bytes of rank " << r;
    EXPECT_EQ((measured[{r, 3}]), dp) << "dp bytes of rank " << r;
    EXPECT_EQ((measured[{r, 4}]), embedding) << "embedding bytes of rank " << r;
    // Point to point: only the stage-to-stage sends (the first terms above), no collective's bytes.
    EXPECT_EQ((measured_p2p[{r, 1}]), m * (last ? 0 : N4 / t)) << "pp_fwd wire bytes of rank " << r;
    EXPECT_EQ((measured_p2p[{r, 2}]), m * (first ? 0 : N4 / t)) << "pp_bwd wire bytes of rank " << r;
    for (int64_t c : {0, 3, 4}) EXPECT_EQ((measured_p2p[{r, c}]), 0) << "class " << c << " of rank " << r;
  }
}

// Losses of steps 3-4 of a 4-step run, uninterrupted and resumed from a step-2 checkpoint.
// resume_from_full: resume from the full run's own step-2 checkpoint instead of a separate 2-step
// run, for state that a run chooses from measured times (SC auto), which two runs may not agree on.
std::pair<std::vector<double>, std::vector<double>> full_and_resumed(Dims dims, const std::function<void(Config&)>& edit,
                                                                     bool resume_from_full = false) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  auto run = [&](int64_t steps, bool save, std::optional<std::string> resume) {
    Config cfg = parity_config(dir, dims);
    edit(cfg);
    cfg.train.train_steps = 4;
    cfg.checkpoint.dir = dir / "ckpt";
    cfg.checkpoint.interval = save ? 2 : 0;
    if (steps < 4) {  // stop early but keep the 4-step LR schedule
      cfg.train.decay_steps = 4 - cfg.train.warmup_steps;
      cfg.train.train_steps = steps;
    }
    std::vector<double> losses;
    testing::run_layout({dims.tp, dims.pp, dims.dp}, [&](int rank, Distributed& dist) {
      TrainOptions opt;
      opt.quiet = true;
      opt.resume = resume;
      auto s = run_training(cfg, opt, dist);
      if (rank == 0) losses = s.train_losses;
    });
    return losses;
  };
  if (resume_from_full) {
    auto full = run(4, true, std::nullopt);  // checkpoints at steps 2 and 4 (keep 2)
    auto resumed = run(4, false, dir / "ckpt/iter_0000002");
    return {std::vector<double>(full.begin() + 2, full.end()), resumed};
  }
  auto full = run(4, false, std::nullopt);
  run(2, true, std::nullopt);
  auto resumed = run(4, false, dir / "ckpt");
  return {std::vector<double>(full.begin() + 2, full.end()), resumed};
}

// Per-rank checkpoints on TP2 x PP2 x DP2: a run resumed at step 2 continues bit-identically.
TEST(Resume3D, BitIdenticalOnSameLayout) {
  auto [full, resumed] = full_and_resumed({2, 2, 2}, [](Config&) {});
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(resumed, full);
}

// The same with PowerSGD on the DP gradients: error-feedback buffers, warm-start Q and the
// reducer's generator travel with the checkpoint (BR-03), so the continuation is bit-identical.
TEST(Resume3D, PowerSgdStateTravelsWithTheCheckpoint) {
  auto [full, resumed] = full_and_resumed({1, 2, 2}, [](Config& c) {
    c.compression.dp.name = "powersgd";
    c.compression.dp.options = YAML::Load("{rank: 2, warmup_steps: 1}");
  });
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(resumed, full);
}

// The same with CB (rank 4, LEP) on the activation gradients and PowerSGD on the DP gradients: BR-03's
// case. The pipeline codec's warm-start Q and LEP buffer travel with the checkpoint too.
TEST(Resume3D, CbLepAndPowerSgdStateTravelWithTheCheckpoint) {
  auto [full, resumed] = full_and_resumed({1, 2, 2}, [](Config& c) {
    c.compression.dp.name = "powersgd";
    c.compression.dp.options = YAML::Load("{rank: 2, warmup_steps: 1}");
    c.compression.pipeline_backward.name = "lowrank";
    c.compression.pipeline_backward.options = YAML::Load("{rank: 4}");
    c.compression.lep = LepMode::kLazy;
  });
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(resumed, full);
}

void check_optimus_cc_results(const std::vector<TrainSummary>& out, const Config& cfg);

// SC auto: the calibration step decides from measured times (so the choice itself is not asserted),
// leaves the run's state alone, and a resumed run keeps the stored choice: bit-identical. The
// resumed run starts from the full run's own checkpoint: two runs calibrating separately may choose
// differently on a loaded machine (a run that re-calibrated on resume could too, and then differs).
TEST(Resume3D, ScAutoChoiceTravelsWithTheCheckpoint) {
  auto [full, resumed] = full_and_resumed(
      {1, 2, 2},
      [](Config& c) {
        c.compression.dp.name = "powersgd";
        c.compression.dp.options = YAML::Load("{rank: 2, warmup_steps: 0}");
        c.compression.dp_stages = DpStages::automatic();
      },
      /*resume_from_full=*/true);
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(resumed, full);
}

// Optimus-CC on TP2 x PP2 x DP2: CB (rank 4, epilogue-only, LEP), FE and SC (PowerSGD on stage 0
// only). Measured bytes per class follow the closed forms; the tied copies stay identical; the
// per-step records land in the results file.
TEST(OptimusCc, BytesPerClassTiedCopiesAndRecords) {
  const Dims dims{2, 2, 2};
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  Config cfg = parity_config(dir, dims);
  cfg.train.train_steps = 3;
  cfg.compression.pipeline_backward.name = "lowrank";
  cfg.compression.pipeline_backward.options = YAML::Load("{rank: 4}");
  cfg.compression.backward_phases = BackwardPhases::kEpilogue;
  cfg.compression.fused_embedding = true;
  cfg.compression.dp.name = "powersgd";
  cfg.compression.dp.options = YAML::Load("{rank: 2, warmup_steps: 0}");
  cfg.compression.dp_stages = DpStages::first(1);
  cfg.log.interval = 2;  // per-tensor DP rows at steps 2 and 3 (the last)
  TrainOptions opt;
  opt.quiet = true;
  opt.keep_parameters = true;
  std::vector<TrainSummary> out(8);
  testing::run_layout({dims.tp, dims.pp, dims.dp},
                      [&](int rank, Distributed& dist) { out[rank] = run_training(cfg, opt, dist); });
  for (int i = 0; i < 4; ++i) {  // ranks 0-3 stage 0, 4-7 stage 1, same (tp, dp) order
    EXPECT_TRUE(torch::equal(out[i].parameters.at("embedding.weight"), out[4 + i].parameters.at("embedding.weight")))
        << "tied embedding copies diverged on rank " << i;
  }
  try {
    check_optimus_cc_results(out, cfg);
  } catch (const H5::Exception& e) {
    FAIL() << "HDF5: " << e.getFuncName() << ": " << e.getDetailMsg();
  }
}

// Fig. 11 (docs/design.md §3.3) with CB on every backward send: per step, each last-stage rank records one
// row per successive pair (j, j+1) of its m micro-batches, on its own TP slice, |cos| <= 1.
TEST(OptimusCc, Fig11SeriesOnTheLastStage) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  Config cfg = parity_config(dir, {2, 2, 1});
  cfg.train.train_steps = 2;  // m = 8 / (2 * 1) = 4 micro-batches
  cfg.compression.pipeline_backward.name = "lowrank";
  cfg.compression.pipeline_backward.options = YAML::Load("{rank: 2}");
  cfg.log.lep_orthogonality = true;
  TrainOptions opt;
  opt.quiet = true;
  std::vector<TrainSummary> out(4);
  testing::run_layout({2, 2, 1}, [&](int rank, Distributed& dist) { out[rank] = run_training(cfg, opt, dist); });
  H5::H5File f(out[0].results_path, H5F_ACC_RDONLY);
  const auto rank = read_column(f, "/lep_orthogonality/rank"), mb = read_column(f, "/lep_orthogonality/microbatch");
  ASSERT_EQ(rank.size(), 2u * 2 * 3);  // steps x last-stage ranks x pairs
  for (size_t i = 0; i < rank.size(); ++i) {
    EXPECT_GE(rank[i], 2);  // ranks 2, 3: stage 1
    EXPECT_LT(mb[i], 3);
  }
  std::vector<double> cosine(rank.size());
  f.openDataSet("/lep_orthogonality/cosine").read(cosine.data(), H5::PredType::NATIVE_DOUBLE);
  for (double c : cosine) {
    EXPECT_LE(std::abs(c), 1.0 + 1e-9);
    EXPECT_GT(std::abs(c), 0.0);  // a real dot product of a lossy error with a real difference
  }
}

// LEP diagnostics (paper/lep-study.md) with lazy_iteration on every backward send: one row per compressed
// send of every rank that sends backward (stage 1), each iteration starting with nothing carried
// (carried_age -1 on micro-batch 0, 0 after), relative errors of a lossy rank-2 codec.
TEST(OptimusCc, LepDiagnosticsRowPerCompressedSend) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  Config cfg = parity_config(dir, {2, 2, 1});
  cfg.train.train_steps = 2;  // m = 4 micro-batches
  cfg.compression.pipeline_backward.name = "lowrank";
  cfg.compression.pipeline_backward.options = YAML::Load("{rank: 2}");
  cfg.compression.lep = LepMode::kLazyIteration;
  cfg.log.lep_diagnostics = true;
  TrainOptions opt;
  opt.quiet = true;
  std::vector<TrainSummary> out(4);
  testing::run_layout({2, 2, 1}, [&](int rank, Distributed& dist) { out[rank] = run_training(cfg, opt, dist); });
  H5::H5File f(out[0].results_path, H5F_ACC_RDONLY);
  const auto rank = read_column(f, "/lep_diagnostics/rank"), mb = read_column(f, "/lep_diagnostics/microbatch");
  const auto age = read_column(f, "/lep_diagnostics/carried_age");
  ASSERT_EQ(rank.size(), 2u * 2 * 4);  // steps x stage-1 ranks x sends
  auto doubles = [&](const char* name) {
    std::vector<double> v(rank.size());
    f.openDataSet(std::string("/lep_diagnostics/") + name).read(v.data(), H5::PredType::NATIVE_DOUBLE);
    return v;
  };
  const auto rel = doubles("relative_error"), cos_delta = doubles("cos_carried_delta");
  const auto slice = doubles("slice_norm"), carried = doubles("carried_norm"), err = doubles("error_norm");
  for (size_t i = 0; i < rank.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_GE(rank[i], 2);
    EXPECT_EQ(age[i], mb[i] == 0 ? -1 : 0);  // lazy_iteration: nothing crosses a step
    EXPECT_GT(rel[i], 1e-3);                 // rank 2 of a 32x16 slice is lossy
    EXPECT_NEAR(rel[i], err[i] / slice[i], 1e-9);
    // Lowrank's P̂·(Mᵀ P̂)ᵀ is a projection of M = slice + carried: the residual is no longer than M.
    EXPECT_LE(err[i], slice[i] + carried[i] + 1e-6);
    if (mb[i] == 0) {
      EXPECT_LE(rel[i], 1.0 + 1e-6);
      EXPECT_EQ(carried[i], 0.0);
      EXPECT_TRUE(std::isnan(cos_delta[i]));
    } else {
      EXPECT_LE(std::abs(cos_delta[i]), 1.0 + 1e-9);
      EXPECT_GT(std::abs(cos_delta[i]), 0.0);
    }
  }
}

void check_optimus_cc_results(const std::vector<TrainSummary>& out, const Config& cfg) {
  H5::H5File f(out[0].results_path, H5F_ACC_RDONLY);
  const auto step = read_column(f, "/traffic/step"), rank = read_column(f, "/traffic/rank");
  const auto cls = read_column(f, "/traffic/class"), link = read_column(f, "/traffic/link");
  const auto bytes = read_column(f, "/traffic/bytes");
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> measured;  // (rank, class, link) -> bytes, step 2
  for (size_t i = 0; i < step.size(); ++i) {
    if (step[i] == 2) measured[{rank[i], cls[i], link[i]}] += bytes[i];
  }
  const int64_t t = 2, d = 2, s = 16, b = 2, h = 32, m = 2, r = 4, V = 64;
  const int64_t slice = s * b * h / t;                  // elements of one TP slice
  const int64_t raw = slice * 4, cb = 4 * r * (slice / h + h);  // P̂ [16, 4] + Q [32, 4], fp32
  const int64_t E = V / t * h;                          // word-embedding elements per TP rank
  for (int rk = 0; rk < 8; ++rk) {
    SCOPED_TRACE(rk);
    const bool first = rk < 4;
    // Stage 1 sends m gradients; epilogue-only compresses the last min(m, p - 1) = 1 of them.
    // Thread ranks share one node, so every group's link is intra-node here.
    const int64_t pp_bwd = first ? m * (t - 1) * raw : (m - 1) * raw + cb;
    EXPECT_EQ((measured[{rk, 2, 0}]), pp_bwd);
    // FE: one all-reduce of the word embedding over the 2d = 4 ranks of this TP index.
    EXPECT_EQ((measured[{rk, 4, 0}]), 2 * (2 * d - 1) * E * 4 / (2 * d));
    int64_t theta = 0;
    for (const auto& [name, p] : out[rk].parameters) {
      if (name != "embedding.weight") theta += p.numel();
    }
    if (first) {
      EXPECT_LT((measured[{rk, 3, 0}]), 2 * (d - 1) * theta * 4 / d / 2);  // compressed
    } else {
      EXPECT_EQ((measured[{rk, 3, 0}]), 2 * (d - 1) * theta * 4 / d);  // SC: raw on stage 1
    }
  }
  // Records: per-tensor DP rows (BR-04), the pipeline codec's counts, the Fig. 11 series.
  const auto codec_rank = read_column(f, "/pipeline_codec/rank");
  const auto compressed = read_column(f, "/pipeline_codec/backward_compressed");
  const auto wire = read_column(f, "/pipeline_codec/backward_wire_bytes");
  for (size_t i = 0; i < codec_rank.size(); ++i) {
    if (codec_rank[i] >= 4) {
      EXPECT_EQ(compressed[i], 1);
      EXPECT_EQ(wire[i], (m - 1) * raw + cb);
    }
  }
  // DP records: /dp_totals every step for every rank; /dp_tensors only the compressed tensors (stage 0:
  // SC compresses there only), only at the logging steps 2 and 3, and they add up to /dp_totals.
  const auto tot_step = read_column(f, "/dp_totals/step"), tot_rank = read_column(f, "/dp_totals/rank");
  const auto tot_tensors = read_column(f, "/dp_totals/tensors"), tot_compressed = read_column(f, "/dp_totals/compressed_tensors");
  const auto tot_raw = read_column(f, "/dp_totals/raw_bytes"), tot_sent = read_column(f, "/dp_totals/sent_bytes");
  ASSERT_EQ(tot_step.size(), 8u * 3);
  const auto tensor_step = read_column(f, "/dp_tensors/step"), tensor_rank = read_column(f, "/dp_tensors/rank");
  const auto tensor_sent = read_column(f, "/dp_tensors/sent_bytes");
  const auto tensor_compressed = read_column(f, "/dp_tensors/compressed");
  EXPECT_FALSE(tensor_sent.empty());
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> detail;  // (step, rank) -> rows, sent
  for (size_t i = 0; i < tensor_step.size(); ++i) {
    EXPECT_EQ(tensor_compressed[i], 1) << "an uncompressed tensor's row";
    EXPECT_TRUE(tensor_step[i] == 2 || tensor_step[i] == 3) << "a row at step " << tensor_step[i];
    EXPECT_LT(tensor_rank[i], 4) << "stage 1 compresses nothing (SC)";
    auto& d = detail[{tensor_step[i], tensor_rank[i]}];
    d.first += 1, d.second += tensor_sent[i];
  }
  for (size_t i = 0; i < tot_step.size(); ++i) {
    SCOPED_TRACE(fmt::format("step {} rank {}", tot_step[i], tot_rank[i]));
    EXPECT_GT(tot_tensors[i], 0);
    if (tot_rank[i] < 4) {  // PowerSGD compresses the matrices; LayerNorms and biases go raw
      EXPECT_GT(tot_compressed[i], 0);
      EXPECT_LT(tot_compressed[i], tot_tensors[i]);
      EXPECT_LT(tot_sent[i], tot_raw[i]);
    } else {
      EXPECT_EQ(tot_compressed[i], 0);
      EXPECT_EQ(tot_sent[i], tot_raw[i]);
    }
    const auto it = detail.find({tot_step[i], tot_rank[i]});
    const int64_t rows = it == detail.end() ? 0 : it->second.first;
    EXPECT_EQ(rows, tot_step[i] >= 2 ? tot_compressed[i] : 0);
    if (rows > 0) {
      EXPECT_LE(it->second.second, tot_sent[i]);
    }
  }
  // The projection bounds what the run wrote: every-step rows, the per-tensor rows of a logging step.
  const ResultsProjection proj = project_results(cfg);
  EXPECT_EQ(proj.logging_steps, 2);
  int64_t step2_detail = 0;
  for (const auto& [key, d] : detail) step2_detail += key.first == 2 ? d.first : 0;
  EXPECT_GE(proj.detail_rows, step2_detail);
  int64_t step2_rows = 1;  // /train
  for (const char* group : {"/traffic/step", "/memory/step", "/timing/step", "/memory_components/step",
                            "/dp_totals/step", "/pipeline_codec/step"}) {
    const auto s = read_column(f, group);
    step2_rows += std::count(s.begin(), s.end(), 2);
  }
  EXPECT_GE(proj.rows_per_step, step2_rows);
  EXPECT_LE(proj.rows_per_step, 2 * step2_rows) << "an upper bound, but not a loose one";
  std::string names;
  H5::Attribute attr = f.openAttribute("dp_tensor_names");
  attr.read(attr.getStrType(), names);
  EXPECT_THAT(names, ::testing::HasSubstr("blocks.0.attn.qkv.weight"));
  EXPECT_THAT(names, ::testing::Not(::testing::HasSubstr("embedding.weight")));  // FE: not DP-reduced
}

}  // namespace
}  // namespace optcc

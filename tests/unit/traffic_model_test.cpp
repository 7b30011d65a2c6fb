// Analytic traffic model (harness/perfmodel/traffic_estimate.h, traffic_report.h):
//   - stage_parameter_shapes() lists exactly what GptModel registers (1 rank and TP = 2);
//   - docs/design.md §9 worked numbers for the paper configs (335M, 2.5B, 8.3B at t=8, p=4, d=4, m=16);
//   - estimate_traffic() equals the bytes the Communicators meter in a real TP2 x PP2 x DP2 step,
//     per rank, class and link (2 ranks per node, so TP is intra-node and PP / DP inter-node).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <H5Cpp.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <tuple>

#include "harness/parallel/distributed.h"
#include "harness/perfmodel/traffic_report.h"
#include "compression/pipeline_codec.h"
#include "harness/train/trainer.h"
#include "models/gpt.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/paths.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

// ---- Parameter shapes vs. the real model --------------------------------------------------------

Config shapes_config(int tp, int pp) {
  Config c;
  c.model.num_layers = 4;
  c.model.hidden_size = 32;
  c.model.num_heads = 4;
  c.model.seq_len = 16;
  c.model.max_position_embeddings = 20;
  c.model.vocab_size = 100;
  c.model.vocab_divisor = 8;
  c.parallel.tp = tp;
  c.parallel.pp = pp;
  return c;
}

StageRange range_of(const Config& c, int stage) {
  StageRange r;
  const auto counts = c.stage_layer_counts();
  for (int k = 0; k < stage; ++k) r.first_layer += counts[k];
  r.num_layers = counts[stage];
  r.is_first = stage == 0;
  r.is_last = stage == c.parallel.pp - 1;
  return r;
}

void expect_same_parameters(GptModel& model, const std::vector<ParamShape>& shapes, const std::string& what) {
  const auto named = model->named_parameters();
  ASSERT_EQ(named.size(), shapes.size()) << what;
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(named[i].key(), shapes[i].name) << what << " parameter " << i;
    EXPECT_EQ(named[i].value().sizes().vec(), shapes[i].shape) << what << " " << shapes[i].name;
    EXPECT_EQ(shapes[i].word_embedding, named[i].value().is_same(model->word_embedding())) << what << " " << shapes[i].name;
  }
}

TEST(StageParameterShapes, MatchGptModelOnOneRank) {
  for (int pp : {1, 2, 4}) {
    const Config c = shapes_config(1, pp);
    for (int stage = 0; stage < pp; ++stage) {
      GptModel model(gpt_options(c), nullptr, range_of(c, stage));
      expect_same_parameters(model, stage_parameter_shapes(c, stage), fmt::format("pp={} stage {}", pp, stage));
    }
  }
}

TEST(StageParameterShapes, MatchGptModelShardsAtTp2) {
  const Config c = shapes_config(2, 2);
  testing::run_ranks(2, [&](const testing::RankContext& ctx) {
    auto tp = ctx.group({0, 1}, "tp");
    for (int stage = 0; stage < 2; ++stage) {
      GptModel model(gpt_options(c), tp.get(), range_of(c, stage));
      expect_same_parameters(model, stage_parameter_shapes(c, stage),
                             fmt::format("tp rank {} stage {}", ctx.rank, stage));
    }
  });
}

TEST(StageParameterShapes, ClosedFormOfSpec9) {
  Config c = shapes_config(2, 2);
  const int64_t h = 32, t = 2, e = c.padded_vocab_size() / t * h, layers = 2;
  const int64_t per_layer = 12 * h * h / t + 7 * h / t + 6 * h;
  auto theta = [&](int stage) {
    int64_t n = 0;
    for (const auto& p : stage_parameter_shapes(c, stage)) n += p.numel();
    return n;
  };
  EXPECT_EQ(theta(0), layers * per_layer + e + 20 * h);
  EXPECT_EQ(theta(1), layers * per_layer + e + 2 * h);
  EXPECT_THROW(stage_parameter_shapes(c, 2), std::out_of_range);
}

// ---- docs/design.md §9 worked numbers ------------------------------------------------------------------

// `printed` is a docs/design.md §9 entry such as "12.08 GB" or "86.3 M": the model's value, in that unit,
// rounds to it (half a unit of the last printed digit).
void expect_printed(double value, const std::string& printed, const std::string& what) {
  static const std::regex re(R"(^\s*([0-9.]+)\s*(KB|MB|GB|TB|M)\s*$)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(printed, m, re)) << printed;
  const std::string number = m[1], unit = m[2];
  const double scale = unit == "KB" ? 1e3 : unit == "MB" || unit == "M" ? 1e6 : unit == "GB" ? 1e9 : 1e12;
  const auto dot = number.find('.');
  const int decimals = dot == std::string::npos ? 0 : static_cast<int>(number.size() - dot - 1);
  const double half = 0.5 * std::pow(10.0, -decimals);
  EXPECT_LE(std::abs(value / scale - std::stod(number)), half + 1e-12)
      << what << ": model gives " << value / scale << " " << unit << ", docs/design.md §9 prints " << printed;
}

struct Spec9 {
  std::string config;  // experiments/paper/<config>
  std::vector<std::string> theta;  // Θ per TP rank, stages 0, 1-2, 3
  std::string message, message_cb, pp_fwd;
  std::vector<std::string> pp_bwd;      // baseline / CB-epi / CB-all
  std::string dp_stage0;                // DP per GPU, stage 0, baseline
  std::vector<std::string> dp_fe_sc;    // DP per GPU with FE+SC, stages 0..3
  std::vector<std::string> dp_total;    // baseline -> FE+SC
  std::vector<std::string> embedding;   // baseline / FE / FE (reference group)
  std::string tp_total;                 // k_TP = 6 (full recomputation)
  std::string lep;
  std::string slice, slice_cb;          // docs/design.md §2.6: one TP rank's slice, uncompressed and P+Q
};

// Copied from docs/design.md §9 (and §2.6 for the slice row), entry for entry.
const std::vector<Spec9>& spec9_table() {
  static const std::vector<Spec9> rows = {
      {"gpt-335m.yaml", {"17.1 M", "9.5 M", "16.0 M"}, "33.6 MB", "1.05 MB", "6.44 GB",
       {"6.44 GB", "5.66 GB", "0.20 GB"}, "102 MB", {"28 MB", "26 MB", "26 MB", "57 MB"}, {"10.0 GB", "4.4 GB"},
       {"4.19 GB", "2.94 GB", "3.30 GB"}, "4.4 TB", "4.2 MB", "4.19 MB", "131 KB"},
      // Θ stage 3 of 2.5B: docs/design.md §9 prints 84.4 M, but its own formula gives 13·5,542,800 + E 12,288,000
      // + 2h 3,840 = 84,348,240 = 84.3 M (docs/design.md §9's DP rows, 432 MB and 60.4 GB, use 84.35 M).
      {"gpt-2.5b.yaml", {"86.3 M", "72.1 M", "84.3 M"}, "62.9 MB", "1.51 MB", "12.08 GB",
       {"12.08 GB", "10.61 GB", "0.29 GB"}, "518 MB", {"109 MB", "106 MB", "106 MB", "432 MB"}, {"60.4 GB", "24.1 GB"},
       {"7.86 GB", "5.51 GB", "6.19 GB"}, "17.7 TB", "7.9 MB", "7.86 MB", "188 KB"},
      {"gpt-8.3b.yaml", {"278.0 M", "255.2 M", "274.9 M"}, "100.7 MB", "2.10 MB", "19.33 GB",
       {"19.33 GB", "16.96 GB", "0.40 GB"}, "1.67 GB", {"239 MB", "236 MB", "236 MB", "1531 MB"}, {"204 GB", "71.7 GB"},
       {"12.6 GB", "8.8 GB", "9.9 GB"}, "39.1 TB", "12.6 MB", "12.58 MB", "262 KB"},
  };
  return rows;
}

Config paper_config(const std::string& file, const std::vector<std::string>& sets = {}) {
  return load_config(std::string(optcc::testing::source_dir()) + "/experiments/paper/" + file, sets);
}

class PaperConfigs : public ::testing::TestWithParam<size_t> {};

TEST_P(PaperConfigs, ReproduceSpec9WorkedNumbers) {
  const Spec9& s = spec9_table()[GetParam()];
  const Config cfg = paper_config(s.config);
  ASSERT_NO_THROW(cfg.validate(128));
  ASSERT_EQ(cfg.padded_vocab_size(), 51200);
  ASSERT_EQ(cfg.num_micro_batches(), 16);
  TrafficModelOptions o;
  o.recompute = true;           // the paper's runs: k_TP = 6
  o.reference_powersgd = true;  // the reference compresses every >=2-D DP gradient (docs/design.md §6.2)
  const PaperTrafficRows r = paper_traffic_rows(cfg, o);
  const std::string& name = s.config;
  ASSERT_EQ(r.stage_parameters.size(), 4u);
  expect_printed(r.stage_parameters[0], s.theta[0], name + " Θ stage 0");
  expect_printed(r.stage_parameters[1], s.theta[1], name + " Θ stage 1");
  expect_printed(r.stage_parameters[2], s.theta[1], name + " Θ stage 2");
  expect_printed(r.stage_parameters[3], s.theta[2], name + " Θ stage 3");
  expect_printed(r.pp_message, s.message, name + " one PP message");
  expect_printed(r.pp_message_cb, s.message_cb, name + " CB-compressed message");
  expect_printed(r.pp_forward_total, s.pp_fwd, name + " PP forward total");
  expect_printed(r.pp_backward_baseline, s.pp_bwd[0], name + " PP backward baseline");
  expect_printed(r.pp_backward_cb_epilogue, s.pp_bwd[1], name + " PP backward CB-epi");
  expect_printed(r.pp_backward_cb_all, s.pp_bwd[2], name + " PP backward CB-all");
  expect_printed(r.dp_per_gpu_baseline[0], s.dp_stage0, name + " DP per GPU stage 0");
  ASSERT_EQ(r.dp_per_gpu_fe_sc.size(), 4u);
  for (int k = 0; k < 4; ++k) expect_printed(r.dp_per_gpu_fe_sc[k], s.dp_fe_sc[k], fmt::format("{} DP FE+SC stage {}", name, k));
  expect_printed(r.dp_total_baseline, s.dp_total[0], name + " DP total baseline");
  expect_printed(r.dp_total_fe_sc, s.dp_total[1], name + " DP total FE+SC");
  expect_printed(r.embedding_total_baseline, s.embedding[0], name + " embedding-related baseline");
  expect_printed(r.embedding_total_fe, s.embedding[1], name + " embedding-related FE");
  expect_printed(r.embedding_total_fe_reference, s.embedding[2], name + " embedding-related FE reference group");
  expect_printed(r.tp_total, s.tp_total, name + " TP all-reduce total");
  expect_printed(r.lep_per_gpu, s.lep, name + " LEP buffer");
  // docs/design.md §2.6: per message per TP rank.
  expect_printed(r.pp_message / 8.0, s.slice, name + " slice");
  expect_printed(r.pp_message_cb / 8.0, s.slice_cb, name + " P+Q");
  EXPECT_EQ(r.fe_sc_stages, "3");
}

INSTANTIATE_TEST_SUITE_P(Spec9, PaperConfigs, ::testing::Values(0, 1, 2), [](const auto& info) {
  return std::regex_replace(spec9_table()[info.param].config, std::regex(R"([^A-Za-z0-9])"), "_");
});

// The per-class view of the same numbers: links (8 GPUs per node, t = 8: TP intra, PP/DP inter),
// schemes switched with compression.scheme, and what optcc itself runs (no recomputation).
TEST(PaperConfigs, SchemesAndLinksOf25B) {
  TrafficModelOptions o;
  const TrafficEstimate base = estimate_traffic(paper_config("gpt-2.5b.yaml"), o);
  EXPECT_EQ(base.ranks.size(), 128u);
  EXPECT_EQ(base.ranks_per_node, 8);
  auto cluster = [](const TrafficEstimate& e, Traffic c, Link l) { return e.cluster[static_cast<int>(c)][static_cast<int>(l)]; };
  EXPECT_EQ(cluster(base, Traffic::kTensorParallel, Link::kInterNode), 0);
  EXPECT_EQ(cluster(base, Traffic::kDataParallel, Link::kIntraNode), 0);
  EXPECT_EQ(cluster(base, Traffic::kPipelineForward, Link::kInterNode), 4LL * 3 * 16 * 1024 * 8 * 1920 * 4);
  // The receivers' TP all-gather of the slices: (t-1) x the inter-node bytes, intra-node.
  EXPECT_EQ(cluster(base, Traffic::kPipelineForward, Link::kIntraNode), 7 * cluster(base, Traffic::kPipelineForward, Link::kInterNode));
  // k_TP = 4 without recomputation: d·m·(L·4 + 2)·2(t-1)·N·β, plus the cross-entropy's 3 [s·b] all-reduces.
  const int64_t n4 = 1024LL * 8 * 1920 * 4;
  EXPECT_EQ(base.cluster_total(Traffic::kTensorParallel),
            4LL * 16 * ((52 * 4 + 2) * 2 * 7 * n4 + 8 * 3 * (2 * 7 * (1024 * 8 * 4) / 8)));
  // The CB+FE+SC scheme: 6 of 48 backward messages compressed per pipeline; stage 3 DP raw.
  const TrafficEstimate full = estimate_traffic(paper_config("gpt-2.5b.yaml", {"compression.scheme=cb_fe_sc"}), o);
  int64_t compressed = 0;
  for (const auto& g : full.stages) compressed += g.backward_compressed;
  EXPECT_EQ(compressed, 6);
  EXPECT_TRUE(full.stages[2].compresses_dp);
  EXPECT_FALSE(full.stages[3].compresses_dp);
  EXPECT_EQ(full.stages[1].lep_bytes, 1024 * 8 * 1920 / 8 * 4);
  EXPECT_EQ(full.stages[0].lep_bytes, 0);  // stage 0 never sends backward (docs/design.md §10.20)
  // FE: one all-reduce of E·β per TP rank over 2d ranks, 2(2d-1)·V·h·β in all (docs/design.md §5.2, §9).
  EXPECT_EQ(full.cluster_total(Traffic::kEmbedding), 2LL * (2 * 4 - 1) * 51200 * 1920 * 4);
  EXPECT_EQ(full.cluster[static_cast<int>(Traffic::kEmbedding)][static_cast<int>(Link::kIntraNode)], 0);
  EXPECT_LT(full.cluster_total(Traffic::kDataParallel), base.cluster_total(Traffic::kDataParallel) / 2);
  // optcc's PowerSGD keeps attention-output gradients (1920 x 240, rate 1.67 < 2) raw by default,
  // so its stage-0 DP bytes exceed the reference's 109 MB.
  EXPECT_GT(full.stages[0].dp, 115'000'000);
  o.reference_powersgd = true;
  EXPECT_LT(estimate_traffic(paper_config("gpt-2.5b.yaml", {"compression.scheme=cb_fe_sc"}), o).stages[0].dp, 109'500'000);
}

// The docs/design.md §9 rows of a config that already runs CB+FE+SC use its own compressors, and building the
// `optcc traffic`'s rows follow the config it was given: a hadamard pipeline codec is not called CB,
// and under DiLoCo the FE and SC rows (every-step DP reduction) are left out, saying why.
TEST(PaperConfigs, ReportLabelsFollowTheConfig) {
  TrafficModelOptions o;
  const auto report = [&](const std::vector<std::string>& sets) {
    const Config cfg = paper_config("gpt-2.5b.yaml", sets);
    return traffic_report(cfg, estimate_traffic(cfg, o), paper_traffic_rows(cfg, o), o);
  };
  const std::string cb = report({"compression.scheme=cb"});
  EXPECT_THAT(cb, ::testing::HasSubstr("same, CB-compressed ("));
  EXPECT_THAT(cb, ::testing::HasSubstr("PP backward, baseline / CB-epi / CB-all"));
  EXPECT_THAT(cb, ::testing::HasSubstr("DP per GPU with FE+SC"));
  const std::string hadamard = report({"compression.pipeline_backward={name: hadamard, bits: 4, tile: 64}"});
  EXPECT_THAT(hadamard, ::testing::HasSubstr("same, hadamard-compressed ("));
  EXPECT_THAT(hadamard, ::testing::HasSubstr("PP backward, baseline / hadamard-epi / hadamard-all"));
  EXPECT_THAT(hadamard, ::testing::Not(::testing::HasSubstr("CB-compressed")));
  const std::string diloco = report({"compression.dp_strategy=diloco", "diloco.inner_steps=16"});
  EXPECT_THAT(diloco, ::testing::Not(::testing::HasSubstr("FE+SC")));
  EXPECT_THAT(diloco, ::testing::HasSubstr("left out: they act on the every-step DP reduction"));
  EXPECT_THAT(diloco, ::testing::HasSubstr("dp_strategy diloco: inner_steps H=16"));
}

// variants leaves the config's compressor options intact (YAML nodes alias on copy).
TEST(PaperConfigs, RowsOfACompressedConfigKeepItsOptions) {
  const Config cfg = paper_config("gpt-2.5b.yaml", {"compression.scheme=cb_fe_sc"});
  const std::string dp = to_yaml_value(cfg.compression.dp), cb = to_yaml_value(cfg.compression.pipeline_backward);
  TrafficModelOptions o;
  o.reference_powersgd = true;
  const PaperTrafficRows r = paper_traffic_rows(cfg, o);
  EXPECT_EQ(to_yaml_value(cfg.compression.dp), dp);
  EXPECT_EQ(to_yaml_value(cfg.compression.pipeline_backward), cb);
  EXPECT_THAT(dp, ::testing::HasSubstr("rank: 128"));
  EXPECT_EQ(r.fe_sc_reducer, dp);
  ASSERT_EQ(r.dp_per_gpu_fe_sc.size(), 4u);
  expect_printed(r.dp_per_gpu_fe_sc[0], "109 MB", "cb_fe_sc DP stage 0");
  expect_printed(r.dp_total_fe_sc, "24.1 GB", "cb_fe_sc DP total");
  expect_printed(r.pp_backward_cb_epilogue, "10.61 GB", "cb_fe_sc PP backward CB-epi");
  // The config's own estimate equals the variant rows.
  const TrafficEstimate e = estimate_traffic(cfg, o);
  EXPECT_EQ(e.cluster_total(Traffic::kDataParallel), r.dp_total_fe_sc);
  EXPECT_EQ(e.cluster[static_cast<int>(Traffic::kPipelineBackward)][static_cast<int>(Link::kInterNode)], r.pp_backward_cb_epilogue);
  EXPECT_EQ(e.cluster_total(Traffic::kEmbedding), r.embedding_total_fe);
}

TEST(TrafficModel, NeedsTheVocabulary) {
  Config c = shapes_config(2, 2);
  c.model.vocab_size = 0;
  EXPECT_THROW(estimate_traffic(c), ConfigError);
}

TEST(TrafficModel, FormatsDecimalUnits) {
  EXPECT_EQ(format_bytes(518.4e6), "518.4 MB");
  EXPECT_EQ(format_bytes(12.08e9), "12.08 GB");
  EXPECT_EQ(format_bytes(17.7e12), "17.70 TB");
  EXPECT_EQ(format_bytes(131072), "131.1 KB");
  EXPECT_EQ(format_bytes(12), "12 B");
}

// ---- Model vs. the Communicators' meters -------------------------------------------------------

std::vector<int64_t> read_column(H5::H5File& f, const std::string& path) {
  auto ds = f.openDataSet(path);
  hsize_t n = 0;
  ds.getSpace().getSimpleExtentDims(&n);
  std::vector<int64_t> v(n);
  ds.read(v.data(), H5::PredType::NATIVE_INT64);
  return v;
}

Config measured_config() {  // data and result paths: expect_model_equals_meters
  Config c;
  c.data.split = "100,0,0";  // no validation pass: only training traffic in the step
  c.train.eval_interval = 0;
  c.model.num_layers = 4;
  c.model.hidden_size = 32;
  c.model.num_heads = 4;
  c.model.seq_len = 16;
  c.model.vocab_divisor = 32;
  c.model.hidden_dropout = 0.0;
  c.model.attention_dropout = 0.0;
  c.parallel.tp = 2;
  c.parallel.pp = 2;
  c.parallel.dp = 2;
  c.parallel.ranks_per_node = 2;  // TP groups in a node; PP and DP across nodes
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 8;  // m = 2
  c.train.train_steps = 2;
  c.train.warmup_steps = 1;
  c.train.threads = 1;
  return c;
}

// Runs `cfg` on TP2 x PP2 x DP2 (ranks as threads, 2 per node); bytes of the last `steps` steps
// (train.train_steps = 2: step 2; or steps 1-2) by (rank, class, link).
std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> measure(const Config& cfg, int64_t steps = 1) {
  const ParallelDims dims{2, 2, 2};
  const int world = dims.world(), per_node = static_cast<int>(cfg.parallel.ranks_per_node);
  std::vector<TrainSummary> out(world);
  testing::run_ranks(world, [&](const testing::RankContext& ctx) {
    LaunchEnv env;
    env.rank = ctx.rank, env.world_size = world, env.local_rank = ctx.rank % per_node, env.local_world_size = per_node;
    env.source = "threads";
    auto dist = init_distributed(dims, per_node, env, ctx.timeout, ctx.store);
    TrainOptions opt;
    opt.quiet = true;
    out[ctx.rank] = run_training(cfg, opt, *dist);
  });
  H5::H5File f(out[0].results_path, H5F_ACC_RDONLY);
  const auto step = read_column(f, "/traffic/step"), rank = read_column(f, "/traffic/rank");
  const auto cls = read_column(f, "/traffic/class"), link = read_column(f, "/traffic/link");
  const auto bytes = read_column(f, "/traffic/bytes");
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> measured;
  for (size_t i = 0; i < step.size(); ++i) {
    if (step[i] > cfg.train.train_steps - steps) measured[{rank[i], cls[i], link[i]}] += bytes[i];
  }
  return measured;
}

// `steps` > 1: the model's bytes per step times `steps` against the last `steps` steps metered (a
// DiLoCo period, whose steps differ).
void expect_model_equals_meters(Config cfg, const std::string& what, TrafficModelOptions o = {}, int64_t steps = 1) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  cfg.data.prefix = dir / "corpus";
  cfg.data.dir = dir / "data";
  cfg.log.dir = dir / "results";
  cfg.log.run_name = what;
  const auto measured = measure(cfg, steps);
  resolve_vocab(cfg);
  o.gloo = true;  // ranks as threads on Gloo (bf16 DP reducer: all-gather)
  const TrafficEstimate e = estimate_traffic(cfg, o);
  int64_t checked = 0;
  for (const auto& r : e.ranks) {
    for (Traffic c : {Traffic::kTensorParallel, Traffic::kPipelineForward, Traffic::kPipelineBackward,
                      Traffic::kDataParallel, Traffic::kEmbedding, Traffic::kOuter}) {
      for (int l = 0; l < 2; ++l) {
        const auto it = measured.find({r.rank, static_cast<int64_t>(c), l});
        const int64_t got = it == measured.end() ? 0 : it->second;
        EXPECT_EQ(steps * r.bytes[static_cast<int>(c)][l], got)
            << what << ": rank " << r.rank << " (stage " << r.coord.pp << ") " << traffic_name(c) << " "
            << link_name(static_cast<Link>(l));
        checked += got;
      }
    }
  }
  EXPECT_GT(checked, 0) << what;
  std::printf("%s: %lld bytes per step metered, all equal to the model\n", what.c_str(), static_cast<long long>(checked));
}

TEST(TrafficModelVsMeters, Baseline) {
  expect_model_equals_meters(measured_config(), "baseline");
}

TEST(TrafficModelVsMeters, DpPowerSgd) {
  Config c = measured_config();
  c.compression.dp.name = "powersgd";
  c.compression.dp.options = YAML::Load("{rank: 2, warmup_steps: 0}");
  expect_model_equals_meters(c, "dp_powersgd");
}

// Streaming DiLoCo, H = 2, F = 2 (fragment 0 with the tied copy's broadcast after step 1, fragment 1
// after step 2), outer reducer none and 8-level QSGD: no dp bytes; outer and embedding per step
// are the period's ÷ H, equal to steps 1-2 metered.
TEST(TrafficModelVsMeters, StreamingDilocoOverAPeriod) {
  for (const char* outer : {"none", "qsgd"}) {
    Config c = measured_config();
    c.compression.dp_strategy = "diloco";
    c.compression.diloco.inner_steps = 2;
    c.compression.diloco.fragments = 2;
    c.compression.diloco.outer.name = outer;
    c.compression.diloco.outer.options = std::string(outer) == "qsgd" ? YAML::Load("{levels: 8, bucket_size: 64}")
                                                                      : YAML::Node(YAML::NodeType::Map);
    expect_model_equals_meters(c, fmt::format("streaming_diloco_{}", outer), {}, 2);
  }
}

// CB (epilogue-only, LEP) + FE + SC (way 1: stage 0 compresses its DP gradients, stage 1 raw).
TEST(TrafficModelVsMeters, CbFeSc) {
  Config c = measured_config();
  apply_override(c, "compression.scheme=cb_fe_sc");
  apply_override(c, "compression.pipeline_backward={name: lowrank, rank: 4}");
  apply_override(c, "compression.dp={name: powersgd, rank: 4, warmup_steps: 0}");
  apply_override(c, "compression.dp_stages=1");
  expect_model_equals_meters(c, "cb_fe_sc");
}

// Interleaved 1F1B, two chunks of one layer per stage: every stage sends m*v messages each way around
// the ring (stage 0's chunk 0 no gradient, the last stage's chunk 1 no activation), each backward
// send compressed as its epilogue flag says; the model reads the same plan.
TEST(TrafficModelVsMeters, InterleavedBaselineAndCbFeSc) {
  Config c = measured_config();
  c.parallel.schedule = "interleaved_1f1b";
  c.parallel.virtual_stages = 2;
  expect_model_equals_meters(c, "interleaved_baseline");
  apply_override(c, "compression.scheme=cb_fe_sc");
  apply_override(c, "compression.pipeline_backward={name: lowrank, rank: 4}");
  apply_override(c, "compression.dp={name: powersgd, rank: 4, warmup_steps: 0}");
  apply_override(c, "compression.dp_stages=1");
  expect_model_equals_meters(c, "interleaved_cb_fe_sc");
}

// LEP buffers per stage: one backward slice (fp32) per sending chunk and buffer, as PipelineCodec
// keeps them (pipeline_codec_test's OneLepBufferPerSendingChunk: the same counts at run time).
TEST(TrafficModel, LepBytesPerSendingChunk) {
  Config c = measured_config();
  c.model.vocab_size = 100;
  apply_override(c, "compression.pipeline_backward={name: lowrank, rank: 4}");
  apply_override(c, "compression.backward_phases=all");
  const int64_t slice = 16 * 2 * 32 / 2 * 4;  // s b h / t, fp32
  for (const char* lep : {"lazy", "per_microbatch"}) {
    apply_override(c, fmt::format("compression.lep={}", lep));
    const int64_t slots = std::string(lep) == "lazy" ? 1 : 2;  // m = 2
    c.parallel.schedule = "1f1b";
    c.parallel.virtual_stages = 1;
    TrafficEstimate e = estimate_traffic(c, {});
    EXPECT_EQ(e.stages[0].lep_bytes, 0) << lep;
    EXPECT_EQ(e.stages[1].lep_bytes, slots * slice) << lep;
    c.parallel.schedule = "interleaved_1f1b";
    c.parallel.virtual_stages = 2;
    e = estimate_traffic(c, {});
    EXPECT_EQ(e.stages[0].lep_bytes, 1 * slots * slice) << lep;  // chunk 1 only
    EXPECT_EQ(e.stages[1].lep_bytes, 2 * slots * slice) << lep;  // both chunks
  }
}

// Every backward message compressed, a forward codec, 16-bit TP all-reduces and a compressed pair
// embedding sync.
TEST(TrafficModelVsMeters, CodecsEverywhere) {
  Config c = measured_config();
  apply_override(c, "compression.pipeline_backward={name: lowrank, rank: 3}");
  apply_override(c, "compression.backward_phases=all");
  apply_override(c, "compression.pipeline_forward=int8");
  apply_override(c, "compression.tp=fp16");
  apply_override(c, "compression.embedding=fp16");
  expect_model_equals_meters(c, "codecs");
}

// train.precision bf16: pipeline messages, TP all-reduces and the receivers' all-gathers carry 2 bytes
// per element, the DP and embedding gradients stay fp32 (4); the model derives both from the config.
TEST(TrafficModelVsMeters, BaselineBf16) {
  Config c = measured_config();
  c.train.precision = "bf16";
  expect_model_equals_meters(c, "baseline_bf16");
}

TEST(TrafficModelVsMeters, CbFeScBf16) {
  Config c = measured_config();
  c.train.precision = "bf16";
  apply_override(c, "compression.scheme=cb_fe_sc");
  apply_override(c, "compression.pipeline_backward={name: lowrank, rank: 4}");
  apply_override(c, "compression.dp={name: powersgd, rank: 4, warmup_steps: 0}");
  apply_override(c, "compression.dp_stages=1");
  expect_model_equals_meters(c, "cb_fe_sc_bf16");
}

// parallel.grad_reduce_dtype: compute at bf16: the uncompressed DP all-reduce (stage 1 under SC way
// 1; stage 0 compresses with PowerSGD, fp32) carries 2 bytes per element, padded to dp chunks.
TEST(TrafficModelVsMeters, CbFeScBf16GradReduceInCompute) {
  Config c = measured_config();
  c.train.precision = "bf16";
  c.parallel.grad_reduce_dtype = "compute";
  apply_override(c, "compression.scheme=cb_fe_sc");
  apply_override(c, "compression.pipeline_backward={name: lowrank, rank: 4}");
  apply_override(c, "compression.dp={name: powersgd, rank: 4, warmup_steps: 0}");
  apply_override(c, "compression.dp_stages=1");
  expect_model_equals_meters(c, "cb_fe_sc_bf16_grad_compute");
}

// compression.tp: bf16 on an fp32 run: the TP all-reduces cast to bf16 and sum through the
// Communicator's Gloo path (all-to-all, fp32 sum, all-gather), metered as the model says.
TEST(TrafficModelVsMeters, TpBf16Wire) {
  Config c = measured_config();
  apply_override(c, "compression.tp=bf16");
  expect_model_equals_meters(c, "tp_bf16");
}

// At bf16 the pipeline classes are half of fp32's, byte for byte; TP is half but for the vocab-
// parallel cross-entropy's all-reduces (fp32 logits: 4 bytes either way); gradient classes equal.
TEST(TrafficModel, Bf16HalvesActivationTrafficAndKeepsGradients) {
  Config fp32 = measured_config();
  fp32.model.vocab_size = 64;
  Config bf16 = fp32;
  bf16.train.precision = "bf16";
  const TrafficModelOptions o;
  const TrafficEstimate a = estimate_traffic(fp32, o), b = estimate_traffic(bf16, o);
  for (Traffic c : {Traffic::kPipelineForward, Traffic::kPipelineBackward}) {
    EXPECT_GT(a.cluster_total(c), 0) << traffic_name(c);
    EXPECT_EQ(b.cluster_total(c) * 2, a.cluster_total(c)) << traffic_name(c);
  }
  const int64_t tp32 = a.cluster_total(Traffic::kTensorParallel), tp16 = b.cluster_total(Traffic::kTensorParallel);
  EXPECT_LT(tp16, tp32);
  EXPECT_GT(tp16 * 2, tp32);  // = tp32 + the cross-entropy's bytes
  for (Traffic c : {Traffic::kDataParallel, Traffic::kEmbedding}) {
    EXPECT_GT(a.cluster_total(c), 0) << traffic_name(c);
    EXPECT_EQ(b.cluster_total(c), a.cluster_total(c)) << traffic_name(c);
  }
  EXPECT_EQ(activation_element_bytes(bf16, o), 2);
  EXPECT_EQ(gradient_element_bytes(o), 4);
  TrafficModelOptions paper;
  paper.element_bytes = 2;  // the paper's all-fp16 runs: --element-bytes 2 sets both
  EXPECT_EQ(activation_element_bytes(fp32, paper), 2);
  EXPECT_EQ(gradient_element_bytes(paper), 2);
}

// --element-bytes β counts every message at β bytes: PowerSGD's P, Q and raw all-reduces halve at
// β = 2 like the uncompressed ones (the paper's all-fp16 runs); β must be an element size.
TEST(TrafficModel, ElementBytesAppliesToEveryGradientMessage) {
  Config c = measured_config();
  c.model.vocab_size = 64;
  apply_override(c, "compression.dp={name: powersgd, rank: 4, warmup_steps: 0}");
  TrafficModelOptions four, two;
  four.element_bytes = 4, two.element_bytes = 2;
  const TrafficEstimate a = estimate_traffic(c, four), b = estimate_traffic(c, two);
  for (Traffic t : {Traffic::kDataParallel, Traffic::kEmbedding, Traffic::kPipelineForward}) {
    EXPECT_GT(b.cluster_total(t), 0) << traffic_name(t);
    EXPECT_EQ(b.cluster_total(t) * 2, a.cluster_total(t)) << traffic_name(t);
  }
  TrafficModelOptions odd;
  odd.element_bytes = 3;
  try {
    (void)estimate_traffic(c, odd);
    ADD_FAILURE() << "--element-bytes 3 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--element-bytes 3 is not an element size"), std::string::npos) << e.what();
  }
}

// grad_reduce_dtype: compute on a bf16 run halves the uncompressed DP bytes (up to the padding to
// dp chunks), and leaves them on an fp32 run.
TEST(TrafficModel, GradReduceDtypeComputeHalvesUncompressedDp) {
  Config c = measured_config();
  c.model.vocab_size = 64;
  c.train.precision = "bf16";
  Config compute = c;
  compute.parallel.grad_reduce_dtype = "compute";
  const TrafficModelOptions o;
  const int64_t fp32_dp = estimate_traffic(c, o).cluster_total(Traffic::kDataParallel);
  const int64_t bf16_dp = estimate_traffic(compute, o).cluster_total(Traffic::kDataParallel);
  EXPECT_GT(bf16_dp, 0);
  EXPECT_LE(std::llabs(bf16_dp * 2 - fp32_dp), 8 * 2 * 4) << fp32_dp << " vs " << bf16_dp;  // ≤ 1 padded element per rank
  EXPECT_EQ(uncompressed_dp_element_bytes(compute, o), 2);
  compute.train.precision = "fp32";
  EXPECT_EQ(estimate_traffic(compute, o).cluster_total(Traffic::kDataParallel), fp32_dp);
}

class DpReducers : public ::testing::TestWithParam<std::string> {};

TEST_P(DpReducers, ModelEqualsMeters) {
  Config c = measured_config();
  apply_override(c, "compression.dp=" + GetParam());
  apply_override(c, "compression.fused_embedding=true");
  expect_model_equals_meters(c, "dp_" + std::regex_replace(GetParam(), std::regex(R"([^A-Za-z0-9]+)"), "_"));
}

INSTANTIATE_TEST_SUITE_P(TrafficModelVsMeters, DpReducers,
                         ::testing::Values("fp16", "bf16", "{name: topk, fraction: 0.05}",
                                           "{name: randomk, fraction: 0.1, min_numel: 64}", "qsgd", "signsgd"),
                         [](const auto& info) {
                           const std::string name = std::regex_replace(info.param, std::regex(R"([^A-Za-z0-9]+)"), "_");
                           return std::regex_replace(name, std::regex(R"(^_+|_+$)"), "");
                         });

}  // namespace
}  // namespace optcc

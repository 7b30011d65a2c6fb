// What a run compresses, as one label (compression_label, harness/config/config.h): the uncompressed
// baseline, a scheme recognised by what it does (named or not), else the acting settings; and the
// labels `optcc sweep --json` gives the compressor comparison's runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "harness/config/config.h"
#include "harness/experiments/sweep.h"
#include "tests/support/paths.h"

namespace optcc {
namespace {

CompressorSpec spec(const std::string& name, const std::string& options_yaml = "") {
  CompressorSpec s;
  s.name = name;
  if (!options_yaml.empty()) s.options = YAML::Load(options_yaml);
  return s;
}

TEST(CompressionLabel, NothingCompressedIsTheBaselineWhateverTheSchemeSays) {
  CompressionConfig c;
  EXPECT_TRUE(compresses_nothing(c));
  EXPECT_EQ(compression_label(c), "baseline");
  c.lep = LepMode::kOff;           // acts on compressed backward sends only
  c.dp_stages = DpStages::first(2);       // acts on compressed DP gradients only
  c.backward_phases = BackwardPhases::kEpilogue;
  EXPECT_EQ(compression_label(c), "baseline");
  c.dp = spec("fp16");
  EXPECT_FALSE(compresses_nothing(c));
  c.dp = spec("none");
  c.fused_embedding = true;  // FE alone moves the embedding gradients: it compresses a class's traffic path
  EXPECT_FALSE(compresses_nothing(c));
  EXPECT_EQ(compression_label(c), "fused_embedding");
}

TEST(CompressionLabel, ASchemeIsNamedByWhatItDoesNamedOrNot) {
  for (const auto& name : compression_scheme_names()) {
    SCOPED_TRACE(name);
    CompressionConfig c;
    apply_compression_scheme(c, name);
    EXPECT_EQ(compression_label(c), name);
    c.scheme.clear();  // the same keys set by hand
    EXPECT_EQ(compression_label(c), name);
  }
  CompressionConfig cb;
  apply_compression_scheme(cb, "cb");
  cb.lep = LepMode::kOff;  // scheme says cb, the settings are cb_nonlep's
  EXPECT_EQ(compression_label(cb), "cb_nonlep");
}

TEST(CompressionLabel, OtherwiseTheActingSettingsWithTheConfigsKeyNames) {
  CompressionConfig c;
  apply_compression_scheme(c, "baseline");
  c.dp = spec("powersgd", "{rank: 4}");
  EXPECT_EQ(compression_label(c), "dp=powersgd(rank=4)");
  c.dp = spec("powersgd", "{rank: 4, error_feedback: true}");  // options sorted by key
  EXPECT_EQ(compression_label(c), "dp=powersgd(error_feedback=true,rank=4)");
  c.dp = spec("topk", "{fraction: 0.01}");
  c.dp_stages = DpStages::first(2);
  EXPECT_EQ(compression_label(c), "dp=topk(fraction=0.01) dp_stages=2");

  CompressionConfig p;
  p.pipeline_backward = spec("lowrank", "{rank: 8}");
  p.backward_phases = BackwardPhases::kEpilogue;
  p.lep = LepMode::kLazyDecay;
  p.lep_decay = 0.5;
  p.tp = spec("fp16");
  EXPECT_EQ(compression_label(p),
            "tp=fp16 pipeline_backward=lowrank(rank=8) backward_phases=epilogue lep=lazy_decay lep_decay=0.5");
}

TEST(CompressionLabel, ANamedSchemeChangedByOtherKeysSaysWhatDiffers) {
  CompressionConfig c;
  apply_compression_scheme(c, "cb_fe_sc");
  c.dp = spec("powersgd", "{rank: 16, error_feedback: true, warmup_steps: 0}");  // Table 2's CPU rows
  EXPECT_EQ(compression_label(c), "cb_fe_sc with dp=powersgd(error_feedback=true,rank=16,warmup_steps=0)");
  c.fused_embedding = false;
  c.dp_stages = DpStages::all();
  EXPECT_EQ(compression_label(c),
            "cb_fe_sc with dp=powersgd(error_feedback=true,rank=16,warmup_steps=0) dp_stages=all fused_embedding=false");
  CompressionConfig lep;
  apply_compression_scheme(lep, "cb");
  lep.backward_phases = BackwardPhases::kAll;
  lep.lep = LepMode::kPerMicrobatch;
  EXPECT_EQ(compression_label(lep), "cb with backward_phases=all lep=per_microbatch");
  lep.pipeline_backward = spec("none");  // nothing left compressed: the baseline, whatever the scheme says
  EXPECT_EQ(compression_label(lep), "baseline");
}

TEST(CompressionLabel, TheCompressorComparisonsRunsAsSweepJsonGivesThem) {
  const std::filesystem::path root = optcc::testing::source_dir();
  SweepPlan p = expand_experiment(load_experiment((root / "experiments/compressors/dp.yaml").string(), root.string()),
                                  "cpu");
  label_runs(p, root.string());
  std::map<std::string, std::string> by_run;
  for (const auto& r : p.runs) by_run[r.run] = r.compression;
  EXPECT_EQ(by_run.at("none-seed1"), "baseline");
  EXPECT_EQ(by_run.at("powersgd_r4-seed2"), "dp=powersgd(rank=4)");
  EXPECT_EQ(by_run.at("topk_1pct-seed3"), "dp=topk(fraction=0.01)");
  EXPECT_EQ(by_run.at("fp16-seed1"), "dp=fp16");
  EXPECT_EQ(sweep_json(p)["runs"][0]["compression"], "baseline");
}

}  // namespace
}  // namespace optcc

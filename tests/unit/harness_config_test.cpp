// Config loading and validation: every error names the key, the value, the rule and the fix.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <yaml-cpp/yaml.h>

#include "compat/fused_attention.h"
#include "compat/torch_compat.h"
#include "harness/config/config.h"
#include "harness/train/trainer.h"
#include "tests/support/paths.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string write_yaml(const testing::TempDir& dir, const std::string& text) {
  const std::string path = dir / "exp.yaml";
  std::ofstream(path) << text;
  return path;
}

std::string load_error(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  testing::TempDir dir;
  try {
    load_config(write_yaml(dir, yaml), sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string validate_error(Config c, int64_t world = 1) {
  try {
    c.validate(world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAreValid) {
  Config c;
  c.model.vocab_size = 100;
  EXPECT_EQ(validate_error(c), "");
  EXPECT_EQ(c.num_micro_batches(), 2);  // 8 / (4 * 1)
}

TEST(Config, UnknownKeyNamesKeySuggestionAndKnownKeys) {
  auto msg = load_error("train:\n  warmup_step: 5\n");
  EXPECT_THAT(msg, HasSubstr("unknown key 'train.warmup_step'"));
  EXPECT_THAT(msg, HasSubstr("did you mean 'warmup_steps'?"));
  EXPECT_THAT(msg, HasSubstr("Known keys in 'train': micro_batch_size"));
  EXPECT_THAT(msg, HasSubstr("exp.yaml"));
}

TEST(Config, AliasesFromOtherFrameworksGetASuggestion) {
  EXPECT_THAT(load_error("", {"train.learning_rate=1"}), HasSubstr("unknown key 'train.learning_rate' (did you mean 'lr'?)"));
  EXPECT_THAT(load_error("model:\n  n_layer: 3\n"), HasSubstr("(did you mean 'num_layers'?)"));
}

TEST(Config, UnknownSectionListsSections) {
  auto msg = load_error("trian:\n  lr: 0.1\n");
  EXPECT_THAT(msg, HasSubstr("unknown section 'trian' (did you mean 'train'?)"));
  EXPECT_THAT(msg, HasSubstr("model, parallel, train, data, compression, diloco, network, log, checkpoint"));
}

TEST(Config, WrongTypeInFileAndInOverride) {
  auto msg = load_error("train:\n  lr: fast\n");
  EXPECT_THAT(msg, HasSubstr("train.lr = 'fast' is not a number"));
  EXPECT_THAT(msg, HasSubstr("current value is 0.001"));
  msg = load_error("", {"train.train_steps=1.5"});
  EXPECT_THAT(msg, HasSubstr("--set train.train_steps=1.5"));
  EXPECT_THAT(msg, HasSubstr("train.train_steps = '1.5' is not an integer"));
  msg = load_error("", {"network.emulate=1"});
  EXPECT_THAT(msg, HasSubstr("is not a boolean"));
  msg = load_error("data:\n  sources: brown\n");
  EXPECT_THAT(msg, HasSubstr("data.sources = 'brown' is not a list of strings"));
}

TEST(Config, MalformedOverride) {
  auto msg = load_error("", {"lr=0.1"});
  EXPECT_THAT(msg, HasSubstr("'lr=0.1' is not of the form section.key=value"));
}

TEST(Config, OverridesKeepTypesAndApplyInOrder) {
  testing::TempDir dir;
  auto c = load_config(write_yaml(dir, "train:\n  lr: 0.01\n"), {"train.lr=2e-4", "data.split=98,2,0",
                                                                  "parallel.stage_layers=[1, 1]"});
  EXPECT_DOUBLE_EQ(c.train.lr, 2e-4);
  EXPECT_EQ(c.data.split, "98,2,0");
  EXPECT_EQ(c.parallel.stage_layers, (std::vector<int64_t>{1, 1}));
}

TEST(Config, PresetFirstThenExplicitKeys) {
  auto path_text = "model:\n  num_layers: 3\n  preset: mini\n";
  testing::TempDir dir;
  auto c = load_config(write_yaml(dir, path_text));
  EXPECT_EQ(c.model.preset, "mini");
  EXPECT_EQ(c.model.hidden_size, 256);
  EXPECT_EQ(c.model.num_layers, 3);  // explicit key wins over the preset, whatever the order
  EXPECT_THAT(load_error("model:\n  preset: huge\n"),
              HasSubstr("model.preset = 'huge' is not a known preset. Known presets: tiny, mini"));
}

TEST(Config, BatchRuleNamesValuesAndFix) {
  Config c;
  c.model.vocab_size = 100;
  c.train.global_batch_size = 10;
  auto msg = validate_error(c);
  EXPECT_THAT(msg, HasSubstr("train.global_batch_size = 10"));
  EXPECT_THAT(msg, HasSubstr("must be a multiple of micro_batch_size * dp = 4 * 1 = 4"));
  EXPECT_THAT(msg, HasSubstr("set it to 8 or 12"));
}

TEST(Config, PrecisionNamesTheAcceptedValuesTheBuildAndTheLossScaleKeys) {
  Config c;
  c.model.vocab_size = 100;
  c.train.precision = "bf16";
  EXPECT_NO_THROW(c.validate(1));
  c.train.precision = "half";
  auto msg = validate_error(c);
  EXPECT_THAT(msg, HasSubstr("train.precision = 'half'"));
  EXPECT_THAT(msg, HasSubstr("must be one of fp32, bf16, fp16"));
  c.train.precision = "fp16";
  if (kCpuFp16Gemm || kBuiltWithCuda) {
    EXPECT_NO_THROW(c.validate(1));
  } else {  // LibTorch 1.13 on CPU: no fp16 GEMM
    msg = validate_error(c);
    EXPECT_THAT(msg, HasSubstr("train.precision = 'fp16'"));
    EXPECT_THAT(msg, HasSubstr(build_description()));
    EXPECT_THAT(msg, HasSubstr("Fix: use bf16"));
  }
  // Analytic tools (traffic model, simulator) model what this build cannot run.
  EXPECT_NO_THROW(c.validate(1, Config::BuildLimits::kAnyBuild));
  c.train.precision = "bf16";  // the loss scale acts only with fp16
  c.train.loss_scale_initial = 1024;
  msg = validate_error(c);
  EXPECT_THAT(msg, HasSubstr("train.loss_scale_initial = 1024: loss scaling acts only with train.precision: fp16 "
                             "(this run is bf16)"));
  c.train.loss_scale_initial = 65536;  // the default, as a dumped config lists it: accepted
  EXPECT_NO_THROW(c.validate(1));
  c.train.max_skipped_steps = -1;
  EXPECT_THAT(validate_error(c), HasSubstr("train.max_skipped_steps = -1"));
  Config y;  // from an override, through the same visit()
  apply_override(y, "train.precision=bf16");
  EXPECT_EQ(y.train.precision, "bf16");
}

// model.attention: auto | explicit | fused; fused draws no dropout and needs LibTorch >= 2.0.
TEST(Config, AttentionKernelNamesItsValuesDropoutAndTheBuild) {
  Config c;
  c.model.vocab_size = 100;
  EXPECT_EQ(c.model.attention, "auto");
  c.model.attention = "flash";
  auto msg = validate_error(c);
  EXPECT_THAT(msg, HasSubstr("model.attention = 'flash': must be one of auto, explicit, fused"));
  c.model.attention = "fused";  // the default attention_dropout 0.1: refused by any build
  try {
    c.validate(1, Config::BuildLimits::kAnyBuild);
    msg = "";
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  EXPECT_THAT(msg, HasSubstr("model.attention = 'fused': the fused kernel draws no attention dropout, but "
                             "model.attention_dropout = 0.1"));
  EXPECT_THAT(msg, HasSubstr("Fix: set model.attention_dropout: 0.0"));
  c.model.attention_dropout = 0.0;
  if (kHasFusedAttention) {
    EXPECT_NO_THROW(c.validate(1));
  } else {  // LibTorch 1.13: no at::scaled_dot_product_attention
    msg = validate_error(c);
    EXPECT_THAT(msg, HasSubstr("model.attention = 'fused': needs LibTorch >= 2.0"));
    EXPECT_THAT(msg, HasSubstr(build_description()));
  }
  EXPECT_NO_THROW(c.validate(1, Config::BuildLimits::kAnyBuild));  // a cluster's build may have it
  Config y;
  apply_override(y, "model.attention=explicit");
  EXPECT_EQ(gpt_options(y).attention, AttentionKernel::kExplicit);
}

// parallel.grad_reduce_dtype: fp32 | compute; compute on a 16-bit run needs a stage that reduces
// uncompressed (where it acts).
TEST(Config, GradReduceDtypeNamesItsValuesAndWhereItActs) {
  Config c;
  c.model.vocab_size = 100;
  c.parallel.pp = 2;
  c.model.num_layers = 2;
  c.parallel.grad_reduce_dtype = "bf16";
  auto msg = validate_error(c, 2);
  EXPECT_THAT(msg, HasSubstr("parallel.grad_reduce_dtype = 'bf16'"));
  EXPECT_THAT(msg, HasSubstr("must be fp32 or compute"));
  c.parallel.grad_reduce_dtype = "compute";
  EXPECT_NO_THROW(c.validate(2));  // fp32 run: compute = fp32
  c.train.precision = "bf16";
  EXPECT_NO_THROW(c.validate(2));  // dp none: every stage reduces uncompressed
  apply_override(c, "compression.dp={name: powersgd, rank: 4}");
  msg = validate_error(c, 2);
  EXPECT_THAT(msg, HasSubstr("parallel.grad_reduce_dtype = 'compute'"));
  EXPECT_THAT(msg, HasSubstr("compression.dp = powersgd compresses them on all 2 stages"));
  EXPECT_THAT(msg, HasSubstr("Fix: set parallel.grad_reduce_dtype: fp32, or let some stages reduce uncompressed"));
  apply_override(c, "compression.dp=bf16");  // a 16-bit cast already: the fix says so
  EXPECT_THAT(validate_error(c, 2), HasSubstr("Fix: set parallel.grad_reduce_dtype: fp32 (compression.dp: bf16 "
                                              "already sends every DP gradient in 16 bits)"));
  apply_override(c, "compression.dp={name: powersgd, rank: 4}");
  apply_override(c, "compression.dp_stages=1");  // stage 1 reduces uncompressed
  EXPECT_NO_THROW(c.validate(2));
}

std::string load_text_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    (void)load_config_text(yaml, "t.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// yaml-cpp keeps a repeated key and lookups see one of them: a key or a section written twice is
// refused with its path and both lines, in a file and in a --set value; anchors and aliases work.
TEST(Config, RepeatedKeysAreRefusedNamingBothLines) {
  EXPECT_THAT(load_text_error("train:\n  lr: 0.001\n  seed: 3\n  lr: 0.002\n"),
              AllOf(HasSubstr("config error (t.yaml): key train.lr (lines 2 and 4) is written twice"),
                    HasSubstr("Fix: keep one")));
  EXPECT_THAT(load_text_error("train:\n  lr: 0.001\nmodel:\n  preset: tiny\ntrain:\n  seed: 3\n"),
              HasSubstr("key train (lines 1 and 5) is written twice"));
  EXPECT_THAT(load_text_error("compression:\n  dp: {name: powersgd, rank: 4, rank: 8}\n"),
              HasSubstr("key compression.dp.rank (lines 2 and 2)"));
  EXPECT_THAT(load_text_error("", {"compression.dp={name: topk, name: powersgd}"}),
              HasSubstr("config error (--set compression.dp={name: topk, name: powersgd}): key name (lines 1 and 1)"));
  const Config c = load_config_text("compression:\n  dp: &psgd {name: powersgd, rank: 4}\n  embedding: *psgd\n", "t.yaml");
  EXPECT_EQ(c.compression.embedding.name, "powersgd");
  EXPECT_EQ(c.compression.embedding.options["rank"].as<int>(), 4);
  EXPECT_EQ(repeated_yaml_key(YAML::Load("a: [{b: 1, c: 2}, {b: 1, b: 2}]")), "a[1].b (lines 1 and 1)");
  EXPECT_EQ(repeated_yaml_key(YAML::Load("a: {b: 1}\nc: {b: 1}")), "");
}

// log.run_name is one path component inside log.dir, checked before any work.
TEST(Config, RunNameIsOneFileNameInsideLogDir) {
  Config c;
  c.model.vocab_size = 100;
  for (const std::string& bad : std::vector<std::string>{"a/b", "..", "../escape", ".hidden", "-x", "tab\there"}) {
    c.log.run_name = bad;
    const std::string msg = validate_error(c);
    EXPECT_THAT(msg, HasSubstr("log.run_name = '" + bad + "'")) << bad;
    EXPECT_THAT(msg, HasSubstr("names one file and one folder inside log.dir")) << bad;
  }
  for (const std::string& good :
       std::vector<std::string>{"demo-3d", "my run, v2", "it's \"quoted\"", "\u00e9t\u00e9-\u5b9f\u9a13", "a..b"}) {
    c.log.run_name = good;
    EXPECT_EQ(validate_error(c), "") << good;
  }
}

// An empty validation split where evaluation is asked for is refused before any work.
TEST(Config, EmptyValidationSplitIsRefusedWhereEvaluationIsAskedFor) {
  Config c;
  c.model.vocab_size = 100;
  c.data.split = "100,0,0";
  const std::string msg = validate_error(c);
  EXPECT_THAT(msg, HasSubstr("data.split = '100,0,0': gives the validation split no weight, but train.eval_interval "
                             "= 50 asks for evaluation"));
  EXPECT_THAT(msg, HasSubstr("set train.eval_interval: 0"));
  c.train.eval_interval = 0;
  EXPECT_EQ(validate_error(c), "");
}

TEST(Config, HeadsDivisibleByTensorParallel) {  // BR-16
  Config c;
  c.model.vocab_size = 100;
  c.model.num_heads = 12;
  c.model.hidden_size = 96;
  c.parallel.tp = 8;
  c.train.global_batch_size = 4;
  auto msg = validate_error(c, 8);
  EXPECT_THAT(msg, HasSubstr("model.num_heads = 12: must be divisible by parallel.tp = 8"));
  EXPECT_THAT(msg, HasSubstr("1, 2, 3, 4, 6, 12"));
  c.model.num_heads = 24;  // the Optimus-CC 2.5B control: 3 heads per rank
  c.model.hidden_size = 1920;
  EXPECT_EQ(validate_error(c, 8), "");
}

TEST(Config, LayersOverStages) {  // BR-14
  Config c;
  c.model.vocab_size = 100;
  c.model.num_layers = 30;
  c.parallel.pp = 4;
  auto msg = validate_error(c, 4);
  EXPECT_THAT(msg, HasSubstr("model.num_layers = 30: is not divisible by parallel.pp = 4"));
  EXPECT_THAT(msg, HasSubstr("parallel.stage_layers"));
  c.parallel.stage_layers = {8, 8, 7, 6};
  EXPECT_THAT(validate_error(c, 4), HasSubstr("sum 29: must add up to model.num_layers = 30"));
  c.parallel.stage_layers = {8, 8, 7, 7};
  EXPECT_EQ(validate_error(c, 4), "");
  c.model.num_layers = 52;  // 2.5B on 4 stages, even split
  c.parallel.stage_layers.clear();
  EXPECT_EQ(validate_error(c, 4), "");
}

// parallel.schedule and parallel.virtual_stages: the schedule's own rules (schedule.h), each refusal
// naming the key, the value and the fix.
TEST(Config, ScheduleAndVirtualStages) {
  Config c;
  c.model.vocab_size = 100;
  c.model.num_layers = 8;
  c.parallel.pp = 2;
  c.train.micro_batch_size = 1;
  c.train.global_batch_size = 4;  // m = 4
  c.parallel.schedule = "interleaved_1f1b";
  c.parallel.virtual_stages = 2;
  EXPECT_EQ(validate_error(c, 2), "");
  c.parallel.schedule = "pipedream";
  EXPECT_THAT(validate_error(c, 2),
              HasSubstr("parallel.schedule = 'pipedream': must be 1f1b, gpipe, interleaved_1f1b or zb_h1"));
  c.parallel.schedule = "1f1b";
  EXPECT_THAT(validate_error(c, 2),
              AllOf(HasSubstr("parallel.virtual_stages = 2"), HasSubstr("only interleaved_1f1b runs more")));
  c.parallel.schedule = "interleaved_1f1b";
  c.parallel.virtual_stages = 1;
  EXPECT_THAT(validate_error(c, 2), AllOf(HasSubstr("parallel.virtual_stages = 1"), HasSubstr("at least 2")));
  c.parallel.virtual_stages = 0;
  EXPECT_THAT(validate_error(c, 2), HasSubstr("parallel.virtual_stages = 0"));
  c.parallel.virtual_stages = 3;  // 8 layers over 2 x 3 virtual stages
  EXPECT_THAT(validate_error(c, 2), HasSubstr("model.num_layers = 8: is not divisible by parallel.pp * "
                                              "parallel.virtual_stages = 2 * 3 = 6"));
  c.parallel.virtual_stages = 2;
  c.train.global_batch_size = 3;  // m = 3 on 2 stages
  EXPECT_THAT(validate_error(c, 2), AllOf(HasSubstr("parallel.schedule = 'interleaved_1f1b'"),
                                          HasSubstr("must be a multiple of the stages"),
                                          HasSubstr("train.global_batch_size that gives 2 or 4 micro-batches")));
  c.train.global_batch_size = 4;
  c.parallel.stage_layers = {5, 3};
  EXPECT_THAT(validate_error(c, 2), HasSubstr("parallel.stage_layers = 2 entries: cannot be set with interleaved_1f1b"));
  c.parallel.stage_layers.clear();
  c.log.lep_diagnostics = true;
  EXPECT_THAT(validate_error(c, 2), HasSubstr("log.lep_diagnostics = true: records one stage boundary per stage"));
  c.log.lep_diagnostics = false;
  c.parallel.pp = 1;  // one stage: nothing to interleave
  EXPECT_THAT(validate_error(c, 1), HasSubstr("it needs at least 2"));
  c.parallel.pp = 2;
  c.parallel.schedule = "zb_h1";
  EXPECT_THAT(validate_error(c, 2), AllOf(HasSubstr("parallel.virtual_stages = 2"), HasSubstr("not 2")));
  c.parallel.virtual_stages = 1;
  c.train.global_batch_size = 3;  // any m
  EXPECT_EQ(validate_error(c, 2), "");
}

TEST(Config, WorldSizeMustMatchLayout) {
  Config c;
  c.model.vocab_size = 100;
  c.parallel.tp = 2;
  EXPECT_THAT(validate_error(c, 1), HasSubstr("parallel.tp*pp*dp = 2*1*1 = 2: must equal the number of ranks, 1"));
}

// A zero or negative layout size is named before any check divides by it (it once ended
// `config show` with SIGFPE in heads % tp).
TEST(Config, LayoutSizesMustBePositive) {
  for (const char* key : {"tp", "pp", "dp"}) {
    for (int64_t v : {0, -2}) {
      Config c;
      c.model.vocab_size = 100;
      (std::string(key) == "tp" ? c.parallel.tp : std::string(key) == "pp" ? c.parallel.pp : c.parallel.dp) = v;
      EXPECT_THAT(validate_error(c, 1), HasSubstr(fmt::format("parallel.{} = {}", key, v))) << key << " " << v;
    }
  }
}

TEST(Config, NegativeRanksPerNodeAndVocabAreNamed) {
  Config c;
  c.model.vocab_size = 100;
  c.parallel.ranks_per_node = -1;
  EXPECT_THAT(validate_error(c, 1), HasSubstr("parallel.ranks_per_node = -1: must be >= 0"));
  c.parallel.ranks_per_node = 0;  // the launcher's local world size
  EXPECT_EQ(validate_error(c, 1), "");
  c.model.vocab_size = -1;  // not "take it from the dataset" (0): resolve_vocab leaves it, validate names it
  resolve_vocab(c);
  EXPECT_EQ(c.model.vocab_size, -1);
  EXPECT_THAT(validate_error(c, 1), HasSubstr("model.vocab_size = -1: must be >= 0"));
}

// data.split is checked with the dataset's own rule before any rank starts (it was only found by
// the trainer's open_data, after launch, and `config show` / `sweep --check` passed it).
TEST(Config, MalformedDataSplitIsNamed) {
  Config c;
  c.model.vocab_size = 100;
  c.data.split = "bogus";
  EXPECT_THAT(validate_error(c, 1), HasSubstr("data.split = 'bogus'"));
  EXPECT_THAT(validate_error(c, 1), HasSubstr("'bogus' is not a decimal number"));
  c.data.split = "0,0,0";
  EXPECT_THAT(validate_error(c, 1), HasSubstr("the weights sum to 0"));
  c.train.eval_interval = 0;  // "1" leaves no validation split: fine without evaluation
  for (const char* ok : {"949,50,1", "90/10", "1"}) {
    c.data.split = ok;
    EXPECT_EQ(validate_error(c, 1), "") << ok;
  }
}

TEST(Config, VocabPaddingToDivisorTimesTp) {  // BR-15
  Config c;
  c.model.vocab_size = 50257;
  EXPECT_EQ(c.padded_vocab_size(), 50304);
  c.parallel.tp = 8;
  EXPECT_EQ(c.padded_vocab_size(), 51200);
  c.parallel.tp = 2;
  EXPECT_EQ(c.padded_vocab_size(), 50432);
}

TEST(Config, EffectiveYamlRoundTrips) {
  testing::TempDir dir;
  auto c = load_config(write_yaml(dir, "model:\n  preset: mini\ntrain:\n  lr: 0.0003\n  seed: 7\n"));
  const std::string yaml = to_yaml(c);
  const std::string path = dir / "effective.yaml";
  std::ofstream(path) << yaml;
  auto c2 = load_config(path);
  EXPECT_EQ(to_yaml(c2), yaml);
  EXPECT_DOUBLE_EQ(c2.train.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c2.model.hidden_dropout, 0.1);
}

TEST(Config, VocabFromDatasetOrClearError) {
  testing::TempDir dir;
  Config c;
  c.data.prefix = dir / "missing";
  try {
    resolve_vocab(c);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("missing.json does not exist"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("optcc data prepare"));
  }
  c.data.prefix = dir / "corpus";
  testing::write_synthetic_corpus(c.data.prefix, 96, 4);
  resolve_vocab(c);
  EXPECT_EQ(c.model.vocab_size, 96);
}

// The issue's case: model.vocab_size below the dataset's ids ended in "index out of range in
// self" (or "Target 261 is out of bounds") with a LibTorch backtrace at the first step.
TEST(Config, DatasetTokenIdsMustFitTheModelVocabulary) {
  Config c;
  c.data.prefix = "data/corpus";
  c.source_path = "exp.yaml";
  c.model.vocab_size = 200;
  auto error = [&](int64_t lo, int64_t hi, int64_t dataset_vocab) -> std::string {
    try {
      check_dataset_vocab(c, lo, hi, dataset_vocab);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error(0, 199, 200), "");
  EXPECT_EQ(error(0, 150, 0), "");  // no .json (Megatron data): the ids decide
  EXPECT_THAT(error(0, 261, 287), AllOf(HasSubstr("model.vocab_size = 200"), HasSubstr("up to 261"),
                                        HasSubstr("vocab_size 287"), HasSubstr("data.vocab_size <= 200"),
                                        HasSubstr("at least 287"), HasSubstr("0 (take it from the dataset)")));
  EXPECT_THAT(error(0, 261, 0), AllOf(HasSubstr("model.vocab_size = 200"), HasSubstr("at least 262")));
  EXPECT_THAT(error(0, 300, 287), AllOf(HasSubstr("token id 300"), HasSubstr("vocab_size 287"),
                                        HasSubstr("--retrain")));  // .bin and .json disagree
  EXPECT_THAT(error(-3, 10, 287), AllOf(HasSubstr("negative token id -3"), HasSubstr("--retrain")));
}

// The paper configs set model.vocab_size 50257 (GPT-2's BPE) on data.prefix data/corpus, an
// 8000-piece corpus: every id is below 50257, so the id check alone let a paper run train on the
// wrong data. The tokenizer record (<prefix>.json vocab_size) must equal model.vocab_size.
TEST(Config, DatasetOfAnotherTokenizerIsRefusedThoughItsIdsFit) {
  Config c;
  c.data.prefix = "data/corpus";
  c.source_path = "experiments/paper/gpt-2.5b.yaml";
  c.model.vocab_size = 50257;
  std::string msg;
  try {
    check_dataset_vocab(c, 0, 7999, 8000);
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  EXPECT_THAT(msg, AllOf(HasSubstr("model.vocab_size = 50257"), HasSubstr("a vocabulary of 8000 pieces"),
                         HasSubstr("data/corpus.json"), HasSubstr("data/corpus.model"),
                         HasSubstr("dataset prepared with a tokenizer of 50257 pieces"),
                         HasSubstr("model.vocab_size: 0"), HasSubstr("gpt-2.5b.yaml")));
  EXPECT_NO_THROW(check_tokenizer_vocab(c, 50257));
  EXPECT_NO_THROW(check_tokenizer_vocab(c, 0));  // no .json: nothing known of the tokenizer
  EXPECT_THROW(check_tokenizer_vocab(c, 50258), ConfigError);

  testing::TempDir dir;
  EXPECT_EQ(prepared_vocab_size(dir / "missing"), 0);
  testing::write_synthetic_corpus(dir / "corpus", 96, 4);
  EXPECT_EQ(prepared_vocab_size(dir / "corpus"), 96);
  std::ofstream(std::string(dir / "bad") + ".json") << "{\"documents\": 3}";
  EXPECT_THROW(prepared_vocab_size(dir / "bad"), ConfigError);
}

// parallel.device / parallel.backend default to auto (cpu + gloo in a CPU build); cuda and nccl are
// refused by a build without CUDA, naming the build and the fix, and accepted by a CUDA build
// (the machine's GPUs are checked at start-up: PlacementTest in placement_test.cpp).
TEST(Config, GpuSettingsAreRefusedByABuildThatCannotRunThem) {
  Config c;
  EXPECT_EQ(c.parallel.device, "auto");
  EXPECT_EQ(c.parallel.backend, "auto");
  EXPECT_EQ(validate_error(c), "");
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"backend", "nccl"}, {"device", "cuda"}}) {
    Config g;
    (key == "backend" ? g.parallel.backend : g.parallel.device) = value;
    const std::string msg = validate_error(g);
    if (kBuiltWithCuda) {
      EXPECT_EQ(msg, "") << key;
    } else {
      EXPECT_THAT(msg, AllOf(HasSubstr("parallel." + key + " = '" + value + "'"),
                             HasSubstr("LibTorch " + torch_version() + ", CPU only (built without CUDA)"),
                             HasSubstr("Fix: set parallel." + key + ": " + (key == "device" ? "cpu" : "gloo"))));
    }
  }
  c.parallel.backend = "mpi";
  EXPECT_THAT(validate_error(c), HasSubstr("parallel.backend = 'mpi': must be auto, gloo or nccl"));
  c.parallel.backend = "nccl";
  c.parallel.device = "cpu";
  EXPECT_THAT(validate_error(c), HasSubstr(kBuiltWithCuda ? "NCCL carries CUDA tensors only" : "CPU only"));
}

TEST(Config, TrainingRefusesADatasetBeyondTheModelVocabularyBeforeTheFirstStep) {
  testing::TempDir dir;
  Config c;
  c.data.prefix = dir / "corpus";
  c.data.dir = dir / "data";
  c.data.split = "90,10,0";
  c.log.dir = dir / "results";
  c.train.train_steps = 2;
  c.train.threads = 1;
  c.model.seq_len = 32;
  testing::write_synthetic_corpus(c.data.prefix, 300, 20);
  c.model.vocab_size = 128;
  TrainOptions opt;
  opt.quiet = true;
  try {
    run_training(c, opt);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("model.vocab_size = 128"), HasSubstr("vocab_size 300")));
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "results")) << "no step may run";
}

}  // namespace
}  // namespace optcc

namespace optcc {
namespace {

TEST(Config, CompressorByNameOrMappingWithOptions) {
  testing::TempDir dir;
  auto c = load_config(write_yaml(dir, "compression:\n  dp: {name: powersgd, rank: 4, error_feedback: false}\n"));
  EXPECT_EQ(c.compression.dp.name, "powersgd");
  EXPECT_EQ(c.compression.dp.options["rank"].as<int>(), 4);
  EXPECT_FALSE(c.compression.dp.options["name"]);
  EXPECT_EQ(to_yaml_value(c.compression.dp), "{name: powersgd, rank: 4, error_feedback: false}");
  c.model.vocab_size = 100;
  EXPECT_EQ(validate_error(c), "");
  // The effective YAML reloads to the same spec.
  const std::string path = dir / "effective.yaml";
  std::ofstream(path) << to_yaml(c);
  EXPECT_EQ(to_yaml_value(load_config(path).compression.dp), to_yaml_value(c.compression.dp));
  // --set with a plain name.
  auto c2 = load_config("", {"compression.dp=fp16"});
  EXPECT_EQ(c2.compression.dp.name, "fp16");
}

TEST(Config, UnknownCompressorOrOptionIsNamed) {
  Config c;
  c.model.vocab_size = 100;
  c.compression.dp.name = "topkk";
  auto msg = validate_error(c);
  EXPECT_THAT(msg, HasSubstr("compression.dp = 'topkk'"));
  EXPECT_THAT(msg, HasSubstr("powersgd"));  // the known ones are listed
  c = load_config("", {"compression.dp={name: powersgd, rnk: 4}"});
  c.model.vocab_size = 100;
  EXPECT_THAT(validate_error(c), HasSubstr("unknown option 'rnk'"));
  EXPECT_THAT(load_error("compression:\n  dp: [powersgd]\n"), HasSubstr("is not a compressor name or a mapping"));
  // Pipeline codecs: the model's hidden size is filled in; unknown names and bad options are named.
  c = load_config("", {"compression.pipeline_backward=lowrank"});
  c.model.vocab_size = 100;
  EXPECT_EQ(validate_error(c), "");
  EXPECT_EQ(pipeline_codec_options(c, c.compression.pipeline_backward)["hidden"].as<int64_t>(), c.model.hidden_size);
  c = load_config("", {"compression.pipeline_forward=lowrnk"});
  c.model.vocab_size = 100;
  EXPECT_THAT(validate_error(c), AllOf(HasSubstr("compression.pipeline_forward = 'lowrnk'"), HasSubstr("int8")));
  c = load_config("", {"compression.pipeline_backward={name: lowrank, view: diagonal}"});
  c.model.vocab_size = 100;
  EXPECT_THAT(validate_error(c), HasSubstr("'view' is 'diagonal'"));
  for (const auto& [set, expect] : std::vector<std::pair<std::string, std::string>>{
           {"compression.tp=powersgd", "compression.tp = 'powersgd'"},
           {"compression.embedding=powersgdd", "compression.embedding = 'powersgdd'"}}) {
    c = load_config("", {set});
    c.model.vocab_size = 100;
    EXPECT_THAT(validate_error(c), HasSubstr(expect)) << set;
  }
  // The pipeline policy's names are parsed when the config is loaded (compression/pipeline_policy.h).
  for (const auto& [set, expect] : std::vector<std::pair<std::string, std::string>>{
           {"compression.lep=sometimes",
            "compression.lep = 'sometimes' is not one of off, lazy, per_microbatch, lazy_iteration, lazy_decay"},
           {"compression.lep=lazy_iter", "compression.lep = 'lazy_iter' is not one of off, lazy"},
           {"compression.backward_phases=steady", "compression.backward_phases = 'steady' is not one of all, epilogue"},
           {"compression.dp_stages=first3", "compression.dp_stages = 'first3' is not all, auto or a positive integer"}}) {
    try {
      load_config("", {set});
      ADD_FAILURE() << set << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr(expect)) << set;
    }
  }
}

TEST(Config, SchemesSetThePaperRowsAndExplicitKeysOverrideThem) {
  testing::TempDir dir;
  auto load = [&](const std::string& text) {
    const std::string path = dir / "s.yaml";
    std::ofstream(path) << text;
    return load_config(path);
  };
  Config cb = load("compression:\n  lep: off\n  scheme: cb\n");  // scheme first, whatever the order
  EXPECT_EQ(cb.compression.pipeline_backward.name, "lowrank");
  EXPECT_EQ(cb.compression.pipeline_backward.options["rank"].as<int64_t>(), 16);
  EXPECT_EQ(cb.compression.backward_phases, BackwardPhases::kEpilogue);
  EXPECT_EQ(cb.compression.lep, LepMode::kOff);  // the explicit key wins
  EXPECT_FALSE(cb.compression.fused_embedding);
  Config sc = load_config("", {"compression.scheme=cb_fe_sc"});
  EXPECT_TRUE(sc.compression.fused_embedding);
  EXPECT_EQ(sc.compression.dp.name, "powersgd");
  EXPECT_EQ(sc.compression.dp.options["rank"].as<int64_t>(), 128);
  EXPECT_EQ(sc.compression.dp_stages.text(), "3");
  EXPECT_EQ(sc.compression.lep, LepMode::kLazy);
  EXPECT_EQ(load_config("", {"compression.scheme=cb_nonlep"}).compression.lep, LepMode::kOff);
  // --set compression.scheme applies first wherever it stands, as inside a file.
  EXPECT_EQ(load_config("", {"compression.lep=off", "compression.scheme=cb"}).compression.lep, LepMode::kOff);
  // The Fig. 11 check needs CB with LEP on every backward send (docs/design.md §3.3).
  Config fig11 = load_config("", {"compression.scheme=cb", "log.lep_orthogonality=true"});
  fig11.model.vocab_size = 100;
  EXPECT_THAT(validate_error(fig11), HasSubstr("backward_phases: all"));
  fig11.compression.backward_phases = BackwardPhases::kAll;
  EXPECT_EQ(validate_error(fig11), "");
  fig11.compression.lep = LepMode::kOff;
  EXPECT_THAT(validate_error(fig11), HasSubstr("log.lep_orthogonality = true"));
  // LEP variants (paper/lep-study.md): lep_decay is a factor in (0, 1] and only lazy_decay reads it.
  Config decay = load_config("", {"compression.scheme=cb", "compression.lep=lazy_decay", "compression.lep_decay=0.5"});
  decay.model.vocab_size = 100;
  EXPECT_EQ(validate_error(decay), "");
  decay.compression.lep_decay = 0.0;
  EXPECT_THAT(validate_error(decay), HasSubstr("compression.lep_decay = 0: must be in (0, 1]"));
  decay.compression.lep_decay = 0.5;
  decay.compression.lep = LepMode::kLazy;
  EXPECT_THAT(validate_error(decay), HasSubstr("is only used by compression.lep: lazy_decay"));
  decay.compression.lep = LepMode::kLazyIteration;
  decay.compression.lep_decay = 1.0;
  EXPECT_EQ(validate_error(decay), "");
  // ... and both act on compressed backward sends only: without a codec they would be ignored.
  Config nocodec = load_config("", {"compression.lep=lazy_decay", "compression.lep_decay=0.5"});
  nocodec.model.vocab_size = 100;
  EXPECT_THAT(validate_error(nocodec), HasSubstr("compression.lep = 'lazy_decay': acts on compressed backward sends"));
  nocodec.compression.lep = LepMode::kOff;
  nocodec.compression.lep_decay = 1.0;
  EXPECT_THAT(validate_error(nocodec), HasSubstr("compression.lep = 'off': acts on compressed backward sends"));
  nocodec.compression.lep = LepMode::kLazy;  // the default, which every uncompressed config carries
  EXPECT_EQ(validate_error(nocodec), "");
  Config diag = load_config("", {"log.lep_diagnostics=true"});
  diag.model.vocab_size = 100;
  EXPECT_THAT(validate_error(diag), HasSubstr("log.lep_diagnostics = true"));
  diag.compression.pipeline_backward.name = "lowrank";
  EXPECT_EQ(validate_error(diag), "");
  Config base = load_config("", {"compression.scheme=cb", "compression.scheme=baseline"});  // resets
  base.compression.scheme = "";
  EXPECT_EQ(to_yaml(base), to_yaml(Config{}));
  // Copies are deep: applying a scheme to a copy leaves the original's options alone.
  Config orig = load_config("", {"compression.dp={name: powersgd, rank: 4}"});
  Config copy = orig;
  apply_compression_scheme(copy.compression, "cb");
  EXPECT_EQ(orig.compression.dp.options["rank"].as<int64_t>(), 4);
  EXPECT_EQ(copy.compression.dp.name, "none");
  // The effective YAML reloads to the same config.
  const std::string path = dir / "effective.yaml";
  std::ofstream(path) << to_yaml(cb);
  EXPECT_EQ(to_yaml(load_config(path)), to_yaml(cb));
  EXPECT_THAT(load_error("compression:\n  scheme: cb_fe_sc_x\n"),
              AllOf(HasSubstr("compression.scheme = 'cb_fe_sc_x'"), HasSubstr("cb_fe_sc, cb_nonlep")));
}

// scripts/config_keys_added.yaml: the value older builds ran as, for each key added since results
// were first written; the results reader fills a key missing from an older file with it. Each must
// equal today's default (a key whose default changed later keeps its old value there, named here).
TEST(ConfigKeysAdded, EachValueIsTheDefaultItWasAddedWith) {
  const std::set<std::string> changed_since = {};  // "section.key" whose default changed after it was added
  const YAML::Node added = YAML::LoadFile(std::string(optcc::testing::source_dir()) + "/scripts/config_keys_added.yaml");
  const YAML::Node defaults = YAML::Load(to_yaml(Config{}));
  int checked = 0;
  for (const auto& section : added) {
    const std::string name = section.first.as<std::string>();
    for (const auto& key : section.second) {
      const std::string k = key.first.as<std::string>();
      const std::string where = name + "." + k;
      const YAML::Node now = defaults[name][k];
      ASSERT_TRUE(now.IsDefined()) << where << " is not a key of the config (harness/config/config.h)";
      if (changed_since.count(where) > 0) continue;
      const std::string a = key.second.as<std::string>(), b = now.as<std::string>();
      double x = 0, y = 0;
      const bool numbers = YAML::convert<double>::decode(key.second, x) && YAML::convert<double>::decode(now, y);
      if (numbers) {
        EXPECT_EQ(x, y) << where;
      } else {
        EXPECT_EQ(a, b) << where;
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
}

}  // namespace
}  // namespace optcc

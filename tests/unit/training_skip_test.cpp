// A step with an inf in one rank's local gradients (harness/train/loss_scaler.h): every rank skips
// it, and every piece of state a checkpoint holds (weights, AdamW moments, PowerSGD's error
// feedback and Q, CB's Q and generator, LEP buffers, the loss scaler) is bit-identical before and
// after it, compared tensor by tensor across every rank's checkpoint; fp16's scale backs off and
// grows back on its schedule. PP2 x DP2, cb_fe_sc, ranks as threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <H5Cpp.h>
#include <fmt/format.h>

#include <filesystem>
#include <limits>
#include <set>
#include <sstream>

#include "compat/torch_compat.h"
#include "harness/config/config.h"
#include "harness/parallel/distributed.h"
#include "harness/train/resume_check.h"
#include "harness/train/trainer.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/small_training.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

constexpr int64_t kInfStep = 3;  // the step whose gradients get the inf
constexpr int kInfRank = 3;      // on this global rank only (last stage, second replica)

Config skip_config(const testing::TempDir& dir, const std::string& precision) {
  Config c = testing::small_training_config(dir, {1, 2, 2}, "skip");  // tests/support/small_training.h
  c.data.split = "100,0,0";  // no validation split
  c.train.train_steps = 8;
  c.train.precision = precision;
  c.train.skip_nonfinite = true;  // fp32/bf16 skip only when allowed (else they stop: NonFiniteGradient below)
  if (precision == "fp16") {
    c.train.loss_scale_initial = 1024.0;
    c.train.loss_scale_growth_interval = 4;
  }
  apply_compression_scheme(c.compression, "cb_fe_sc");
  c.compression.dp.options["rank"] = 2;  // compresses the 32-wide matrices
  c.compression.dp.options["warmup_steps"] = 0;
  c.checkpoint.interval = 1;
  c.checkpoint.keep = 0;  // all of them
  return c;
}

// Every tensor under `a` equals the one under the same key of `b` (bit for bit), except the step,
// the data position and the generators, which a skipped step advances by design, and fp16's loss
// scale, which it backs off (checked on its own). Returns the number of tensors compared.
int64_t expect_same_state(torch::serialize::InputArchive& a, torch::serialize::InputArchive& b,
                          const std::string& where, const std::string& prefix = "") {
  static const std::set<std::string> advancing = {"meta/step", "meta/consumed_samples"};
  int64_t compared = 0;
  for (const auto& key : a.keys()) {
    const std::string name = prefix + key;
    if (advancing.count(name) || name.rfind("rng/", 0) == 0 || name.rfind("state/loss_scaler", 0) == 0) continue;
    torch::Tensor ta, tb;
    if (a.try_read(key, ta)) {
      EXPECT_TRUE(b.try_read(key, tb)) << where << ": " << name << " missing after the skip";
      if (!tb.defined()) continue;
      EXPECT_TRUE(ta.sizes() == tb.sizes() && ta.scalar_type() == tb.scalar_type() && torch::equal(ta, tb))
          << where << ": " << name << " changed in the skipped step";
      compared += 1;
      continue;
    }
    torch::serialize::InputArchive sa, sb;
    if (a.try_read(key, sa)) {
      EXPECT_TRUE(b.try_read(key, sb)) << where << ": " << name << " missing after the skip";
      compared += expect_same_state(sa, sb, where, name + "/");
    }
  }
  return compared;
}

std::vector<double> read_doubles(const std::string& file, const std::string& path) {
  H5::H5File f(file, H5F_ACC_RDONLY);
  auto ds = f.openDataSet(path);
  hsize_t n = 0;
  ds.getSpace().getSimpleExtentDims(&n);
  std::vector<double> v(n);
  ds.read(v.data(), H5::PredType::NATIVE_DOUBLE);
  return v;
}

// `value` goes into one gradient of rank kInfRank at step kInfStep (an inf, or a finite value the
// DP wire cannot carry); `grad_reduce_dtype` as parallel.grad_reduce_dtype.
void run_with_an_inf(const std::string& precision, const std::string& grad_reduce_dtype = "fp32",
                     float value = std::numeric_limits<float>::infinity()) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  Config cfg = skip_config(dir, precision);
  cfg.parallel.grad_reduce_dtype = grad_reduce_dtype;
  if (grad_reduce_dtype == "compute") cfg.compression.dp_stages = DpStages::first(1);  // stage 1 reduces uncompressed
  TrainSummary summary;
  testing::run_layout({1, 2, 2}, [&](int rank, Distributed& dist) {
    TrainOptions opt;
    opt.quiet = true;
    opt.on_local_gradients = [value](int64_t step, int r, const std::vector<torch::Tensor>& grads) {
      if (step == kInfStep && r == kInfRank) grads.front().view({-1})[0] = value;
    };
    auto s = run_training(cfg, opt, dist);
    if (rank == 0) summary = s;
  });
  ASSERT_EQ(summary.skipped_steps, 1);
  const auto skipped = read_doubles(summary.results_path, "/train/skipped");
  ASSERT_EQ(skipped.size(), 8u);
  for (size_t i = 0; i < skipped.size(); ++i) EXPECT_EQ(skipped[i], i + 1 == kInfStep ? 1.0 : 0.0) << "step " << i + 1;
  int64_t compared = 0;
  const auto ckpt = std::filesystem::path(cfg.checkpoint_dir());
  for (int rank = 0; rank < 4; ++rank) {
    const auto file = [&](int64_t step) {
      return (ckpt / fmt::format("iter_{:07d}", step) / fmt::format("rank_{:05d}.pt", rank)).string();
    };
    torch::serialize::InputArchive before, after;
    before.load_from(file(kInfStep - 1));
    after.load_from(file(kInfStep));
    compared += expect_same_state(before, after, fmt::format("{} rank {}", precision, rank));
  }
  EXPECT_GT(compared, 4 * 30) << "the comparison saw too few tensors to mean anything";
  // The run goes on: the steps after the skip update the weights again.
  torch::serialize::InputArchive last, skip;
  last.load_from((ckpt / "iter_0000008" / "rank_00000.pt").string());
  skip.load_from((ckpt / fmt::format("iter_{:07d}", kInfStep) / "rank_00000.pt").string());
  torch::Tensor w_last, w_skip;
  last.read("model/embedding.weight", w_last);
  skip.read("model/embedding.weight", w_skip);
  EXPECT_FALSE(torch::equal(w_last, w_skip));
  if (precision == "fp16") {  // 1024 for steps 1-3, backed off to 512 by the inf, grown back after 4 clean steps
    const auto scales = read_doubles(summary.results_path, "/train/loss_scale");
    EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 1024, 512, 512, 512, 512, 1024}));
  } else {
    EXPECT_EQ(read_doubles(summary.results_path, "/train/loss_scale"), std::vector<double>(8, 1.0));
  }
}

TEST(SkippedStep, Fp32InfOnOneRankChangesNoStateAnywhere) { run_with_an_inf("fp32"); }

TEST(SkippedStep, Bf16InfOnOneRankChangesNoStateAnywhere) { run_with_an_inf("bf16"); }

TEST(SkippedStep, Fp16InfOnOneRankChangesNoStateAndTheScaleBacksOffAndGrowsBack) {
  if (!kCpuFp16Gemm) GTEST_SKIP() << "fp16 on CPU needs LibTorch 2.x; this build is " << build_description();
  run_with_an_inf("fp16");
}

// fp16 with parallel.grad_reduce_dtype: compute: stage 1 (uncompressed under SC way 1) reduces its
// DP gradients in fp16, scaled by S / dp. A finite local value of 3·10⁵ (scaled) is beyond what that
// wire carries (65504·dp = 131008), so the overflow check counts it before any reduction and the
// step is skipped everywhere, as for an inf.
TEST(SkippedStep, Fp16ValueBeyondTheFp16DpWireSkipsLikeAnInf) {
  if (!kCpuFp16Gemm) GTEST_SKIP() << "fp16 on CPU needs LibTorch 2.x; this build is " << build_description();
  run_with_an_inf("fp16", "compute", 3.0e5f);
}

// bf16 with grad_reduce_dtype: compute: the 16-bit DP wire changes nothing of the skip.
TEST(SkippedStep, Bf16InfWithA16BitDpWireChangesNoStateAnywhere) { run_with_an_inf("bf16", "compute"); }

// A copy of `in` into `out` (tensors, sub-archives and other values) with the first element of
// every floating-point tensor set to NaN.
void copy_poisoned(torch::serialize::InputArchive& in, torch::serialize::OutputArchive& out) {
  for (const auto& key : in.keys()) {
    if (key == "training") continue;  // the archive module's own attribute, not saved state
    torch::Tensor t;
    torch::serialize::InputArchive sub;
    c10::IValue value;
    if (in.try_read(key, t)) {
      if (!t.defined()) continue;
      if (t.is_floating_point() && t.numel() > 0) {
        t = t.clone();
        t.view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
      }
      out.write(key, t);
    } else if (in.try_read(key, sub)) {
      torch::serialize::OutputArchive o;
      copy_poisoned(sub, o);
      out.write(key, o);
    } else if (in.try_read(key, value)) {
      out.write(key, value);
    }
  }
}

// Puts a NaN into every floating-point tensor of `part`'s state (save, poison, load).
void poison(const CheckpointPart& part) {
  torch::serialize::OutputArchive saved, poisoned;
  part.save(saved);
  std::stringstream a, b;
  saved.save_to(a);
  torch::serialize::InputArchive in, back;
  in.load_from(a);
  copy_poisoned(in, poisoned);
  poisoned.save_to(b);
  back.load_from(b);
  part.load(back);
}

// A NaN in PowerSGD's state (error feedback, warm-start Q) of one rank at step 3: local gradients
// are finite, the sync's result is not, the step is skipped, and the first skip finds the poisoned
// buffers: every rank stops (no run of frozen, skipped steps ending in exit 0), the poisoned rank
// names them, and nothing poisoned reaches a checkpoint.
TEST(SkippedStep, NaNInCompressorStateStopsTheRunAtTheFirstSkipNamingTheBuffer) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const Config cfg = skip_config(dir, "fp32");
  std::vector<std::string> errors(4);
  testing::run_layout({1, 2, 2}, [&](int rank, Distributed& dist) {
    TrainOptions opt;
    opt.quiet = true;
    opt.on_step_state = [](int64_t step, int r, const std::vector<CheckpointPart>& parts) {
      if (step != kInfStep || r != kInfRank) return;
      for (const auto& part : parts) {
        if (part.name == "dp_reducer") poison(part);
      }
    };
    try {
      run_training(cfg, opt, dist);
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  });
  for (int rank = 0; rank < 4; ++rank) EXPECT_FALSE(errors[rank].empty()) << "rank " << rank << " went on";
  EXPECT_THAT(errors[kInfRank], ::testing::HasSubstr(fmt::format(
                                    "training stopped at step {}: rank {} holds NaN or infinite values in its "
                                    "optimizer or compressor state", kInfStep, kInfRank)));
  EXPECT_THAT(errors[kInfRank], ::testing::HasSubstr("state/dp_reducer/"));
  EXPECT_THAT(errors[0], ::testing::HasSubstr("the state check after a skipped step failed on rank"));
  const auto ckpt = std::filesystem::path(cfg.checkpoint_dir());
  EXPECT_FALSE(std::filesystem::exists(ckpt / fmt::format("iter_{:07d}", kInfStep)));
  EXPECT_EQ(std::filesystem::path(*latest_checkpoint(ckpt.string())).filename(), fmt::format("iter_{:07d}", kInfStep - 1));
}

// fp32 without train.skip_nonfinite: an inf in one rank's local gradients is a fault. Every rank
// stops at that step naming the rank and the step, the rank that holds it names the tensor, and the
// step reaches no checkpoint.
TEST(NonFiniteGradient, Fp32InfOnOneRankStopsEveryRankNamingRankStepAndTensor) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  Config cfg = skip_config(dir, "fp32");
  cfg.train.skip_nonfinite = false;  // the default
  std::vector<std::string> errors(4);
  testing::run_layout({1, 2, 2}, [&](int rank, Distributed& dist) {
    TrainOptions opt;
    opt.quiet = true;
    opt.on_local_gradients = [](int64_t step, int r, const std::vector<torch::Tensor>& grads) {
      if (step == kInfStep && r == kInfRank) grads.front().view({-1})[0] = std::numeric_limits<float>::infinity();
    };
    try {
      run_training(cfg, opt, dist);
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  });
  const std::string what = fmt::format("training stopped: inf/NaN gradients on rank {} at step {}", kInfRank, kInfStep);
  for (int rank = 0; rank < 4; ++rank) EXPECT_THAT(errors[rank], ::testing::HasSubstr(what)) << "rank " << rank;
  EXPECT_THAT(errors[kInfRank], ::testing::HasSubstr("(the first non-finite gradient: "));
  EXPECT_THAT(errors[kInfRank], ::testing::HasSubstr("1 of "));
  EXPECT_THAT(errors[0], ::testing::HasSubstr(fmt::format("(rank {}'s error names the tensor)", kInfRank)));
  EXPECT_THAT(errors[0], ::testing::HasSubstr("--set train.skip_nonfinite=true"));
  const auto ckpt = std::filesystem::path(cfg.checkpoint_dir());
  EXPECT_FALSE(std::filesystem::exists(ckpt / fmt::format("iter_{:07d}", kInfStep)));
  EXPECT_EQ(std::filesystem::path(*latest_checkpoint(ckpt.string())).filename(), fmt::format("iter_{:07d}", kInfStep - 1));
}

// The stop's fix: resume with train.skip_nonfinite on. A resume may change that key (it decides only
// what a fault does), but not the learning rate beside it without --allow-config-change.
TEST(NonFiniteGradient, AResumeMayTurnOnSkipping) {
  Config saved, now;
  now.train.skip_nonfinite = true;
  const std::string defaults = to_yaml(Config{});
  EXPECT_TRUE(resume_config_changes(to_yaml(saved), to_yaml(now), defaults).empty());
  now.train.lr = saved.train.lr / 2;
  const auto changes = resume_config_changes(to_yaml(saved), to_yaml(now), defaults);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].key, "train.lr");
}

}  // namespace
}  // namespace optcc

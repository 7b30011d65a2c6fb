// Training end to end on a synthetic indexed dataset: loss falls, resume is bit-exact, the HDF5
// file holds exactly the losses the loop saw, LR schedule values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <ATen/CPUGeneratorImpl.h>

#include <H5Cpp.h>

#include <cmath>
#include <fstream>
#include <iterator>

#include "compat/torch_compat.h"
#include "harness/records/checkpoint.h"
#include "harness/records/results_reader.h"
#include "harness/config/config.h"
#include "harness/train/run_records.h"
#include "harness/train/grad_sync.h"
#include "harness/train/optimizer.h"
#include "harness/train/trainer.h"
#include "models/gpt.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

Config tiny_run(const testing::TempDir& dir, int64_t steps) {
  Config c;
  c.data.prefix = dir / "corpus";
  c.data.dir = dir / "data";
  c.data.split = "90,10,0";
  c.log.dir = dir / "results";
  c.log.run_name = "tiny";
  c.log.interval = 5;
  c.train.train_steps = steps;
  c.train.threads = 1;
  c.train.eval_iters = 4;
  c.train.eval_interval = 0;
  c.train.warmup_steps = 5;
  c.train.lr = 3e-3;
  c.model.seq_len = 32;
  return c;
}

std::vector<double> read_series(const std::string& file, const std::string& path) {
  H5::H5File f(file, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ);
  auto ds = f.openDataSet(path);
  hsize_t n = 0;
  ds.getSpace().getSimpleExtentDims(&n);
  std::vector<double> v(n);
  ds.read(v.data(), H5::PredType::NATIVE_DOUBLE);
  return v;
}

// The results file's projection (run_records.h) in closed form: one rank writes per step a /train
// row (8 columns), /traffic (control only: 9, p2p_bytes among them), /memory (3), /timing (5),
// /memory_components (11: step, rank and the nine components) and /dp_totals (6): 42 columns of 8
// bytes; evaluations add /eval rows (4 columns).
TEST(ResultsProjection, OneRankClosedFormAndLayoutScaling) {
  Config c;
  c.train.train_steps = 100;
  c.train.eval_interval = 50;
  c.log.interval = 10;
  auto p = project_results(c);
  EXPECT_EQ(p.rows_per_step, 6);
  EXPECT_EQ(p.bytes_per_step, 42 * 8);
  EXPECT_EQ(p.detail_rows, 0);  // compression.dp none: no tensor is compressed
  EXPECT_EQ(p.logging_steps, 10);
  EXPECT_EQ(p.total_bytes, 100 * 42 * 8 + 3 * 4 * 8);
  // PowerSGD on DP: at most 12 tensors per layer + 4 per stage, per (tp, dp) rank, at each logging step.
  c.compression.dp.name = "powersgd";
  c.parallel.dp = 2;
  c.train.global_batch_size = 8;
  p = project_results(c);
  EXPECT_EQ(p.detail_rows, (12 * c.model.num_layers + 4) * 2);
  EXPECT_EQ(p.detail_bytes, p.detail_rows * 7 * 8);
  // dp 2 adds the dp traffic class on each of the 2 ranks: 2 x (train-less tables) + 2 x 2 traffic rows.
  EXPECT_EQ(p.rows_per_step, 1 + 2 * 2 + 2 * 4);
  c.train.train_steps = 95;  // 9 multiples of 10, and the last step
  EXPECT_EQ(project_results(c).logging_steps, 10);
  EXPECT_EQ(byte_text(999), "999 B");
  EXPECT_EQ(byte_text(1500), "1.5 kB");
  EXPECT_EQ(byte_text(57.04e9), "57.0 GB");
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  LrSchedule s{1.0, 0.1, 10, 100};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.1 + 0.9 * 0.5, 1e-12);  // halfway: cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
}

TEST(ClipGrad, GlobalNormAndScaling) {
  auto a = torch::zeros({2}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  EXPECT_DOUBLE_EQ(clip_grad_global_norm({a, b}, 10.0), 5.0);
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), 3.0f);  // under the limit: untouched
  EXPECT_DOUBLE_EQ(clip_grad_global_norm({a, b}, 1.0), 5.0);
  EXPECT_NEAR(b.grad()[0].item<float>(), 0.8f, 1e-6);
}

// The multi-tensor AdamW the trainer uses against LibTorch's AdamW: two groups (with and without
// weight decay), a parameter that skips steps (so the group holds two step counts), 6 steps; every
// parameter and moment equal bit for bit on CPU, the state of AdamW's type.
TEST(MultiTensorAdamW, EqualsLibTorchsAdamWBitForBit) {
  auto make = [](uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    return std::vector<torch::Tensor>{torch::randn({8, 5}, gen).requires_grad_(), torch::randn({5}, gen).requires_grad_(),
                                      torch::randn({3, 3}, gen).requires_grad_()};
  };
  auto a = make(1), b = make(1);
  auto options = [](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
  };
  auto groups = [&](std::vector<torch::Tensor>& ps) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(std::vector<torch::Tensor>{ps[0], ps[2]}, options(0.1));
    g.emplace_back(std::vector<torch::Tensor>{ps[1]}, options(0.0));
    return g;
  };
  torch::optim::AdamW reference(groups(a), torch::optim::AdamWOptions(3e-3));
  MultiTensorAdamW multi(groups(b), torch::optim::AdamWOptions(3e-3));
  for (int step = 0; step < 6; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + 10 * step + i);
      const bool skip = i == 2 && step % 2 == 0;  // no gradient: no update, its step count lags
      const auto g = torch::randn(a[i].sizes(), gen);
      a[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
      b[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
    }
    reference.step();
    multi.step();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "step " << step << " parameter " << i;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& ra = static_cast<torch::optim::AdamWParamState&>(
        *reference.state().at(optimizer_state_key(reference.state(), a[i].unsafeGetTensorImpl())));
    const auto* mb = dynamic_cast<torch::optim::AdamWParamState*>(
        multi.state().at(optimizer_state_key(multi.state(), b[i].unsafeGetTensorImpl())).get());
    ASSERT_NE(mb, nullptr);
    EXPECT_EQ(ra.step(), mb->step()) << i;
    EXPECT_TRUE(torch::equal(ra.exp_avg(), mb->exp_avg())) << i;
    EXPECT_TRUE(torch::equal(ra.exp_avg_sq(), mb->exp_avg_sq())) << i;
  }
  EXPECT_EQ(static_cast<torch::optim::AdamWParamState&>(
                *multi.state().at(optimizer_state_key(multi.state(), b[2].unsafeGetTensorImpl()))).step(), 3);
}

// The gradient norm's one-sync form against the per-tensor loop it replaced: the same double, bit
// for bit (each tensor's sum in its dtype, the sums added in list order).
TEST(ClipGrad, SumOfSquaresEqualsThePerTensorLoopExactly) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  std::vector<torch::Tensor> grads{torch::randn({300, 7}, gen), torch::Tensor(), torch::randn({1000}, gen) * 1e3,
                                   torch::randn({3}, gen) * 1e-4, torch::randn({64, 64}, gen)};
  double loop = 0.0;
  for (const auto& g : grads) {
    if (g.defined()) loop += g.pow(2).sum().item<double>();
  }
  EXPECT_EQ(sum_of_squares(grads), loop);
  EXPECT_EQ(sum_of_squares({}), 0.0);
}

TEST(Training, LossFallsOnTinyRun) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  auto c = tiny_run(dir, 40);
  c.train.eval_interval = 40;  // step 0 and the end (0 would evaluate only at the end)
  TrainOptions opt;
  opt.quiet = true;
  auto s = run_training(c, opt);
  ASSERT_EQ(s.train_losses.size(), 40u);
  ASSERT_EQ(s.eval_losses.size(), 2u);  // step 0 and the end
  EXPECT_NEAR(s.eval_losses.front(), std::log(64.0), 0.3);
  EXPECT_NEAR(s.train_losses.front(), std::log(64.0), 0.3);
  EXPECT_LT(s.eval_losses.back(), 0.6 * std::log(64.0)) << "validation loss did not fall";
  // The results file holds the same numbers, bit for bit.
  auto losses = read_series(s.results_path, "/train/loss");
  ASSERT_EQ(losses.size(), 40u);
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_EQ(losses[i], s.train_losses[i]) << i;
  auto steps = read_series(s.results_path, "/train/step");
  EXPECT_EQ(steps.front(), 1.0);
  EXPECT_EQ(steps.back(), 40.0);
  EXPECT_EQ(read_series(s.results_path, "/eval/loss").back(), s.eval_losses.back());
}

// A split whose validation part rounds to no document on this corpus (1 part in 1000 of 200
// documents) is found when the data is opened, before step 0; with eval_interval 0 such a run
// trains without evaluating.
TEST(Training, ValidationSplitEmptyOnThisCorpusIsRefusedWhenEvaluating) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  TrainOptions opt;
  opt.quiet = true;
  auto c = tiny_run(dir, 2);
  c.data.split = "999,1,0";
  c.train.eval_interval = 1;
  try {
    (void)run_training(c, opt);
    ADD_FAILURE() << "an empty validation split with eval_interval 1 trained";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.split = '999,1,0' leaves the validation split of"), std::string::npos)
        << e.what();
  }
  c.train.eval_interval = 0;
  const auto s = run_training(c, opt);
  EXPECT_EQ(s.train_losses.size(), 2u);
  EXPECT_TRUE(s.eval_losses.empty());
}

// bf16 (fp32 masters, bf16 compute) learns the same task as fp32 from the same seed: the curves
// differ only by bf16 rounding of activations (8 mantissa bits), so the final validation losses
// agree to a few hundredths of a nat; the parameters and their gradients stay fp32.
TEST(Training, Bf16FollowsFp32) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  TrainOptions opt;
  opt.quiet = true;
  auto c = tiny_run(dir, 40);
  c.log.run_name = "fp32";
  const auto fp32 = run_training(c, opt);
  c.train.precision = "bf16";
  c.log.run_name = "bf16";
  const auto bf16 = run_training(c, opt);
  ASSERT_EQ(bf16.train_losses.size(), 40u);
  EXPECT_NE(bf16.train_losses.back(), fp32.train_losses.back()) << "bf16 computed in fp32";
  EXPECT_NEAR(bf16.train_losses.front(), fp32.train_losses.front(), 0.02);
  EXPECT_LT(bf16.eval_losses.back(), 0.6 * std::log(64.0)) << "bf16 did not learn";
  EXPECT_NEAR(bf16.eval_losses.back(), fp32.eval_losses.back(), 0.05);
}

void expect_resume_bit_identical(const std::string& precision) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 100);
  TrainOptions opt;
  opt.quiet = true;
  auto full_cfg = tiny_run(dir, 8);  // dropout 0.1 on: the RNG state must be restored too
  full_cfg.train.precision = precision;
  full_cfg.log.run_name = "full";
  auto full = run_training(full_cfg, opt);

  auto first = tiny_run(dir, 8);
  first.train.precision = precision;
  first.log.run_name = "half";
  first.checkpoint.interval = 4;
  first.checkpoint.dir = dir / "ckpt";
  // Stop after 4 steps by running a config with 4 steps but the 8-step LR schedule.
  first.train.decay_steps = 8 - first.train.warmup_steps;
  auto half_cfg = first;
  half_cfg.train.train_steps = 4;
  half_cfg.train.decay_steps = first.train.decay_steps;
  (void)run_training(half_cfg, opt);
  ASSERT_TRUE(latest_checkpoint(dir / "ckpt").has_value());

  auto resumed_cfg = first;  // 8 steps, resuming at 4
  resumed_cfg.checkpoint.interval = 0;
  opt.resume = dir / "ckpt";
  auto resumed = run_training(resumed_cfg, opt);
  ASSERT_EQ(resumed.first_step, 4);
  ASSERT_EQ(resumed.train_losses.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(resumed.train_losses[i], full.train_losses[4 + i]) << "step " << 5 + i;
  }
  EXPECT_EQ(resumed.eval_losses.back(), full.eval_losses.back());
}

// A resume that changes what a resume keeps (here the learning-rate schedule) is refused before
// anything is loaded, naming each key's checkpoint value and new value; --allow-config-change
// continues and records the changes in the results; extending train_steps alone is a plain resume.
TEST(Training, ResumeRefusesAChangedScheduleUnlessAllowed) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 100);
  TrainOptions opt;
  opt.quiet = true;
  auto c = tiny_run(dir, 2);
  c.checkpoint.interval = 2;
  c.checkpoint.dir = dir / "ckpt";
  (void)run_training(c, opt);
  auto changed = c;
  changed.train.train_steps = 4;
  changed.train.lr = 2e-3;
  changed.train.warmup_steps = 1;
  changed.checkpoint.interval = 0;  // leaves the checkpoint of step 2 as `latest`
  changed.log.run_name = "changed";
  opt.resume = dir / "ckpt";
  try {
    (void)run_training(changed, opt);
    ADD_FAILURE() << "a resume with another learning-rate schedule was accepted";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_THAT(msg, ::testing::HasSubstr("(step 2): this run's config changes 3 keys"));
    // warmup 5 -> 1 and train_steps 2 -> 4 move the cosine decay from 1 step to 3 (decay_steps 0).
    EXPECT_THAT(msg, ::testing::HasSubstr("train.decay_steps: 0 (decays over 1 steps: train_steps - warmup_steps) -> "
                                          "0 (decays over 3 steps: train_steps - warmup_steps); "
                                          "train.decay_steps=1 keeps the checkpoint's schedule"));
    EXPECT_THAT(msg, ::testing::HasSubstr("train.lr: 0.003 -> 0.002"));
    EXPECT_THAT(msg, ::testing::HasSubstr("train.warmup_steps: 5 -> 1"));
    EXPECT_THAT(msg, ::testing::HasSubstr("--allow-config-change"));
    EXPECT_THAT(msg, ::testing::HasSubstr("A resume may change: train.train_steps"));
  }
  opt.allow_config_change = true;
  const auto allowed = run_training(changed, opt);
  EXPECT_EQ(allowed.first_step, 2);
  EXPECT_EQ(allowed.train_losses.size(), 2u);
  EXPECT_THAT(read_root_attribute(allowed.results_path, "resume_config_changes"),
              ::testing::HasSubstr("train.lr: 0.003 -> 0.002"));
  opt.allow_config_change = false;
  auto longer = c;  // the same config, 3 steps
  longer.train.train_steps = 3;
  longer.checkpoint.interval = 0;
  longer.log.run_name = "longer";
  const auto extended = run_training(longer, opt);
  EXPECT_EQ(extended.first_step, 2);
  EXPECT_EQ(read_root_attribute(extended.results_path, "resume_config_changes"), "");
}

TEST(Training, ResumeIsBitIdentical) { expect_resume_bit_identical("fp32"); }

// The checkpoint keeps the fp32 master weights; the bf16 copies are made afresh at each use, so
// a bf16 run resumes bit-exactly too.
TEST(Training, Bf16ResumeIsBitIdentical) { expect_resume_bit_identical("bf16"); }

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The re-run: a run with checkpoints is interrupted after step 4 of 8 (here: the same run
// stopped by a 4-step config with the 8-step LR schedule), then the identical run starts again.
// Without --resume it is refused before any work, naming the directory and the flag; with
// resume_auto it continues bit-identically; neither touches the first attempt's results file.
TEST(Training, RerunOfAnInterruptedRunResumesOrRefusesAndKeepsItsResults) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 100);
  TrainOptions opt;
  opt.quiet = true;
  auto run = tiny_run(dir, 8);
  run.train.decay_steps = 8 - run.train.warmup_steps;
  run.checkpoint.interval = 2;
  run.checkpoint.keep = 0;
  auto reference_cfg = run;
  reference_cfg.log.run_name = "reference";
  reference_cfg.checkpoint.interval = 0;
  const auto reference = run_training(reference_cfg, opt);
  auto killed = run;
  killed.train.train_steps = 4;
  const auto first = run_training(killed, opt);
  const std::string first_path = dir / "results/tiny.h5";
  ASSERT_EQ(first.results_path, first_path);
  const std::string first_bytes = file_bytes(first_path);
  const std::string ckpt = dir / "results/ckpt/tiny";

  try {
    run_training(run, opt);
    FAIL() << "a re-run over a checkpoint started without --resume";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("checkpoint.dir " + ckpt + " already holds a checkpoint (iter_0000004)"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("Fix: pass --resume auto (or --resume)"));
  }
  EXPECT_TRUE(file_bytes(first_path) == first_bytes) << first_path << " changed";

  TrainOptions resume_auto = opt;
  resume_auto.resume_auto = true;
  const auto resumed = run_training(run, resume_auto);
  EXPECT_EQ(resumed.first_step, 4);
  EXPECT_EQ(resumed.results_path, dir / "results/tiny.resumed-4.h5");
  ASSERT_EQ(resumed.train_losses.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(resumed.train_losses[i], reference.train_losses[4 + i]) << "step " << 5 + i;
  EXPECT_EQ(read_series(resumed.results_path, "/train/step"), (std::vector<double>{5, 6, 7, 8}));
  EXPECT_TRUE(file_bytes(first_path) == first_bytes) << first_path << " changed";
  EXPECT_EQ(read_series(first_path, "/train/loss"), first.train_losses);

  // A second resume from step 4 (e.g. requeued again before a newer checkpoint) gets its own file.
  const std::string resumed_bytes = file_bytes(resumed.results_path);
  TrainOptions from4 = opt;
  from4.resume = ckpt + "/iter_0000004";
  const auto again = run_training(run, from4);
  EXPECT_EQ(again.results_path, dir / "results/tiny.resumed-4.attempt-2.h5");
  EXPECT_EQ(again.train_losses, resumed.train_losses);
  EXPECT_TRUE(file_bytes(resumed.results_path) == resumed_bytes) << resumed.results_path << " changed";
  EXPECT_TRUE(file_bytes(first_path) == first_bytes) << first_path << " changed";
}

// --resume auto on a first run starts at step 0; an explicit --resume of a directory without a
// checkpoint is an error naming it.
TEST(Training, ResumeAutoOnAFirstRunStartsFresh) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 50);
  TrainOptions opt;
  opt.quiet = true;
  opt.resume_auto = true;
  auto c = tiny_run(dir, 2);
  c.checkpoint.interval = 1;
  const auto s = run_training(c, opt);
  EXPECT_EQ(s.first_step, 0);
  EXPECT_EQ(s.train_losses.size(), 2u);
  EXPECT_EQ(s.results_path, dir / "results/tiny.h5");

  TrainOptions from_empty;
  from_empty.quiet = true;
  from_empty.resume = dir / "empty";
  try {
    run_training(c, from_empty);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("--resume " + (dir / "empty") + ": no checkpoint there"));
  }
}

// A run killed before its first checkpoint (or re-run without checkpoints) starts at step 0 again,
// and writes <run>.attempt-<n>.h5 next to the earlier attempts' files, which keep their bytes.
TEST(Training, RerunWithoutCheckpointWritesANewResultsFile) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 50);
  TrainOptions opt;
  opt.quiet = true;
  const auto c = tiny_run(dir, 2);
  const auto first = run_training(c, opt);
  ASSERT_EQ(first.results_path, dir / "results/tiny.h5");
  const std::string bytes = file_bytes(first.results_path);
  EXPECT_EQ(run_training(c, opt).results_path, dir / "results/tiny.attempt-2.h5");
  const auto third = run_training(c, opt);
  EXPECT_EQ(third.results_path, dir / "results/tiny.attempt-3.h5");
  EXPECT_EQ(third.train_losses, first.train_losses);
  EXPECT_TRUE(file_bytes(first.results_path) == bytes) << first.results_path << " changed";
}

TEST(Training, ResumeOntoOtherLayoutFails) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 50);
  auto c = tiny_run(dir, 2);
  c.checkpoint.save_final = true;
  c.checkpoint.dir = dir / "ckpt";
  TrainOptions opt;
  opt.quiet = true;
  run_training(c, opt);
  GptOptions o;
  o.vocab_size = 64;
  o.padded_vocab_size = 128;
  o.seq_len = o.max_positions = 32;
  GptModel m(o);
  auto adam = make_adamw(*m, c.train);
  try {
    load_checkpoint(dir / "ckpt", *m, *adam, CheckpointLayout{2, 1, 1, 0});
    FAIL() << "expected a layout error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("written with layout tp=1 pp=1 dp=1, but this run uses tp=2"));
  }
}

TEST(Training, MissingDatasetIsAClearError) {
  testing::TempDir dir;
  auto c = tiny_run(dir, 2);
  c.model.vocab_size = 64;
  try {
    run_training(c, TrainOptions{});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("corpus.bin/.idx (data.prefix) does not exist"));
  }
}

}  // namespace
}  // namespace optcc

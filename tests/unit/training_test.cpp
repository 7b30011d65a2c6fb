// Training end to end on a synthetic indexed dataset: loss falls, resume is bit-exact, the HDF5
// file holds exactly the losses the loop saw, LR schedule values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <H5Cpp.h>

#include <cmath>

#include "harness/checkpoint.h"
#include "harness/config.h"
#include "harness/optimizer.h"
#include "harness/trainer.h"
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

TEST(Training, LossFallsOnTinyRun) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  auto c = tiny_run(dir, 40);
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

TEST(Training, ResumeIsBitIdentical) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 100);
  TrainOptions opt;
  opt.quiet = true;
  auto full_cfg = tiny_run(dir, 8);  // dropout 0.1 on: the RNG state must be restored too
  full_cfg.log.run_name = "full";
  auto full = run_training(full_cfg, opt);

  auto first = tiny_run(dir, 8);
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

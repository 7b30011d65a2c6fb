// Training on a GPU (parallel.device: cuda) against the same run on CPU, and a GPU run's checkpoint
// resumed on CPU ranks (checkpoints are device-agnostic: checkpoint.h). Skipped, with the reason,
// in a build without CUDA or on a machine without a GPU; scripts/gpu/check.sh runs them on one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "harness/config/config.h"
#include "harness/parallel/device.h"
#include "harness/train/trainer.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

#define OPTCC_SKIP_WITHOUT_GPU()                                                                       \
  do {                                                                                                 \
    if (!kBuiltWithCuda) GTEST_SKIP() << "needs a CUDA build; this one is " << build_description();   \
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible to this process (CUDA build)";      \
  } while (0)

Config tiny_run(const testing::TempDir& dir, const std::string& device, int64_t steps) {
  Config c;
  c.data.prefix = dir / "corpus";
  c.data.dir = dir / "data";
  c.data.split = "90,10,0";
  c.log.dir = dir / ("results-" + device);
  c.log.run_name = "tiny";
  c.train.train_steps = steps;
  c.train.threads = 1;
  c.train.eval_iters = 2;
  c.train.eval_interval = 0;
  c.train.warmup_steps = 2;
  c.train.lr = 3e-3;
  c.model.seq_len = 32;
  c.parallel.device = device;
  return c;
}

// Same initial weights (drawn on the host), same batches: fp32 on a GPU follows the CPU's losses
// to rounding (different summation orders, no TF32 for fp32 matmuls by default).
TEST(TrainingCuda, FollowsTheCpuRunStepByStep) {
  OPTCC_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  TrainOptions opt;
  opt.quiet = true;
  const auto cpu = run_training(tiny_run(dir, "cpu", 12), opt);
  const auto gpu = run_training(tiny_run(dir, "cuda", 12), opt);
  ASSERT_EQ(cpu.train_losses.size(), gpu.train_losses.size());
  for (size_t i = 0; i < cpu.train_losses.size(); ++i) {
    EXPECT_NEAR(gpu.train_losses[i], cpu.train_losses[i], 2e-3 * std::abs(cpu.train_losses[i])) << "step " << i;
  }
  EXPECT_LT(gpu.train_losses.back(), gpu.train_losses.front());
}

// Written on the GPU, read on the host: the resumed CPU run continues the GPU run's losses.
TEST(TrainingCuda, AGpuCheckpointResumesOnCpu) {
  OPTCC_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  TrainOptions opt;
  opt.quiet = true;
  auto whole = tiny_run(dir, "cuda", 8);
  whole.checkpoint.interval = 4;
  whole.checkpoint.dir = dir / "ckpt";
  const auto gpu = run_training(whole, opt);
  auto rest = tiny_run(dir, "cpu", 8);
  rest.checkpoint.interval = 0;
  rest.log.run_name = "resumed";
  opt.resume = (std::filesystem::path(dir / "ckpt") / "iter_0000004").string();
  const auto cpu = run_training(rest, opt);
  ASSERT_EQ(cpu.first_step, 4);
  ASSERT_EQ(cpu.train_losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(cpu.train_losses[i], gpu.train_losses[4 + i], 2e-3 * std::abs(gpu.train_losses[4 + i])) << i;
  }
}

}  // namespace
}  // namespace optcc

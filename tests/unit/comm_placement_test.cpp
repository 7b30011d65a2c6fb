// harness/parallel/device.h: resolve_placement's rules for every build and machine shape (pure, so
// a CPU machine tests what a CUDA build decides on a node of GPUs), and, on a machine with a GPU,
// the Communicator carrying CUDA tensors over Gloo (host staging) between ranks as threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <thread>

#include "harness/parallel/communicator.h"
#include "harness/parallel/device.h"
#include "tests/support/gloo_ranks.h"

namespace optcc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string refusal(const std::string& device, const std::string& backend, int local_rank, int local_world, int gpus,
                    bool cuda_build) {
  try {
    resolve_placement(device, backend, local_rank, local_world, gpus, cuda_build);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Placement, AutoIsCpuAndGlooWithoutCudaOrWithoutAGpu) {
  for (const bool cuda_build : {false, true}) {
    const Placement p = resolve_placement("auto", "auto", 3, 4, /*gpus=*/0, cuda_build);
    EXPECT_TRUE(p.device.is_cpu());
    EXPECT_EQ(p.backend, "gloo");
    EXPECT_EQ(p.decided, "device cpu (auto), backend gloo (auto)");
  }
  // A CPU build ignores GPUs it cannot use.
  EXPECT_TRUE(resolve_placement("auto", "auto", 0, 1, 8, false).device.is_cpu());
}

TEST(Placement, AutoOnANodeOfGpusIsOneGpuPerLocalRankOverNccl) {
  for (int local = 0; local < 8; ++local) {
    const Placement p = resolve_placement("auto", "auto", local, 8, 8, true);
    ASSERT_TRUE(p.on_gpu());
    EXPECT_EQ(p.device.index(), local);
    EXPECT_EQ(p.backend, "nccl");
  }
}

TEST(Placement, RanksSharingAGpuGetGlooAndNcclIsRefusedForThem) {
  const Placement p = resolve_placement("cuda", "auto", 3, 4, 2, true);
  EXPECT_EQ(p.device.str(), "cuda:1");  // local rank 3 of 4 on 2 GPUs
  EXPECT_EQ(p.backend, "gloo");
  EXPECT_THAT(p.decided, HasSubstr("4 local ranks share 2 GPU(s)"));
  EXPECT_EQ(resolve_placement("cuda", "gloo", 0, 1, 1, true).backend, "gloo");  // asked for: kept
  EXPECT_THAT(refusal("cuda", "nccl", 0, 4, 2, true),
              AllOf(HasSubstr("parallel.backend = 'nccl'"), HasSubstr("4 ranks on this node share 2 GPU(s)"),
                    HasSubstr("parallel.backend: gloo")));
}

TEST(Placement, RefusalsNameTheKeyTheRuleAndTheFix) {
  EXPECT_THAT(refusal("cuda", "auto", 0, 1, 0, false),
              AllOf(HasSubstr("parallel.device = 'cuda'"), HasSubstr("CPU only (built without CUDA)"),
                    HasSubstr("Fix: set parallel.device: cpu")));
  EXPECT_THAT(refusal("auto", "nccl", 0, 1, 0, false),
              AllOf(HasSubstr("parallel.backend = 'nccl'"), HasSubstr("Fix: set parallel.backend: gloo (or auto)")));
  EXPECT_THAT(refusal("cuda", "auto", 0, 1, 0, true),
              AllOf(HasSubstr("this process sees no GPU"), HasSubstr("CUDA_VISIBLE_DEVICES")));
  EXPECT_THAT(refusal("cpu", "nccl", 0, 1, 1, true), HasSubstr("NCCL carries CUDA tensors only"));
  EXPECT_THAT(refusal("gpu", "auto", 0, 1, 1, true), HasSubstr("parallel.device = 'gpu': must be auto, cpu or cuda"));
  EXPECT_THAT(refusal("auto", "mpi", 0, 1, 1, true), HasSubstr("must be auto, gloo or nccl"));
  EXPECT_EQ(refusal("cpu", "gloo", 0, 1, 0, false), "");
}

TEST(Placement, ThisProcessMatchesItsBuild) {
  const Placement p = this_rank_placement("auto", "auto", 0, 1);
  EXPECT_EQ(p.on_gpu(), kBuiltWithCuda && cuda_device_count() > 0);
  if (!kBuiltWithCuda) {
    EXPECT_EQ(cuda_device_count(), 0);
  }
}

// Gloo carries CUDA tensors by staging them through host memory (communicator.h); the results land
// on the tensors' own GPU.
// The CPU span is the steady clock: a 30 ms sleep reads 30 ms (not a launch time, not zero).
TEST(Placement, SpanTimerOnTheCpuTimesTheSpan) {
  SpanTimer timer(c10::Device(c10::kCPU));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const double s = timer.seconds();
  EXPECT_GE(s, 0.030);
  EXPECT_LT(s, 0.5);
}

// On a GPU the span comes from CUDA events around queued work: a 4096^3 GEMM chain takes measurable
// GPU time even though its launch returns at once.
TEST(PlacementCuda, SpanTimerTimesTheGpusWorkNotItsLaunch) {
  if (!kBuiltWithCuda) GTEST_SKIP() << "needs a CUDA build; this one is " << build_description();
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible to this process";
  const c10::Device gpu(c10::kCUDA, 0);
  auto a = torch::randn({4096, 4096}, torch::TensorOptions().device(gpu));
  synchronize(gpu);
  SpanTimer timer(gpu);
  for (int i = 0; i < 8; ++i) a = torch::mm(a, a) / 64.0;
  const double s = timer.seconds();
  EXPECT_GT(s, 8 * 2.0 * 4096.0 * 4096.0 * 4096.0 / 2e15);  // under 2 PFLOP/s, far above any GPU's fp32
  EXPECT_LT(s, 10.0);
}

TEST(PlacementCuda, GlooCarriesCudaTensorsBetweenRanks) {
  if (!kBuiltWithCuda) GTEST_SKIP() << "needs a CUDA build; this one is " << build_description();
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible to this process";
  const torch::Device gpu(torch::kCUDA, 0);
  testing::run_ranks(2, [&](const testing::RankContext& ctx) {
    auto comm = ctx.group({0, 1}, "cuda-pair");
    auto t = torch::full({5}, static_cast<float>(ctx.rank + 1), torch::TensorOptions().device(gpu));
    comm->all_reduce(t, Traffic::kControl);
    EXPECT_TRUE(t.is_cuda());
    EXPECT_TRUE(torch::equal(t.cpu(), torch::full({5}, 3.0f)));
    auto gathered = comm->all_gather(t, Traffic::kControl);
    EXPECT_TRUE(gathered.is_cuda());
    EXPECT_EQ(gathered.size(0), 10);
    auto msg = torch::arange(4, torch::TensorOptions().dtype(torch::kFloat).device(gpu)) + ctx.rank;
    auto got = torch::empty({4}, msg.options());
    CommHandle s = comm->send(msg, 1 - ctx.rank, Traffic::kPipelineForward);
    CommHandle r = comm->recv(got, 1 - ctx.rank, Traffic::kPipelineForward);
    s.wait();
    r.wait();
    EXPECT_TRUE(torch::equal(got.cpu(), torch::arange(4, torch::kFloat) + (1 - ctx.rank)));
  });
}

}  // namespace
}  // namespace optcc

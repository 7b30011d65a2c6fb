// `optcc bench step` (harness/tools/bench.h) on a tiny model: the step is timed, and --profile's table
// holds the operations of one more step, largest self time first, self within total.
#include <gtest/gtest.h>

#include <string>

#include "harness/config/config.h"
#include "harness/tools/bench.h"
#include "tests/support/paths.h"

namespace optcc {
namespace {

TEST(BenchStep, ProfileListsTheTopOperationsBySelfTime) {
  const Config cfg = load_config(std::string(testing::source_dir()) + "/experiments/bench-mini.yaml",
                                 {"model.preset=tiny", "model.vocab_size=512", "train.micro_batch_size=2",
                                  "train.global_batch_size=2"});
  const auto r = bench_step(cfg, /*steps=*/1, /*warmup=*/0, /*threads=*/1, /*profile_top=*/6);
  EXPECT_GT(r.step_seconds, 0);
  EXPECT_EQ(r.profile_clock, "CPU");
  ASSERT_EQ(r.profile.size(), 6u);
  double self_sum = 0;
  for (size_t i = 0; i < r.profile.size(); ++i) {
    const auto& op = r.profile[i];
    EXPECT_FALSE(op.name.empty());
    EXPECT_EQ(op.name.find("anonymous namespace"), std::string::npos) << op.name;
    EXPECT_GE(op.calls, 1) << op.name;
    EXPECT_GE(op.self_ms, 0) << op.name;
    EXPECT_LE(op.self_ms, op.total_ms + 1e-9) << op.name;
    if (i > 0) {
      EXPECT_LE(op.self_ms, r.profile[i - 1].self_ms) << op.name;
    }
    self_sum += op.self_ms;
  }
  // Self times do not overlap: together at most the profiled step's wall time (one thread).
  EXPECT_LE(self_sum, r.profile_step_ms * 1.02);
  EXPECT_TRUE(bench_step(cfg, 1, 0, 1).profile.empty());  // no profile asked: none made
}

}  // namespace
}  // namespace optcc

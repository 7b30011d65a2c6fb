// Link emulation through the real local launcher (4 forked ranks, PP2 x DP2, two ranks per node):
// the launcher creates the shared NIC segment, the ranks map it through $OPTCC_NIC_SHM, the log
// says emulation is on, the segment is gone after the run, and `optcc trace` exports the timeline.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/process.h"
#include "tests/support/synthetic_corpus.h"

namespace {

using optcc::testing::slurp;

// Runs argv with stdout+stderr to `log`; returns the exit status and the child's pid.
std::pair<int, pid_t> run(std::vector<std::string> args, const std::string& log) {
  const pid_t pid = optcc::testing::spawn_logged(std::move(args), log);
  if (pid < 0) return {-1, 0};
  return {optcc::testing::wait_exit_code(pid), pid};
}

TEST(LocalLaunch, EmulatedRunSharesTheNicSegmentAndTracesItsTimeline) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::string optcc = std::string(OPTCC_BINARY_DIR) + "/optcc";
  const std::string log = dir / "log.txt";
  const auto [code, launcher] = run(
      {optcc, "train", "--nproc", "4", "--config", std::string(OPTCC_SOURCE_DIR) + "/experiments/smoke.yaml",
       "--set", "data.prefix=" + (dir / "corpus"), "--set", "data.dir=" + (dir / "data"), "--set", "data.split=100,0,0", "--set", "train.eval_interval=0",
       "--set", "model.vocab_size=64", "--set", "parallel.pp=2", "--set", "parallel.dp=2", "--set",
       "parallel.ranks_per_node=2", "--set", "train.train_steps=3", "--set", "train.threads=1", "--set",
       "log.dir=" + (dir / "results"), "--set", "log.run_name=emulated", "--set", "network.emulate=true", "--set",
       "network.profile=paper-a100-ib200", "--set", "network.scale=1000", "--set", "log.timeline_steps=[2]"},
      log);
  ASSERT_EQ(code, 0) << slurp(log);
  EXPECT_THAT(slurp(log), ::testing::HasSubstr("network emulation on (profile paper-a100-ib200)"));
  EXPECT_THAT(slurp(log), ::testing::HasSubstr("breakdown step 2"));
  const std::string segment = "/dev/shm/optcc-nic-" + std::to_string(getuid()) + "-" + std::to_string(launcher) + "-launcher";
  EXPECT_FALSE(std::filesystem::exists(segment)) << segment << " was not unlinked";

  const std::string results = dir / "results/emulated.h5", trace = dir / "trace.json";
  const auto [trace_code, _] = run({optcc, "trace", results, "--step", "2", "-o", trace, "--breakdown"}, dir / "trace.txt");
  ASSERT_EQ(trace_code, 0) << slurp(dir / "trace.txt");
  EXPECT_THAT(slurp(dir / "trace.txt"), ::testing::HasSubstr("complete events (step 2)"));
  const std::string json = slurp(trace);
  EXPECT_THAT(json, ::testing::HasSubstr("\"ph\": \"X\""));
  EXPECT_THAT(json, ::testing::HasSubstr("\"process_name\""));
  const auto [bad, __] = run({optcc, "trace", results}, dir / "bad.txt");  // nothing asked for
  EXPECT_EQ(bad, 1);
  EXPECT_THAT(slurp(dir / "bad.txt"), ::testing::HasSubstr("Fix: give -o trace.json"));
}

}  // namespace

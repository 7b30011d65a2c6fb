// Link emulation through the real local launcher (4 forked ranks, PP2 x DP2, two ranks per node):
// the launcher creates the shared NIC segment, the ranks map it through $OPTCC_NIC_SHM, the log
// says emulation is on, the segment is gone after the run, and `optcc trace` exports the timeline.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <H5Cpp.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/support/paths.h"
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
  const std::string optcc = std::string(optcc::testing::binary_dir()) + "/optcc";
  const std::string log = dir / "log.txt";
  const auto [code, launcher] = run(
      {optcc, "train", "--nproc", "4", "--config", std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml",
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

// network.match_regime: the ranks measure this machine at the start, the scale and latencies are
// derived (the log and the emulator's own start-up line carry the same scale), and the results
// record how (attribute network_regime) and what ran (the config: the derived scale, match_regime "").
TEST(LocalLaunch, MatchRegimeDerivesTheScaleAtStartAndRecordsIt) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::string optcc = std::string(optcc::testing::binary_dir()) + "/optcc";
  const std::string paper = std::string(optcc::testing::source_dir()) + "/experiments/paper/gpt-2.5b.yaml";
  std::vector<std::string> args = {
      optcc, "train", "--nproc", "4", "--config", std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml",
      "--set", "data.prefix=" + (dir / "corpus"), "--set", "data.dir=" + (dir / "data"), "--set", "data.split=100,0,0",
      "--set", "train.eval_interval=0", "--set", "model.vocab_size=64", "--set", "parallel.pp=2", "--set",
      "parallel.dp=2", "--set", "parallel.ranks_per_node=2", "--set", "train.train_steps=2", "--set",
      "train.threads=1", "--set", "log.dir=" + (dir / "results"), "--set", "log.run_name=regime", "--set",
      "network.emulate=true", "--set", "network.profile=paper-a100-ib200", "--set", "network.match_regime=" + paper};
  const std::string log = dir / "log.txt";
  ASSERT_EQ(run(args, log).first, 0) << slurp(log);
  const std::string text = slurp(log);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex("network.match_regime: scale ([0-9.e+]+) from ")))
      << text;
  const double scale = std::stod(m[1]);
  EXPECT_GT(scale, 0);
  // The emulator runs at the derived scale (its start-up line prints the config it was built from).
  EXPECT_THAT(text, ::testing::HasSubstr(", scale " + std::string(m[1])));
  H5::H5File f(dir / "results/regime.h5", H5F_ACC_RDONLY);
  auto attr = [&](const char* name) {
    H5::Attribute a = f.openAttribute(name);
    std::string v;
    a.read(a.getStrType(), v);
    return v;
  };
  EXPECT_THAT(attr("network_regime"), ::testing::StartsWith("scale " + std::string(m[1]) + " from " + paper));
  EXPECT_THAT(attr("config"), ::testing::HasSubstr("match_regime: \"\""));
  std::smatch cs;
  const std::string config = attr("config");
  ASSERT_TRUE(std::regex_search(config, cs, std::regex("\n  scale: ([0-9.e+]+)\n")));
  EXPECT_NEAR(std::stod(cs[1]), scale, 1e-9 * scale);

  // Given together with its own scale, match_regime is refused before any work.
  args.insert(args.end(), {"--set", "network.scale=200"});
  ASSERT_NE(run(args, dir / "refused.txt").first, 0);
  EXPECT_THAT(slurp(dir / "refused.txt"),
              ::testing::AllOf(::testing::HasSubstr("network.match_regime"), ::testing::HasSubstr("network.scale"),
                               ::testing::HasSubstr("Fix:")));
}

}  // namespace

// The scale simulator (harness/perfmodel/simulator.h) against a measured emulated run on this machine,
// unit-free: `optcc calibrate` measures this machine for a small emulated config (tiny GPT, PP2 x
// DP2 = 4 local ranks, two per node, links of the paper's cluster x 3000 so that inter-node traffic
// is a large share of the step), `optcc train` runs it, `optcc simulate` predicts its iteration on
// the calibrated profile, and the prediction must be within 25% of the measured median step
// (the emulation experiment's own table, within 15%, is in docs/emulation.md, "The simulator").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/support/paths.h"
#include "tests/support/process.h"
#include "tests/support/synthetic_corpus.h"

namespace {

using optcc::testing::slurp;

// Runs args with stdout to `out` and stderr to `err`; returns the exit status.
int run(std::vector<std::string> args, const std::string& out, const std::string& err) {
  return optcc::testing::run_logged(std::move(args), out, err);
}

TEST(SimulatorValidation, PredictsAMeasuredEmulatedStepWithin25Percent) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::string optcc = std::string(optcc::testing::binary_dir()) + "/optcc";
  const std::vector<std::string> config = {
      "--config", std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml", "--set", "data.prefix=" + (dir / "corpus"),
      "--set", "data.dir=" + (dir / "data"), "--set", "data.split=100,0,0", "--set", "train.eval_interval=0", "--set", "model.vocab_size=64",
      "--set", "parallel.pp=2", "--set", "parallel.dp=2", "--set", "parallel.ranks_per_node=2",
      "--set", "train.global_batch_size=16", "--set", "train.threads=1", "--set", "network.emulate=true",
      "--set", "network.profile=paper-a100-ib200", "--set", "network.scale=3000"};
  auto with = [&](std::vector<std::string> head, std::vector<std::string> tail) {
    head.insert(head.end(), config.begin(), config.end());
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };

  // 1. the run: 14 steps, every step logged; the median of steps 4..14
  ASSERT_EQ(run(with({optcc, "train", "--nproc", "4"},
                     {"--set", "train.train_steps=14", "--set", "log.interval=1",
                      "--set", "log.dir=" + (dir / "results"), "--set", "log.run_name=measured"}),
                dir / "train.out", dir / "train.err"),
            0)
      << slurp(dir / "train.err");
  const std::string log = slurp(dir / "train.out") + slurp(dir / "train.err");
  const std::regex step_line(R"(step +(\d+)/\d+ \|.*\| +(\d+) ms/step)");
  std::vector<double> ms;
  for (std::sregex_iterator it(log.begin(), log.end(), step_line), end; it != end; ++it) {
    if (std::stoi((*it)[1]) >= 4) ms.push_back(std::stod((*it)[2]));
  }
  ASSERT_GE(ms.size(), 9u) << log;
  std::sort(ms.begin(), ms.end());
  const double measured_s = ms[ms.size() / 2] / 1000.0;

  // 2. this machine, measured as the run uses it (4 processes at once)
  const std::string profile = dir / "this-machine.yaml";
  ASSERT_EQ(run(with({optcc, "calibrate"}, {"-o", profile, "--reps", "3"}), dir / "cal.out", dir / "cal.err"), 0)
      << slurp(dir / "cal.err");

  // 3. the prediction
  ASSERT_EQ(run(with({optcc, "simulate"}, {"--profile", profile, "--schemes", "config", "--json"}), dir / "sim.json",
                dir / "sim.err"),
            0)
      << slurp(dir / "sim.err");
  const std::string json = slurp(dir / "sim.json");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(json, m, std::regex(R"("iteration_s": *([0-9.eE+-]+))"))) << json;
  const double predicted_s = std::stod(m[1]);

  const double ratio = predicted_s / measured_s;
  EXPECT_GT(ratio, 0.75) << "predicted " << predicted_s << " s, measured " << measured_s << " s\n" << json;
  EXPECT_LT(ratio, 1.25) << "predicted " << predicted_s << " s, measured " << measured_s << " s\n" << json;
  std::cout << "simulator validation: predicted " << predicted_s << " s, measured " << measured_s
            << " s (median of " << ms.size() << " steps), ratio " << ratio << "\n";
}

}  // namespace

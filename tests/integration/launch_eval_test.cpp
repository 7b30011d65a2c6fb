// `optcc eval` through the binary: a run trained on 4 forked ranks (TP2 x PP2) is evaluated on one
// process and, re-sharded, on 2 forked ranks (PP2, --nproc 2 --layout 1,2,1); both print the run's
// last validation loss and a difference below 1e-5 (the run trains with dropout, which the forked
// ranks draw alike), and write their own results files. Without a
// checkpoint, or with --nproc not matching --layout, the command fails with the fix, before forking.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "tests/support/paths.h"
#include "tests/support/process.h"
#include "tests/support/synthetic_corpus.h"

namespace {

using ::testing::HasSubstr;

using optcc::testing::slurp;

// Runs the binary with `args`, stdout and stderr to `log`; returns the exit status.
int run_optcc(std::vector<std::string> args, const std::string& log) {
  args.insert(args.begin(), std::string(optcc::testing::binary_dir()) + "/optcc");
  const pid_t pid = optcc::testing::spawn_logged(std::move(args), log);
  EXPECT_GT(pid, 0) << "could not start optcc";
  return pid < 0 ? -1 : optcc::testing::wait_exit_code(pid);
}

// The "difference X" an eval printed.
double printed_difference(const std::string& out) {
  std::smatch m;
  static const std::regex diff(R"(difference (\S+))");
  EXPECT_TRUE(std::regex_search(out, m, diff)) << out;
  return m.size() > 1 ? std::stod(m[1].str()) : 1.0;
}

TEST(LocalLaunch, EvalOfATp2Pp2CheckpointOnOneProcessAndReshardedOnTwo) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::vector<std::string> data = {"--set", "data.prefix=" + (dir / "corpus"), "--set", "data.dir=" + (dir / "data")};
  std::vector<std::string> train = {
      "train", "--nproc", "4", "--config", std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml",
      "--set", "data.split=90,10,0", "--set", "model.vocab_size=64", "--set", "parallel.tp=2", "--set", "parallel.pp=2",
      "--set", "parallel.dp=1", "--set", "train.train_steps=3", "--set", "train.threads=1",
      "--set", "log.dir=" + (dir / "results"), "--set", "log.run_name=run", "--set", "checkpoint.save_final=true"};
  train.insert(train.end(), data.begin(), data.end());
  ASSERT_EQ(run_optcc(train, dir / "train.log"), 0) << slurp(dir / "train.log");

  const std::string ckpt = dir / "results/ckpt/run";
  ASSERT_EQ(run_optcc({"eval", "--checkpoint", ckpt, "--documents", "0"}, dir / "one.log"), 0) << slurp(dir / "one.log");
  const std::string one = slurp(dir / "one.log");
  EXPECT_THAT(one, HasSubstr("on tp=1 pp=1 dp=1, split valid"));
  EXPECT_THAT(one, HasSubstr("training run's evaluation at step 3"));
  EXPECT_LT(std::abs(printed_difference(one)), 1e-5);
  // Separate processes seeded alike draw the same dropout masks on the TP ranks of a stage (the
  // smoke config trains with dropout 0.1): their copies of replicated parameters stay identical.
  EXPECT_THAT(one, HasSubstr("DP replicas 0, tied embedding copies 0, TP copies of replicated parameters 0\n"));
  EXPECT_TRUE(std::filesystem::exists(dir / "results/run.eval-3.h5")) << one;

  ASSERT_EQ(run_optcc({"eval", "--checkpoint", ckpt, "--documents", "0", "--nproc", "2", "--layout", "1,2,1"},
                      dir / "two.log"),
            0)
      << slurp(dir / "two.log");
  const std::string two = slurp(dir / "two.log");
  EXPECT_THAT(two, HasSubstr("on tp=1 pp=2 dp=1"));
  EXPECT_LT(std::abs(printed_difference(two)), 1e-5);
  EXPECT_TRUE(std::filesystem::exists(dir / "results/run.eval-3.attempt-2.h5")) << two;

  EXPECT_EQ(run_optcc({"eval", "--checkpoint", ckpt, "--nproc", "3", "--layout", "1,2,1"}, dir / "bad.log"), 2);
  EXPECT_THAT(slurp(dir / "bad.log"), HasSubstr("must equal the number of ranks, 3"));
  EXPECT_EQ(run_optcc({"eval", "--checkpoint", dir / "none"}, dir / "none.log"), 1);
  EXPECT_THAT(slurp(dir / "none.log"), HasSubstr("no checkpoint at"));
}

}  // namespace

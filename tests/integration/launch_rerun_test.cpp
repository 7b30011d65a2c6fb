// A killed run started again with the identical command (what a Slurm requeue does): `optcc train`
// with checkpoint.interval = 5 is killed with SIGKILL after its step-20 checkpoint. Re-run outside
// Slurm, or inside an allocation that is no requeue (an salloc shell, a first srun: SLURM_JOB_ID without
// SLURM_RESTART_COUNT), it is refused naming the checkpoint directory and --resume auto; re-run as a
// requeued Slurm job (single task, environment as srun sets it, SLURM_RESTART_COUNT=1) it resumes from
// the newest checkpoint. The first
// attempt's results file keeps every byte throughout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <H5Cpp.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <thread>

#include "tests/support/paths.h"
#include "tests/support/process.h"
#include "tests/support/results_file.h"
#include "tests/support/synthetic_corpus.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using optcc::testing::child_env;
using optcc::testing::kill_and_reap;
using optcc::testing::read_train_steps;
using optcc::testing::run_to_end;
using optcc::testing::slurp;
using optcc::testing::wait_for;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

pid_t spawn(std::vector<std::string> args, std::vector<std::string> env, const std::string& log) {
  const pid_t pid = optcc::testing::spawn_logged(std::move(args), log, "", &env);
  EXPECT_GT(pid, 0) << "could not start " << args.at(0);
  return pid;
}

TEST(Rerun, KilledRunIsRefusedOrResumedAndKeepsItsResults) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::vector<std::string> command = {
      std::string(optcc::testing::binary_dir()) + "/optcc", "train", "--config",
      std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml",
      "--set", "data.prefix=" + (dir / "corpus"), "--set", "data.dir=" + (dir / "data"),
      "--set", "data.split=100,0,0", "--set", "train.eval_interval=0", "--set", "model.vocab_size=64", "--set", "train.train_steps=100000",
      "--set", "train.threads=1", "--set", "log.dir=" + (dir / "results"), "--set", "checkpoint.interval=5"};
  const std::string results = dir / "results/smoke.h5", ckpt = dir / "results/ckpt/smoke";

  // Attempt 1: killed after its step-20 checkpoint.
  const std::string log1 = dir / "attempt1.txt";
  const pid_t first = spawn(command, child_env({}), log1);
  ASSERT_TRUE(wait_for(first, log1, "checkpoint -> " + ckpt + "/iter_0000020")) << slurp(log1);
  kill_and_reap(first);
  const std::string bytes = slurp(results);
  const auto steps = read_train_steps(results);
  ASSERT_GE(steps.size(), 20u);
  for (size_t i = 0; i < steps.size(); ++i) ASSERT_EQ(steps[i], static_cast<int64_t>(i + 1));

  // Attempt 2, same command outside Slurm: refused once, before any rank starts; nothing written.
  const std::string log2 = dir / "attempt2.txt";
  EXPECT_EQ(run_to_end(spawn(command, child_env({}), log2)), 1) << slurp(log2);
  EXPECT_THAT(slurp(log2), ::testing::HasSubstr("checkpoint.dir " + ckpt + " already holds a checkpoint"));
  EXPECT_THAT(slurp(log2), ::testing::HasSubstr("pass --resume auto"));
  EXPECT_EQ(count(slurp(log2), "already holds a checkpoint"), 1u) << slurp(log2);
  EXPECT_TRUE(slurp(results) == bytes) << results << " changed";
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir / "results")) files.push_back(e.path().filename().string());
  // Only the killed attempt's files: its results, checkpoints and lock (refused before taking it over).
  EXPECT_THAT(files, ::testing::UnorderedElementsAre("smoke.h5", "ckpt", "smoke.lock"));

  // The same inside an allocation that is not a requeue (an salloc shell, or a first srun there, as
  // Slurm sets them without SLURM_RESTART_COUNT): refused the same way, nothing written.
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string short_host = std::string(host).substr(0, std::string(host).find('.'));
  const std::vector<std::string> job = {"SLURM_JOB_ID=4242", "SLURM_JOBID=4242", "SLURM_NNODES=1",
                                        "SLURM_JOB_NUM_NODES=1", "SLURM_JOB_NODELIST=" + short_host,
                                        "SLURM_NODELIST=" + short_host};
  for (const bool srun : {false, true}) {
    auto env = job;
    if (srun) env.insert(env.end(), {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0", "SLURM_NODEID=0",
                                     "SLURM_NTASKS_PER_NODE=1"});
    const std::string log = dir / (srun ? "attempt2-srun.txt" : "attempt2-salloc.txt");
    EXPECT_EQ(run_to_end(spawn(command, child_env(env), log)), 1) << slurp(log);
    EXPECT_THAT(slurp(log), ::testing::HasSubstr("already holds a checkpoint")) << log;
    EXPECT_THAT(slurp(log), ::testing::HasSubstr("SLURM_RESTART_COUNT")) << log;
    EXPECT_TRUE(slurp(results) == bytes) << results << " changed";
  }

  // Attempt 3, same command as a requeued Slurm job (SLURM_RESTART_COUNT >= 1): resumes from the
  // newest checkpoint.
  auto requeued = job;
  requeued.insert(requeued.end(), {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0", "SLURM_NODEID=0",
                                   "SLURM_NTASKS_PER_NODE=1", "SLURM_RESTART_COUNT=1"});
  const auto slurm = child_env(requeued);
  const std::string log3 = dir / "attempt3.txt";
  const pid_t third = spawn(command, slurm, log3);
  ASSERT_TRUE(wait_for(third, log3, "(--resume auto)")) << slurp(log3);
  // The killed attempt left its lock files; their holder is dead, so attempt 3 took them over.
  EXPECT_THAT(slurp(log3), ::testing::HasSubstr("took over the lock of a run that is no longer running (pid " +
                                                std::to_string(first) + " host "));
  std::smatch m;
  const std::string resumed_line = slurp(log3);
  ASSERT_TRUE(std::regex_search(resumed_line, m, std::regex("resumed from \\S+ at step (\\d+)"))) << resumed_line;
  const int64_t from = std::stoll(m[1]);
  EXPECT_GE(from, 20);
  EXPECT_EQ(from % 5, 0);
  const std::string next = std::to_string(from + 5);
  ASSERT_TRUE(wait_for(third, log3, "checkpoint -> " + ckpt + "/iter_" + std::string(7 - next.size(), '0') + next))
      << slurp(log3);
  kill_and_reap(third);
  const auto resumed_steps = read_train_steps(dir / ("results/smoke.resumed-" + std::to_string(from) + ".h5"));
  ASSERT_GE(resumed_steps.size(), 5u);
  EXPECT_EQ(resumed_steps.front(), from + 1);
  EXPECT_TRUE(slurp(results) == bytes) << results << " changed";
}

// A multi-rank run without its prepared dataset is refused once, by the launching process before it
// forks a rank, and the fix prepares the data this run would read: the user's own --config and --set.
TEST(Rerun, AMissingDatasetIsNamedOnceBeforeAnyRankWithTheUsersOverrides) {
  optcc::testing::TempDir dir;
  const std::string prefix = dir / "elsewhere/corpus";
  const std::string config = std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml";
  const std::vector<std::string> command = {
      std::string(optcc::testing::binary_dir()) + "/optcc", "train", "--config", config, "--set", "data.prefix=" + prefix,
      "--set", "parallel.dp=2", "--set", "log.dir=" + (dir / "results"), "--nproc", "2"};
  const std::string log = dir / "log.txt";
  EXPECT_EQ(run_to_end(spawn(command, child_env({}), log)), 2) << slurp(log);
  const std::string text = slurp(log);
  EXPECT_EQ(count(text, "data error:"), 1u) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("data.prefix = " + prefix + ": the prepared dataset is missing (" + prefix +
                                         ".bin, " + prefix + ".idx"));
  EXPECT_THAT(text, ::testing::HasSubstr("`optcc data prepare --config " + config + " --set data.prefix=" + prefix +
                                         " --set parallel.dp=2 --set log.dir=" + (dir / "results") + "`"));
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("rank 1")));
  EXPECT_FALSE(fs::exists(dir / "results"));
}

}  // namespace

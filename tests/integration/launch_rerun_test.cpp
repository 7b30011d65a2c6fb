// A killed run started again with the identical command (what a Slurm requeue does): `optcc train`
// with checkpoint.interval = 5 is killed with SIGKILL after its step-20 checkpoint. Re-run outside
// Slurm, it is refused naming the checkpoint directory and --resume auto; re-run inside a Slurm job
// (single task, environment as srun sets it) it resumes from the newest checkpoint. The first
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

#include "tests/support/process.h"
#include "tests/support/synthetic_corpus.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using optcc::testing::slurp;

std::vector<int64_t> read_steps(const std::string& file) {
  H5::H5File f(file, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ);  // SWMR: the writer may have died in a flush
  auto ds = f.openDataSet("/train/step");
  hsize_t n = 0;
  ds.getSpace().getSimpleExtentDims(&n);
  std::vector<int64_t> v(n);
  if (n > 0) ds.read(v.data(), H5::PredType::NATIVE_INT64);
  return v;
}

// This process's environment without any launcher variables, plus `extra`.
std::vector<std::string> child_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const bool launcher = kv.rfind("SLURM_", 0) == 0 || kv.rfind("OPTCC_", 0) == 0 || kv.rfind("RANK=", 0) == 0 ||
                          kv.rfind("WORLD_SIZE=", 0) == 0 || kv.rfind("MASTER_", 0) == 0;
    if (!launcher) env.push_back(kv);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

pid_t spawn(std::vector<std::string> args, std::vector<std::string> env, const std::string& log) {
  const pid_t pid = optcc::testing::spawn_logged(std::move(args), log, "", &env);
  EXPECT_GT(pid, 0) << "could not start " << args.at(0);
  return pid;
}

// Waits until `log` contains `text`; false after 120 s or when the process ended first.
bool wait_for(pid_t pid, const std::string& log, const std::string& text) {
  const auto start = Clock::now();
  while (slurp(log).find(text) == std::string::npos) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid || Clock::now() - start > std::chrono::seconds(120)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void kill_and_reap(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
}

// The exit code of `pid`, or -1 (after killing it) when it still runs after 60 s.
int run_to_end(pid_t pid) {
  const auto start = Clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() - start > std::chrono::seconds(60)) {
      kill_and_reap(pid);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Rerun, KilledRunIsRefusedOrResumedAndKeepsItsResults) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::vector<std::string> command = {
      std::string(OPTCC_BINARY_DIR) + "/optcc", "train", "--config",
      std::string(OPTCC_SOURCE_DIR) + "/experiments/smoke.yaml",
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
  const auto steps = read_steps(results);
  ASSERT_GE(steps.size(), 20u);
  for (size_t i = 0; i < steps.size(); ++i) ASSERT_EQ(steps[i], static_cast<int64_t>(i + 1));

  // Attempt 2, same command outside Slurm: refused before any work; nothing written.
  const std::string log2 = dir / "attempt2.txt";
  EXPECT_EQ(run_to_end(spawn(command, child_env({}), log2)), 1) << slurp(log2);
  EXPECT_THAT(slurp(log2), ::testing::HasSubstr("checkpoint.dir " + ckpt + " already holds a checkpoint"));
  EXPECT_THAT(slurp(log2), ::testing::HasSubstr("pass --resume auto"));
  EXPECT_TRUE(slurp(results) == bytes) << results << " changed";
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir / "results")) files.push_back(e.path().filename().string());
  EXPECT_THAT(files, ::testing::UnorderedElementsAre("smoke.h5", "ckpt"));

  // Attempt 3, same command as a requeued Slurm job: resumes from the newest checkpoint.
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string short_host = std::string(host).substr(0, std::string(host).find('.'));
  const auto slurm = child_env({"SLURM_JOB_ID=4242", "SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0",
                                "SLURM_NODEID=0", "SLURM_JOB_NUM_NODES=1", "SLURM_NTASKS_PER_NODE=1",
                                "SLURM_JOB_NODELIST=" + short_host});
  const std::string log3 = dir / "attempt3.txt";
  const pid_t third = spawn(command, slurm, log3);
  ASSERT_TRUE(wait_for(third, log3, "(--resume auto)")) << slurp(log3);
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
  const auto resumed_steps = read_steps(dir / ("results/smoke.resumed-" + std::to_string(from) + ".h5"));
  ASSERT_GE(resumed_steps.size(), 5u);
  EXPECT_EQ(resumed_steps.front(), from + 1);
  EXPECT_TRUE(slurp(results) == bytes) << results << " changed";
}

}  // namespace

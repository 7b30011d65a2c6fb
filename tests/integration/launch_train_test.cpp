// Failure during training: one of 4 forked training ranks (PP2 x DP2) is killed with SIGKILL in
// the middle of the run; the whole run must end within the configured timeout, non-zero, and the
// launcher must name the dead rank. No hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/support/paths.h"
#include "tests/support/process.h"
#include "tests/support/synthetic_corpus.h"

namespace {

using optcc::testing::slurp;

// The child of `parent` whose environment holds OPTCC_RANK=<rank>, or -1.
pid_t find_rank(pid_t parent, int rank) {
  DIR* proc = opendir("/proc");
  pid_t found = -1;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(atoi(e->d_name));
    if (pid <= 0) continue;
    std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(close_paren + 2));
    char state;
    pid_t ppid;
    fields >> state >> ppid;
    if (ppid != parent) continue;
    std::string env = slurp("/proc/" + std::to_string(pid) + "/environ");
    if (env.find(std::string("OPTCC_RANK=") + std::to_string(rank) + '\0') != std::string::npos) found = pid;
  }
  closedir(proc);
  return found;
}

TEST(LocalLaunch, KilledTrainingRankEndsTheRun) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::string log = dir / "log.txt";
  std::vector<std::string> args = {
      std::string(optcc::testing::binary_dir()) + "/optcc", "train", "--nproc", "4", "--config",
      std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml",
      "--set", "data.prefix=" + (dir / "corpus"), "--set", "data.dir=" + (dir / "data"),
      "--set", "data.split=100,0,0", "--set", "train.eval_interval=0", "--set", "model.vocab_size=64", "--set", "parallel.pp=2",
      "--set", "parallel.dp=2", "--set", "train.train_steps=100000", "--set", "train.threads=1",
      "--set", "log.interval=1", "--set", "log.dir=" + (dir / "results"), "--set", "parallel.timeout_seconds=5"};
  const pid_t launcher = optcc::testing::spawn_logged(args, log);
  ASSERT_GT(launcher, 0) << "could not start optcc";

  // Wait until training runs (step 3 logged), then kill rank 2 (stage 1, dp 0).
  const auto start = std::chrono::steady_clock::now();
  while (slurp(log).find("step      3/") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << slurp(log);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const pid_t victim = find_rank(launcher, 2);
  ASSERT_GT(victim, 0) << "rank 2 not found among the launcher's children";
  const auto killed_at = std::chrono::steady_clock::now();
  kill(victim, SIGKILL);

  int status = 0;
  while (waitpid(launcher, &status, WNOHANG) == 0) {
    ASSERT_LT(std::chrono::steady_clock::now() - killed_at, std::chrono::seconds(5 + 5 + 10)) << "run did not end";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << slurp(log);
  EXPECT_THAT(slurp(log), ::testing::HasSubstr("rank 2 was killed by signal 9"));
  EXPECT_LT(seconds, 10.0);
  std::printf("run ended %.2f s after rank 2 was killed\n", seconds);
}

}  // namespace

// A config every rank would refuse (here a probability above 1, a rule checked where the whole config is
// validated) is refused by the launcher before any rank starts: the error once, exit 2, no rank line.
TEST(LocalLaunch, ConfigRefusalIsPrintedOnceBeforeAnyRankStarts) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::string log = dir / "log.txt";
  std::vector<std::string> args = {
      std::string(optcc::testing::binary_dir()) + "/optcc", "train", "--nproc", "4", "--config",
      std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml",
      "--set", "data.prefix=" + (dir / "corpus"), "--set", "data.dir=" + (dir / "data"),
      "--set", "model.vocab_size=64", "--set", "parallel.pp=2", "--set", "parallel.dp=2",
      "--set", "model.attention_dropout=1.5", "--set", "log.dir=" + (dir / "results")};
  const pid_t launcher = optcc::testing::spawn_logged(args, log);
  ASSERT_GT(launcher, 0) << "could not start optcc";
  EXPECT_EQ(optcc::testing::run_to_end(launcher, std::chrono::seconds(60)), 2) << slurp(log);
  const std::string out = slurp(log);
  size_t count = 0;
  for (size_t at = out.find("model.attention_dropout"); at != std::string::npos;
       at = out.find("model.attention_dropout", at + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 1u) << out;
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("launched"))) << "no rank may start";
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("was killed by signal")));
}

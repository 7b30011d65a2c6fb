// Faults that used to lose work, on the real binary: a stop signal (SIGTERM to the `--nproc`
// launcher, SIGUSR1 to a single rank) checkpoints the current step and exits 75, and `--resume auto`
// continues from it; a launcher killed with SIGKILL takes its ranks with it; an exported MASTER_PORT
// is not obeyed by the launcher; a listener that is not a store fails a rank within the timeout,
// naming host:port; a second run on the same directories is refused naming the first; a file-size
// limit (the same failing write as a full disk) stops the run naming the file and keeps the rows
// flushed before; an unwritable checkpoint.dir is refused before step 0.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/support/paths.h"
#include "tests/support/process.h"
#include "tests/support/results_file.h"
#include "tests/support/synthetic_corpus.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::Not;
using optcc::testing::child_env;
using optcc::testing::kill_and_reap;
using optcc::testing::read_train_steps;
using optcc::testing::run_to_end;
using optcc::testing::slurp;
using optcc::testing::wait_for;

constexpr int kStopped = 75;  // harness/parallel/stop_signal.h kStoppedExitCode

// A smoke run on a synthetic corpus under `dir`, long enough to be stopped; `extra` --set pairs.
std::vector<std::string> smoke_command(const optcc::testing::TempDir& dir, const std::vector<std::string>& extra) {
  std::vector<std::string> c = {std::string(optcc::testing::binary_dir()) + "/optcc", "train", "--config",
                                std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml"};
  for (const std::string& kv : {"data.prefix=" + (dir / "corpus"), "data.dir=" + (dir / "data"),
                                std::string("data.split=100,0,0"), std::string("train.eval_interval=0"),
                                std::string("model.vocab_size=64"), std::string("train.train_steps=100000"),
                                // Runs here last until signalled; the tiny model learns the synthetic
                                // corpus to near-zero loss, and at the default peak lr 1e-3 one such
                                // run ended with a NaN loss at step 187 (LibTorch 2.6, loaded CI).
                                // The faults under test do not depend on the learning rate.
                                std::string("train.lr=1e-4"),
                                std::string("train.threads=1"), "log.dir=" + (dir / "results"),
                                std::string("log.interval=1")}) {
    c.insert(c.end(), {"--set", kv});
  }
  for (const std::string& a : extra) c.push_back(a);
  return c;
}

pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& env, const std::string& log) {
  const pid_t pid = optcc::testing::spawn_logged(args, log, "", &env);
  EXPECT_GT(pid, 0) << "could not start " << args.at(0);
  return pid;
}

std::string iter_name(int64_t step) {
  const std::string s = std::to_string(step);
  return "iter_" + std::string(7 - s.size(), '0') + s;
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The step of the log's "stopping on <signal> at step N; checkpoint -> DIR" line (-1 when none),
// checking that DIR is that step's checkpoint under `ckpt`.
int64_t stopped_step(const std::string& log, const std::string& signal, const std::string& ckpt) {
  std::smatch m;
  const std::string text = slurp(log);
  if (!std::regex_search(text, m, std::regex("stopping on " + signal + " at step (\\d+); checkpoint -> (\\S+)"))) {
    return -1;
  }
  const int64_t step = std::stoll(m[1]);
  EXPECT_EQ(m[2].str(), ckpt + "/" + iter_name(step));
  return step;
}

// A TCP listener on 127.0.0.1 that never accepts or answers (the kernel completes connections into
// its backlog): what a rank meets when another program holds the port.
struct SilentListener {
  int fd = -1;
  int port = 0;
  SilentListener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(fd, 64);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~SilentListener() { close(fd); }
};

// Processes whose parent is `pid` (from /proc).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = slurp(e.path() / "stat");
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(close_paren + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid) out.push_back(std::stoi(name));
  }
  return out;
}

// Gone: no such process, or a zombie nobody reaps yet (it ran to its end).
bool gone(pid_t pid) {
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return true;
  const auto close_paren = stat.rfind(')');
  return close_paren != std::string::npos && stat.size() > close_paren + 2 && stat[close_paren + 2] == 'Z';
}

TEST(StopSignal, SigtermToTheLauncherCheckpointsTheCurrentStepAndResumeAutoContinues) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  // An explicit decay length: the resume below changes train_steps, which with decay_steps 0 would
  // move the schedule (refused, resume_check.h).
  const auto command = smoke_command(dir, {"--set", "parallel.dp=2", "--set", "checkpoint.interval=1000", "--set",
                                           "train.decay_steps=1000", "--nproc", "2"});
  const std::string results = dir / "results/smoke.h5", ckpt = dir / "results/ckpt/smoke";
  const std::string log1 = dir / "run1.txt";
  const pid_t launcher = spawn(command, child_env({}), log1);
  ASSERT_TRUE(wait_for(launcher, log1, "/100000 | loss")) << slurp(log1);
  kill(launcher, SIGTERM);
  EXPECT_EQ(run_to_end(launcher), kStopped) << slurp(log1);
  EXPECT_THAT(slurp(log1), HasSubstr("forwarded to the 2 ranks"));
  const int64_t step = stopped_step(log1, "SIGTERM", ckpt);
  ASSERT_GE(step, 1) << slurp(log1);
  EXPECT_LT(step, 1000) << "the periodic checkpoint, not the stop, wrote it";
  EXPECT_EQ(first_line(ckpt + "/latest"), iter_name(step));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(fs::exists(ckpt + "/" + iter_name(step) + "/rank_0000" + std::to_string(rank) + ".pt"));
  }
  const auto steps = read_train_steps(results);  // every step up to the stop, flushed
  ASSERT_EQ(steps.size(), static_cast<size_t>(step));
  EXPECT_EQ(steps.back(), step);
  EXPECT_FALSE(fs::exists(dir / "results/smoke.lock")) << "the lock outlived its run";
  EXPECT_FALSE(fs::exists(ckpt + "/optcc.lock"));

  // The same command with --resume auto and two more steps continues from the stop.
  auto resume = command;
  resume.insert(resume.end(), {"--set", "train.train_steps=" + std::to_string(step + 2), "--resume", "auto"});
  const std::string log2 = dir / "run2.txt";
  EXPECT_EQ(run_to_end(spawn(resume, child_env({}), log2), std::chrono::seconds(120)), 0) << slurp(log2);
  EXPECT_THAT(slurp(log2), HasSubstr("resumed from " + ckpt + "/" + iter_name(step) + " at step " +
                                     std::to_string(step)));
  EXPECT_EQ(read_train_steps(dir / ("results/smoke.resumed-" + std::to_string(step) + ".h5")),
            (std::vector<int64_t>{step + 1, step + 2}));
}

TEST(StopSignal, Sigusr1ToASingleRankStopsItTheSameWay) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::string ckpt = dir / "results/ckpt/smoke", log = dir / "run.txt";
  const pid_t pid = spawn(smoke_command(dir, {"--set", "checkpoint.interval=1000"}), child_env({}), log);
  ASSERT_TRUE(wait_for(pid, log, "/100000 | loss")) << slurp(log);
  kill(pid, SIGUSR1);
  EXPECT_EQ(run_to_end(pid), kStopped) << slurp(log);
  const int64_t step = stopped_step(log, "SIGUSR1", ckpt);
  ASSERT_GE(step, 1) << slurp(log);
  EXPECT_EQ(first_line(ckpt + "/latest"), iter_name(step));
  EXPECT_EQ(read_train_steps(dir / "results/smoke.h5").size(), static_cast<size_t>(step));
}

TEST(LocalLauncher, KilledLauncherTakesItsRanksWithIt) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::string log = dir / "run.txt";
  const pid_t launcher = spawn(smoke_command(dir, {"--set", "parallel.dp=2", "--nproc", "2"}), child_env({}), log);
  ASSERT_TRUE(wait_for(launcher, log, "/100000 | loss")) << slurp(log);
  const std::vector<pid_t> ranks = children_of(launcher);
  ASSERT_EQ(ranks.size(), 2u);
  kill_and_reap(launcher);
  const auto start = Clock::now();
  for (pid_t r : ranks) {
    while (!gone(r) && Clock::now() - start < std::chrono::seconds(60)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(gone(r)) << "rank pid " << r << " outlived its launcher by 60 s";
    if (!gone(r)) kill(r, SIGKILL);
  }
  // They stopped as on SIGTERM: the step they were in is checkpointed.
  EXPECT_GE(stopped_step(log, "SIGTERM", dir / "results/ckpt/smoke"), 1) << slurp(log);
}

TEST(LocalLauncher, ExportedMasterPortIsReplacedByThePortItPicks) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  SilentListener taken;  // a healthy run of someone else's, as far as this launcher can tell
  const std::string log = dir / "run.txt";
  auto command = smoke_command(dir, {"--set", "parallel.dp=2", "--set", "train.train_steps=2", "--nproc", "2"});
  const pid_t pid = spawn(command, child_env({"MASTER_PORT=" + std::to_string(taken.port)}), log);
  EXPECT_EQ(run_to_end(pid, std::chrono::seconds(120)), 0) << slurp(log);
  std::smatch m;
  const std::string text = slurp(log);
  ASSERT_TRUE(std::regex_search(text, m, std::regex("rendezvous 127\\.0\\.0\\.1:(\\d+)"))) << text;
  EXPECT_NE(std::stoi(m[1]), taken.port);
}

TEST(Rendezvous, ListenerThatIsNotAStoreFailsWithinTheTimeoutNamingHostAndPort) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  SilentListener wrong;
  const std::string log = dir / "run.txt";
  const auto env = child_env({"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                              "MASTER_PORT=" + std::to_string(wrong.port)});
  const auto start = Clock::now();
  const int code = run_to_end(spawn(smoke_command(dir, {"--set", "parallel.dp=2", "--set",
                                                        "parallel.timeout_seconds=3"}),
                                    env, log),
                              std::chrono::seconds(60));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_NE(code, 0) << slurp(log);
  EXPECT_NE(code, -1) << "still waiting after 60 s: " << slurp(log);
  EXPECT_THAT(slurp(log), HasSubstr("rendezvous at 127.0.0.1:" + std::to_string(wrong.port)));
  EXPECT_LT(seconds, 3.0 + 2.0 + 10.0) << "timeout + slack + start-up exceeded";
}

TEST(RunLock, SecondRunOnTheSameDirectoriesIsRefusedNamingTheFirst) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const auto first_command = smoke_command(dir, {"--set", "parallel.dp=2", "--nproc", "2"});
  const std::string log1 = dir / "run1.txt", log2 = dir / "run2.txt";
  const pid_t first = spawn(first_command, child_env({}), log1);
  ASSERT_TRUE(wait_for(first, log1, "/100000 | loss")) << slurp(log1);
  auto second_command = first_command;
  second_command.insert(second_command.end(), {"--set", "train.lr=3e-4"});
  const int second = run_to_end(spawn(second_command, child_env({}), log2), std::chrono::seconds(120));
  EXPECT_NE(second, 0) << slurp(log2);
  EXPECT_NE(second, -1) << "the second run did not end";
  EXPECT_THAT(slurp(log2), HasSubstr("is in use by another run (" + (dir / "results") + "/ckpt/smoke/optcc.lock: pid "));
  EXPECT_THAT(slurp(log2), HasSubstr(" run smoke (global rank 0 of the --nproc launcher pid " + std::to_string(first) +
                                     "))"));
  EXPECT_THAT(slurp(log2), Not(HasSubstr("/100000 | loss")));
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir / "results")) files.push_back(e.path().filename().string());
  EXPECT_THAT(files, ::testing::UnorderedElementsAre("smoke.h5", "smoke.lock", "ckpt")) << "the second run wrote";
  kill(first, SIGTERM);
  EXPECT_EQ(run_to_end(first), kStopped) << slurp(log1);
}

TEST(FullDisk, FileSizeLimitStopsTheRunNamingTheFileAndKeepsWhatWasWritten) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const std::string ckpt = dir / "results/ckpt/smoke", log = dir / "run.txt";
  std::string command = "ulimit -f 1000 && exec";  // KiB: the results file fits, the first checkpoint does not
  // 50 steps: the dataset's index cache stays small (its writes fail as clearly, but this test is
  // about the run's own files).
  for (const auto& a : smoke_command(dir, {"--set", "checkpoint.interval=5", "--set", "train.train_steps=50"})) {
    command += " '" + a + "'";
  }
  const int code = run_to_end(spawn({"/bin/bash", "-c", command}, child_env({}), log), std::chrono::seconds(120));
  EXPECT_EQ(code, 1) << slurp(log);
  EXPECT_THAT(slurp(log), ::testing::ContainsRegex("cannot write " + ckpt + "/iter_0000005/rank_00000\\.pt\\.tmp: "
                                                   "File too large|results file .*File too large"));
  EXPECT_THAT(slurp(log), Not(HasSubstr("Segmentation")));
  EXPECT_THAT(slurp(log), Not(HasSubstr("enforce fail")));
  ASSERT_TRUE(fs::exists(dir / "results/smoke.h5")) << slurp(log);
  const auto steps = read_train_steps(dir / "results/smoke.h5");  // readable, every flushed row in order
  ASSERT_FALSE(steps.empty());
  for (size_t i = 0; i < steps.size(); ++i) ASSERT_EQ(steps[i], static_cast<int64_t>(i + 1));
  EXPECT_FALSE(fs::exists(ckpt + "/latest")) << "a partial checkpoint was published";
  EXPECT_FALSE(fs::exists(ckpt + "/iter_0000005"));
}

TEST(FullDisk, UnwritableCheckpointDirIsRefusedBeforeStepZero) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  std::ofstream(dir / "a-file") << "not a directory\n";
  const std::string log = dir / "run.txt";
  const int code = run_to_end(
      spawn(smoke_command(dir, {"--set", "checkpoint.dir=" + (dir / "a-file/ckpt")}), child_env({}), log));
  EXPECT_NE(code, 0) << slurp(log);
  EXPECT_THAT(slurp(log), HasSubstr("checkpoint.dir " + (dir / "a-file/ckpt") + ": rank 0 cannot create a file there: "
                                    "Not a directory"));
  EXPECT_THAT(slurp(log), Not(HasSubstr("| loss")));
}

}  // namespace

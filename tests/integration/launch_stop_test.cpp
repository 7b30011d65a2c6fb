// A stop signal never changes the run it stops (harness/parallel/stop_signal.h). SIGTERM goes to the
// `--nproc` launcher at a random moment of a random step, the run must exit 75 with a checkpoint,
// and `--resume auto` must then finish it: the losses of every step and the final validation loss
// equal those of the uninterrupted run bit for bit. Three set-ups: plain data parallelism, a
// compressed scheme over pipeline and data parallelism (cb_fe_sc), and DiLoCo with two fragments, a
// sync delay and mixing. OPTCC_STOP_TRIALS sets the trials per set-up (default 2; a soak: 20); the random choices
// come from a seed printed with every failure (OPTCC_STOP_SEED repeats one).
// Also: every thread of a training rank but one blocks SIGTERM and SIGUSR1 (/proc/PID/task/*/status).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "tests/support/paths.h"
#include "tests/support/process.h"
#include "tests/support/results_file.h"
#include "tests/support/synthetic_corpus.h"

namespace {

namespace fs = std::filesystem;
using optcc::testing::child_env;
using optcc::testing::kill_and_reap;
using optcc::testing::read_column;
using optcc::testing::run_to_end;
using optcc::testing::slurp;
using optcc::testing::wait_for;

constexpr int kStopped = 75;  // harness/parallel/stop_signal.h kStoppedExitCode
constexpr int kSteps = 32;    // a multiple of DiLoCo's inner_steps below

struct Layout {
  std::string name;
  int nproc;
  std::vector<std::string> sets;
};

std::vector<Layout> setups() {
  return {
      {"dp", 2, {"parallel.dp=2"}},
      {"cb_fe_sc", 4, {"parallel.pp=2", "parallel.dp=2", "compression.scheme=cb_fe_sc"}},
      {"diloco", 2, {"parallel.dp=2", "compression.dp_strategy=diloco", "compression.dp=none", "diloco.inner_steps=4",
                     "diloco.fragments=2", "diloco.sync_delay=1", "diloco.mix=0.5"}},
  };
}

std::vector<std::string> command(const optcc::testing::TempDir& dir, const Layout& s, const std::string& run) {
  std::vector<std::string> c = {std::string(optcc::testing::binary_dir()) + "/optcc", "train", "--config",
                                std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml"};
  std::vector<std::string> sets = {"data.prefix=" + (dir / "corpus"), "data.dir=" + (dir / "data"),
                                   "data.split=80,20,0", "train.eval_interval=0", "train.eval_iters=2",
                                   "model.vocab_size=64", "train.train_steps=" + std::to_string(kSteps),
                                   "train.lr=1e-4", "train.threads=1", "log.dir=" + (dir / "results"),
                                   "log.interval=1", "log.run_name=" + run, "checkpoint.interval=1000",
                                   "checkpoint.save_final=false"};
  sets.insert(sets.end(), s.sets.begin(), s.sets.end());
  for (const auto& kv : sets) c.insert(c.end(), {"--set", kv});
  c.insert(c.end(), {"--nproc", std::to_string(s.nproc)});
  return c;
}

pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  const auto env = child_env({});
  const pid_t pid = optcc::testing::spawn_logged(args, log, "", &env);
  EXPECT_GT(pid, 0) << "could not start " << args.at(0);
  return pid;
}

struct Curve {
  std::vector<double> train, eval;
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

TEST(StopSignalExactness, SigtermAtRandomMomentsLeavesEveryRunBitIdenticalAfterResume) {
  const int trials = env_int("OPTCC_STOP_TRIALS", 2);
  const unsigned seed = static_cast<unsigned>(env_int("OPTCC_STOP_SEED", static_cast<int>(std::random_device{}() >> 1)));
  std::mt19937 rng(seed);
  int stopped_and_equal = 0;
  for (const Layout& s : setups()) {
    optcc::testing::TempDir dir;
    optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
    const std::string ref_log = dir / "reference.txt";
    ASSERT_EQ(run_to_end(spawn(command(dir, s, "reference"), ref_log), std::chrono::seconds(300)), 0)
        << s.name << ": " << slurp(ref_log);
    const Curve ref{read_column(dir / "results/reference.h5", "/train/loss"),
                    read_column(dir / "results/reference.h5", "/eval/loss")};
    ASSERT_EQ(ref.train.size(), static_cast<size_t>(kSteps)) << s.name;
    ASSERT_EQ(ref.eval.size(), 1u) << s.name;
    for (int t = 0; t < trials; ++t) {
      const int step = std::uniform_int_distribution<int>(1, kSteps - 6)(rng);
      const int delay_ms = std::uniform_int_distribution<int>(0, 60)(rng);
      SCOPED_TRACE(fmt::format("{} trial {}: SIGTERM {} ms after the log shows step {} (OPTCC_STOP_SEED={})", s.name,
                               t, delay_ms, step, seed));
      const std::string run = "trial" + std::to_string(t), log = dir / (run + ".txt");
      const pid_t launcher = spawn(command(dir, s, run), log);
      ASSERT_TRUE(wait_for(launcher, log, fmt::format("step {:>6}/{} | loss", step, kSteps), std::chrono::seconds(300)))
          << slurp(log);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      kill(launcher, SIGTERM);
      ASSERT_EQ(run_to_end(launcher, std::chrono::seconds(300)), kStopped) << slurp(log);
      const std::vector<double> before = read_column(dir / ("results/" + run + ".h5"), "/train/loss");
      const int stopped_at = static_cast<int>(before.size());
      ASSERT_GE(stopped_at, step);
      ASSERT_LE(stopped_at, kSteps);  // at kSteps: the signal reached the last step (the log lags); resume only evaluates
      auto resume = command(dir, s, run);
      resume.insert(resume.end(), {"--resume", "auto"});
      const std::string log2 = dir / (run + "-resumed.txt");
      ASSERT_EQ(run_to_end(spawn(resume, log2), std::chrono::seconds(300)), 0) << slurp(log2);
      const std::string resumed = dir / fmt::format("results/{}.resumed-{}.h5", run, stopped_at);
      std::vector<double> all = before;
      for (double l : read_column(resumed, "/train/loss")) all.push_back(l);
      ASSERT_EQ(all.size(), ref.train.size());
      bool equal = true;
      for (size_t i = 0; i < all.size(); ++i) {
        // Bit for bit: the same double, not a tolerance.
        EXPECT_EQ(all[i], ref.train[i]) << "step " << i + 1 << " (stopped after step " << stopped_at << ")";
        equal = equal && all[i] == ref.train[i];
      }
      const auto eval = read_column(resumed, "/eval/loss");
      ASSERT_EQ(eval.size(), 1u);
      EXPECT_EQ(eval[0], ref.eval[0]) << "final validation loss";
      EXPECT_THAT(slurp(log), ::testing::Not(::testing::HasSubstr("inf/NaN")));
      if (equal && eval[0] == ref.eval[0]) ++stopped_and_equal;
    }
  }
  std::cout << fmt::format("stop-signal exactness: {} of {} stopped-and-resumed runs (3 set-ups x {} trials, seed {}) "
                           "equal the uninterrupted run bit for bit\n",
                           stopped_and_equal, 3 * trials, trials, seed);
}

// SigBlk of /proc/PID/task/TID/status as a number.
uint64_t blocked_mask(const fs::path& task) {
  std::istringstream in(slurp(task / "status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  }
  return 0;
}

TEST(StopSignalThreads, EveryThreadOfARankButTheSignalThreadBlocksSigtermAndSigusr1) {
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  Layout s{"dp", 1, {"train.threads=2"}};
  auto c = command(dir, s, "threads");
  c.resize(c.size() - 2);  // no --nproc: one process, the rank itself
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i] == "train.train_steps=" + std::to_string(kSteps)) c[i] = "train.train_steps=100000";
  }
  const std::string log = dir / "run.txt";
  const pid_t pid = spawn(c, log);
  ASSERT_TRUE(wait_for(pid, log, "/100000 | loss")) << slurp(log);
  const uint64_t stop_bits = (uint64_t{1} << (SIGTERM - 1)) | (uint64_t{1} << (SIGUSR1 - 1));
  int threads = 0, signal_threads = 0;
  std::vector<std::string> unblocked;
  for (const auto& task : fs::directory_iterator(fs::path("/proc") / std::to_string(pid) / "task")) {
    ++threads;
    std::string name = slurp(task.path() / "comm");
    while (!name.empty() && name.back() == '\n') name.pop_back();
    if (name == "optcc-signals") {
      ++signal_threads;
      continue;
    }
    if ((blocked_mask(task.path()) & stop_bits) != stop_bits) unblocked.push_back(name + " " + task.path().filename().string());
  }
  kill(pid, SIGTERM);
  EXPECT_EQ(run_to_end(pid, std::chrono::seconds(120)), kStopped) << slurp(log);
  EXPECT_EQ(signal_threads, 1);
  EXPECT_GE(threads, 3) << "a training rank runs compute and communication threads";
  EXPECT_THAT(unblocked, ::testing::IsEmpty()) << "threads that a stop signal could interrupt";
}

// A command that does not train ends on SIGTERM as before (the signal thread applies the default).
TEST(StopSignalThreads, ACommandThatDoesNotTrainStillEndsOnSigterm) {
  optcc::testing::TempDir dir;
  const std::string log = dir / "sleep.txt";
  // `optcc comm-check` with an unreachable master waits for its rendezvous: long enough to be signalled.
  const auto env = child_env({"OPTCC_RANK=1", "OPTCC_WORLD_SIZE=2", "OPTCC_LOCAL_RANK=1", "OPTCC_LOCAL_WORLD_SIZE=2",
                              "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1"});
  const pid_t pid = optcc::testing::spawn_logged(
      {std::string(optcc::testing::binary_dir()) + "/optcc", "comm-check", "--config",
       std::string(optcc::testing::source_dir()) + "/experiments/smoke.yaml", "--set", "parallel.dp=2"},
      log, "", &env);
  ASSERT_GT(pid, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  kill(pid, SIGTERM);
  EXPECT_EQ(run_to_end(pid, std::chrono::seconds(30)), 128 + SIGTERM) << slurp(log);
}

// Runs `python3 ARGS...` (OPTCC_PYTHON, else /usr/bin/python3: Debian's, with h5py) with output into
// `log`; its exit code.
int python(const std::vector<std::string>& args, const std::string& log) {
  const char* env_py = std::getenv("OPTCC_PYTHON");
  std::vector<std::string> c = {env_py != nullptr ? env_py : "/usr/bin/python3"};
  c.insert(c.end(), args.begin(), args.end());
  const auto env = child_env({});
  return run_to_end(optcc::testing::spawn_logged(c, log, "", &env), std::chrono::seconds(300));
}

// Opens every *.h5 under a folder with a plain h5py.File(path, "r") (no SWMR): prints the ones that fail.
constexpr const char* kPlainOpenEvery = R"(
import sys, glob, h5py
bad = []
for p in sorted(glob.glob(sys.argv[1] + "/**/*.h5", recursive=True)):
    try:
        h5py.File(p, "r").close()
    except OSError as e:
        bad.append(p + ": " + str(e))
print("plain-open failures:", len(bad))
for b in bad: print(b)
sys.exit(1 if bad else 0)
)";

// Opens a results file for writing in SWMR mode, as optcc's writer does in a flush, and dies by SIGKILL.
constexpr const char* kSwmrWriterKilled = R"(
import os, signal, sys, h5py
f = h5py.File(sys.argv[1], "r+", libver="latest")
f.swmr_mode = True
f.flush()
os.kill(os.getpid(), signal.SIGKILL)
)";

// Runs killed with SIGKILL at random moments (log.interval 1: a flush every step, so some kills land
// inside one and leave HDF5's "open for write" flag): a resume clears its own run's files, and
// results_index.py (as every optcc_results.py reader) clears the rest; then every file opens in a plain
// h5py reader. How many files carried the flag before is printed (the kills' share is random).
TEST(KilledRunFiles, OpenInAPlainReaderAfterAResumeOrTheIndex) {
  const int kills = env_int("OPTCC_KILL_TRIALS", 6);
  const unsigned seed = static_cast<unsigned>(env_int("OPTCC_STOP_SEED", static_cast<int>(std::random_device{}() >> 1)));
  std::mt19937 rng(seed);
  SCOPED_TRACE(fmt::format("OPTCC_STOP_SEED={}", seed));
  optcc::testing::TempDir dir;
  optcc::testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  const Layout one{"single", 1, {"checkpoint.interval=1", "train.train_steps=40"}};
  const auto run_command = [&](const std::string& run) {
    auto c = command(dir, one, run);
    c.resize(c.size() - 2);  // no --nproc: the rank itself, so SIGKILL reaches the writer
    return c;
  };
  for (int k = 0; k < kills; ++k) {
    const std::string run = "killed" + std::to_string(k), log = dir / (run + ".txt");
    const int step = std::uniform_int_distribution<int>(2, 20)(rng);
    const pid_t pid = spawn(run_command(run), log);
    ASSERT_TRUE(wait_for(pid, log, fmt::format("step {:>6}/", step), std::chrono::seconds(300))) << slurp(log);
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 30000)(rng)));
    kill_and_reap(pid);
  }
  // Where no kill landed inside a flush, two files get the state such a kill leaves: a writer in
  // SWMR mode killed with SIGKILL (here a python3 writer that opens the file, starts SWMR and is
  // killed), so both repair paths below always have something to repair.
  for (const int k : {0, 2}) {
    const std::string log = dir / fmt::format("poison{}.txt", k);
    python({"-c", kSwmrWriterKilled, dir / fmt::format("results/killed{}.h5", k)}, log);
  }
  const std::string before_log = dir / "before.txt";
  EXPECT_EQ(python({"-c", kPlainOpenEvery, dir / "results"}, before_log), 1) << slurp(before_log);
  EXPECT_THAT(slurp(before_log), ::testing::HasSubstr("already open for write"));
  std::cout << "before any reader: " << slurp(before_log);
  // The first two runs resume (and finish): the trainer, holding the run's lock, clears their files.
  for (int k = 0; k < 2; ++k) {
    const std::string run = "killed" + std::to_string(k), log = dir / (run + "-resumed.txt");
    auto c = run_command(run);
    c.insert(c.end(), {"--resume", "auto"});
    ASSERT_EQ(run_to_end(spawn(c, log), std::chrono::seconds(300)), 0) << slurp(log);
    const std::string check = dir / (run + "-check.txt");
    EXPECT_EQ(python({"-c", "import sys, h5py; h5py.File(sys.argv[1], 'r').close()", dir / ("results/" + run + ".h5")},
                     check), 0)
        << slurp(check);
  }
  const std::string index_log = dir / "index.txt";
  ASSERT_EQ(python({std::string(optcc::testing::source_dir()) + "/scripts/results_index.py", "--results", dir / "results"}, index_log),
            0)
      << slurp(index_log);
  const std::string after_log = dir / "after.txt";
  EXPECT_EQ(python({"-c", kPlainOpenEvery, dir / "results"}, after_log), 0) << slurp(after_log);
  EXPECT_THAT(slurp(dir / "results/index.csv"), ::testing::HasSubstr("killed" + std::to_string(kills - 1)));
}

}  // namespace

// Checkpoint pruning with stale directories present (an earlier attempt, a resume from an earlier
// checkpoint): the checkpoint just written is never removed, `latest` always names a loadable
// checkpoint, later-step directories of the abandoned timeline go, order is by step. Checksums,
// NaN/inf state refused on load, write failures (a file-size limit, another rank's failure) that
// leave no partial checkpoint, and the run lock (run_lock.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <limits>
#include <filesystem>
#include <fstream>

#include "harness/records/checkpoint.h"
#include "harness/records/run_lock.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A tiny model whose weight encodes the step it was saved at, so a load tells which one it read.
struct Saver {
  torch::nn::Linear model{torch::nn::LinearOptions(2, 2)};
  torch::optim::AdamW opt{model->parameters(), torch::optim::AdamWOptions(1e-3)};

  std::string save(const std::string& dir, int64_t step, int64_t keep) {
    {
      torch::NoGradGuard no_grad;
      model->weight.fill_(static_cast<float>(step));
    }
    return save_checkpoint(dir, TrainState{step, step * 8}, *model, opt, CheckpointLayout{}, "cfg", keep);
  }
  int64_t load(const std::string& dir) {
    {
      torch::NoGradGuard no_grad;
      model->weight.fill_(-1.0f);
    }
    const TrainState s = load_checkpoint(dir, *model, opt, CheckpointLayout{});
    EXPECT_EQ(model->weight[0][0].item<float>(), static_cast<float>(s.step)) << "weights of another step";
    return s.step;
  }
};

std::vector<std::string> iter_dirs(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string latest_name(const std::string& dir) { return fs::path(*latest_checkpoint(dir)).filename().string(); }

// The case: a run reached 30 (iter 10, 20, 30 on disk),
// is resumed from iter 10 and writes iter 15 with keep = 1. Name order would remove iter 15.
TEST(CheckpointPrune, ResumedFromEarlierStepKeepsTheNewWrite) {
  testing::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Saver s;
  for (int64_t step : {10, 20, 30}) s.save(dir, step, 0);
  s.save(dir, 15, 1);
  EXPECT_THAT(iter_dirs(dir), ElementsAre("iter_0000015"));
  EXPECT_EQ(latest_name(dir), "iter_0000015");
  EXPECT_EQ(s.load(dir), 15);
}

// Stale iter 15 and 20 of an earlier attempt; a fresh run writes 5 and 10 with keep = 2: its own
// checkpoints stay, the abandoned later ones go.
TEST(CheckpointPrune, FreshRunOverStaleAttemptKeepsItsOwn) {
  testing::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Saver s;
  for (int64_t step : {15, 20}) s.save(dir, step, 0);
  s.save(dir, 5, 2);
  EXPECT_THAT(iter_dirs(dir), ElementsAre("iter_0000005"));
  EXPECT_EQ(s.load(dir), 5);
  s.save(dir, 10, 2);
  EXPECT_THAT(iter_dirs(dir), ElementsAre("iter_0000005", "iter_0000010"));
  EXPECT_EQ(latest_name(dir), "iter_0000010");
  EXPECT_EQ(s.load(dir), 10);
}

// keep = 3 after resuming at 10 of a run that reached 30: 15 (just written), 10, 5 remain.
TEST(CheckpointPrune, KeepsNewestEarlierStepsAndDropsTheAbandonedFuture) {
  testing::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Saver s;
  for (int64_t step : {5, 10, 20, 25, 30}) s.save(dir, step, 0);
  fs::create_directories(fs::path(dir) / "notes");  // not a checkpoint: left alone
  std::ofstream(fs::path(dir) / "iter_x") << "not a checkpoint either";
  s.save(dir, 15, 3);
  EXPECT_THAT(iter_dirs(dir), ElementsAre("iter_0000005", "iter_0000010", "iter_0000015", "notes"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "iter_x"));
  EXPECT_EQ(s.load(dir), 15);
  EXPECT_EQ(s.load(tmp / "ckpt/iter_0000005"), 5);
}

// Steps past 9,999,999 print with 8 digits: "iter_10000000" sorts before "iter_9999999" as text.
TEST(CheckpointPrune, OrdersByStepNotByName) {
  testing::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Saver s;
  s.save(dir, 9999998, 0);
  s.save(dir, 9999999, 2);
  s.save(dir, 10000000, 2);
  EXPECT_THAT(iter_dirs(dir), ElementsAre("iter_10000000", "iter_9999999"));
  EXPECT_EQ(s.load(dir), 10000000);
}

// keep = 0 keeps everything, stale ones included; `latest` names the write.
TEST(CheckpointPrune, KeepZeroRemovesNothing) {
  testing::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Saver s;
  for (int64_t step : {20, 30, 10}) s.save(dir, step, 0);
  EXPECT_THAT(iter_dirs(dir), ElementsAre("iter_0000010", "iter_0000020", "iter_0000030"));
  EXPECT_EQ(s.load(dir), 10);
}

// A `latest` naming a missing checkpoint (what the old pruning left) is an error naming both, not a
// silent fresh start.
TEST(CheckpointPrune, LatestNamingAMissingCheckpointIsAClearError) {
  testing::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Saver s;
  s.save(dir, 10, 0);
  fs::remove_all(fs::path(dir) / "iter_0000010");
  try {
    find_checkpoint(dir);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("latest names " + dir + "/iter_0000010, which holds no rank_00000.pt"));
  }
  EXPECT_FALSE(find_checkpoint(tmp / "nothing").has_value());
  EXPECT_FALSE(find_checkpoint(tmp.str()).has_value());
}

// Every rank file carries a SHA-256 written with it; a flipped byte, a truncation or a missing
// checksum is found on load, before anything is read, and the error names the newest intact older
// checkpoint and the --resume command for it.
TEST(CheckpointChecksum, CorruptFileIsRefusedNamingTheNewestIntactOlderCheckpoint) {
  testing::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Saver s;
  for (int64_t step : {10, 20, 30}) s.save(dir, step, 0);
  const std::string file = dir + "/iter_0000030/rank_00000.pt";
  ASSERT_EQ(checkpoint_checksum_problem(file), "");
  std::ifstream sum(checkpoint_checksum_file(file));
  std::string digest, name;
  sum >> digest >> name;
  EXPECT_EQ(digest.size(), 64u);
  EXPECT_EQ(name, "rank_00000.pt");
  {  // one byte in the middle of the file
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(file) / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  // iter 20's file is damaged too (truncated): the newest intact older one is iter 10.
  fs::resize_file(dir + "/iter_0000020/rank_00000.pt", fs::file_size(dir + "/iter_0000020/rank_00000.pt") - 7);
  try {
    s.load(dir);
    ADD_FAILURE() << "a corrupt checkpoint loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(file + " is corrupt: its SHA-256 is"));
    EXPECT_THAT(e.what(), HasSubstr("written with it, says " + digest));
    EXPECT_THAT(e.what(), HasSubstr("Fix: resume from the newest intact older checkpoint: --resume " + dir +
                                    "/iter_0000010"));
  }
  EXPECT_EQ(s.load(dir + "/iter_0000010"), 10);
  fs::remove(checkpoint_checksum_file(dir + "/iter_0000010/rank_00000.pt"));
  try {
    s.load(dir + "/iter_0000010");
    ADD_FAILURE() << "a checkpoint without its checksum loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("iter_0000010/rank_00000.pt has no checksum"));
    EXPECT_THAT(e.what(), HasSubstr("no older intact checkpoint of this rank"));
  }
}

// A NaN in a compressor part's state (an error-feedback buffer) or in the optimizer's moments: the
// checkpoint is refused on load, naming the tensors, the rank and the newest older checkpoint.
TEST(CheckpointNonFinite, PoisonedStateIsRefusedOnLoadNamingTheTensorAndAnOlderCheckpoint) {
  testing::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Saver s;
  float ef_value = 1.0f;
  const std::vector<CheckpointPart> parts = {
      {"dp_reducer", "powersgd(rank=4)", [&](auto& a) { a.write("error_feedback/w", torch::full({3}, ef_value)); },
       [](auto&) {}}};
  save_checkpoint(dir, TrainState{10, 80}, *s.model, s.opt, CheckpointLayout{}, "cfg", 0, [](bool ok) { return ok; },
                  {}, parts);
  ef_value = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(non_finite_state(s.opt, parts), ElementsAre("state/dp_reducer/error_feedback/w"));
  save_checkpoint(dir, TrainState{20, 160}, *s.model, s.opt, CheckpointLayout{}, "cfg", 0, [](bool ok) { return ok; },
                  {}, parts);
  try {
    load_checkpoint(dir, *s.model, s.opt, CheckpointLayout{}, {}, parts);
    ADD_FAILURE() << "a checkpoint with a NaN in its compressor state loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("iter_0000020/rank_00000.pt (rank 0) holds NaN or infinite values in 1 tensor: "
                                    "state/dp_reducer/error_feedback/w"));
    EXPECT_THAT(e.what(), HasSubstr("--resume " + dir + "/iter_0000010"));
  }
  ef_value = 1.0f;
  EXPECT_TRUE(non_finite_state(s.opt, parts).empty());
  // The optimizer's moments are checked the same way (the model's weights too).
  s.opt.zero_grad();
  s.model->weight.mutable_grad() = torch::ones({2, 2});
  s.model->bias.mutable_grad() = torch::ones({2});
  s.opt.step();
  EXPECT_TRUE(non_finite_state(s.opt, parts).empty());
  static_cast<torch::optim::AdamWParamState&>(*s.opt.state().begin()->second).exp_avg().view({-1})[0].fill_(INFINITY);
  const auto bad = non_finite_state(s.opt, parts);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_THAT(bad[0], ::testing::StartsWith("optimizer/group 0 parameter "));
  EXPECT_THAT(bad[0], ::testing::EndsWith("/exp_avg"));
}

// A file-size limit (the same write path as a full disk) while the rank file is written: an error
// naming the file and the OS error, never an abort; nothing of that checkpoint stays and `latest`
// still names the previous one. The soft limit is put back before any assertion.
TEST(CheckpointWrite, FileSizeLimitIsAnErrorNamingTheFileAndLeavesThePreviousCheckpoint) {
  testing::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Saver s;
  s.save(dir, 10, 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  getrlimit(RLIMIT_FSIZE, &old_limit);
  rlimit limit = old_limit;
  limit.rlim_cur = 1024;  // bytes: the archive is larger
  setrlimit(RLIMIT_FSIZE, &limit);
  std::string what = "no error";
  try {
    s.save(dir, 20, 0);
  } catch (const std::exception& e) {
    what = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_THAT(what, HasSubstr("checkpoint: cannot write " + dir + "/iter_0000020/rank_00000.pt.tmp: File too large"));
  EXPECT_THAT(what, HasSubstr("`latest`, if there is one, still names the last complete checkpoint"));
  EXPECT_EQ(latest_name(dir), "iter_0000010");
  EXPECT_THAT(iter_dirs(dir), ElementsAre("iter_0000010"));
  EXPECT_EQ(s.load(dir), 10);
}

// Another rank failed to write its file (all_written answers false): this rank's file of the step
// goes too, and so does the step's directory; `latest` is untouched.
TEST(CheckpointWrite, AnotherRanksFailureLeavesNoPartialCheckpoint) {
  testing::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Saver s;
  s.save(dir, 10, 0);
  int calls = 0;
  try {
    save_checkpoint(dir, TrainState{20, 160}, *s.model, s.opt, CheckpointLayout{}, "cfg", 0,
                    [&](bool ok) { return ++calls > 1 && ok; });
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("another rank could not write its file of " + dir + "/iter_0000020"));
  }
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(latest_name(dir), "iter_0000010");
  EXPECT_THAT(iter_dirs(dir), ElementsAre("iter_0000010"));
}

// One run per directory: a second lock is refused naming the holder; released, the file goes and
// the next run takes it; a lock file left by a dead holder is taken over, naming it.
TEST(RunLockTest, SecondHolderIsRefusedNamingTheFirstAndAStaleFileIsTakenOver) {
  testing::TempDir tmp;
  const std::string path = tmp / "optcc.lock";
  {
    RunLock first(path, "checkpoint.dir X", "run-a");
    EXPECT_EQ(first.stale_holder(), "");
    try {
      RunLock second(path, "checkpoint.dir X", "run-b");
      ADD_FAILURE() << "two holders";
    } catch (const RunLockHeld& e) {
      EXPECT_THAT(e.what(), HasSubstr("checkpoint.dir X is in use by another run (" + path + ": pid " +
                                      std::to_string(getpid()) + " host "));
      EXPECT_THAT(e.what(), HasSubstr(" run run-a)"));
    }
  }
  EXPECT_FALSE(fs::exists(path));
  std::ofstream(path) << "pid 999999999 host elsewhere started 2026-01-01T00:00:00Z run old\n";
  RunLock third(path, "checkpoint.dir X", "run-c");
  EXPECT_EQ(third.stale_holder(), "pid 999999999 host elsewhere started 2026-01-01T00:00:00Z run old");
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_THAT(line, ::testing::StartsWith("pid " + std::to_string(getpid()) + " host "));
  EXPECT_THAT(line, ::testing::EndsWith(" run run-c"));
}

}  // namespace
}  // namespace optcc

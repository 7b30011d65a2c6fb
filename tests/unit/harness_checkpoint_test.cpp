// Checkpoint pruning with stale directories present (an earlier attempt, a resume from an earlier
// checkpoint): the checkpoint just written is never removed, `latest` always names a loadable
// checkpoint, later-step directories of the abandoned timeline go, order is by step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "harness/records/checkpoint.h"
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

}  // namespace
}  // namespace optcc

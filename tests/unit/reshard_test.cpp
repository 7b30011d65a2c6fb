// Checkpoint merge and re-shard (harness/checkpoints/checkpoint_reshard.h, models/sharding.h): the shards
// of a TP2 x PP2 (x DP2) checkpoint merge into exactly the single-rank model of the same seed, and the
// merged model cut into other layouts gives exactly the shards those layouts build from that seed
// (padding rows of the word embedding aside: they are zero after a re-shard). Ranks as threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <mutex>

#include "harness/parallel/distributed.h"
#include "harness/records/checkpoint.h"
#include "harness/checkpoints/checkpoint_reshard.h"
#include "harness/train/optimizer.h"
#include "harness/train/trainer.h"
#include "models/sharding.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

constexpr int64_t kVocab = 100;  // padded to 104 on one TP rank, 112 on two, 128 on four

Config layout_config(int tp, int pp, int dp, uint64_t seed = 7) {
  Config c;
  c.model.num_layers = 4;
  c.model.hidden_size = 32;
  c.model.num_heads = 4;
  c.model.seq_len = 16;
  c.model.vocab_size = kVocab;
  c.model.vocab_divisor = 8;
  c.parallel.tp = tp, c.parallel.pp = pp, c.parallel.dp = dp;
  c.train.seed = static_cast<int64_t>(seed);
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 2 * dp;
  return c;
}

struct Shard {
  int tp_rank = 0;
  StageRange stage;
  std::map<std::string, torch::Tensor> params;  // stage names
};

// Every rank of `c`'s layout builds its stage of the model from c's seed; with `dir`, each also
// writes its checkpoint there (step 5). `tweak` may change a rank's model first.
std::vector<Shard> build_layout(const Config& c, const std::string& dir,
                                const std::function<void(int, GptModelImpl&)>& tweak = {}) {
  const int world = static_cast<int>(c.parallel.tp * c.parallel.pp * c.parallel.dp);
  std::vector<Shard> out(world);
  testing::run_layout({int(c.parallel.tp), int(c.parallel.pp), int(c.parallel.dp)}, [&](int rank, Distributed& d) {
    GptModel model(gpt_options(c), d.tp.get(), stage_range(c, d.coord().pp));
    if (tweak) tweak(rank, *model);
    if (!dir.empty()) {
      auto opt = make_adamw(*model, c.train);
      save_checkpoint(dir, TrainState{5, 10}, *model, *opt, {c.parallel.tp, c.parallel.pp, c.parallel.dp, rank},
                      to_yaml(c), 0, [&](bool ok) {
                        d.world->barrier();
                        return ok;
                      });
    }
    out[rank].tp_rank = d.coord().tp;
    out[rank].stage = model->stage();
    for (const auto& p : model->named_parameters()) out[rank].params[p.key()] = p.value().detach().clone();
    d.world->barrier();  // no rank tears its groups down while a peer may still be connecting
  });
  return out;
}

std::map<std::string, torch::Tensor> single_rank_parameters(const Config& c) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : GptModel(gpt_options(c))->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

TEST(Reshard, SplitsComeFromTheLayers) {
  const auto splits = tp_splits(*GptModel(gpt_options(layout_config(1, 1, 1))));
  EXPECT_EQ(splits.at("embedding.weight").dim, 0);
  EXPECT_TRUE(splits.at("embedding.weight").vocab_padded);
  EXPECT_EQ(splits.at("position_embedding").dim, -1);
  EXPECT_EQ(splits.at("blocks.1.attn.qkv.weight").dim, 0);
  EXPECT_EQ(splits.at("blocks.1.attn.qkv.bias").dim, 0);
  EXPECT_EQ(splits.at("blocks.1.attn.proj.weight").dim, 1);
  EXPECT_EQ(splits.at("blocks.1.attn.proj.bias").dim, -1);
  EXPECT_EQ(splits.at("blocks.3.mlp.fc1.weight").dim, 0);
  EXPECT_EQ(splits.at("blocks.3.mlp.fc2.weight").dim, 1);
  EXPECT_EQ(splits.at("blocks.0.ln1.weight").dim, -1);
  EXPECT_EQ(splits.at("final_ln.bias").dim, -1);
  EXPECT_FALSE(splits.at("blocks.0.attn.qkv.weight").vocab_padded);
  EXPECT_EQ(splits.size(), GptModel(gpt_options(layout_config(1, 1, 1)))->named_parameters().size());
  EXPECT_EQ(whole_model_name("blocks.1.mlp.fc1.weight", StageRange{2, 2, false, true}), "blocks.3.mlp.fc1.weight");
  EXPECT_EQ(whole_model_name("final_ln.weight", StageRange{2, 2, false, true}), "final_ln.weight");
  EXPECT_EQ(whole_model_layer("blocks.1.mlp.fc1.weight", StageRange{2, 2}), std::optional<int64_t>(3));
  EXPECT_EQ(whole_model_layer("blocks.12.attn.qkv.bias", StageRange{0, 16}), std::optional<int64_t>(12));
  EXPECT_EQ(whole_model_layer("final_ln.weight", StageRange{2, 2}), std::nullopt);
  EXPECT_EQ(whole_model_layer("word_embedding.weight", StageRange{}), std::nullopt);
  // Interleaved: stage 1 of 2, 2 chunks of 2 layers of an 8-layer model holds layers 2, 3 and 6, 7.
  const StageRange interleaved{2, 2, false, false, 2, 4};
  EXPECT_EQ(whole_model_layer("blocks.0.ln1.weight", interleaved), std::optional<int64_t>(2));
  EXPECT_EQ(whole_model_layer("blocks.1.ln1.weight", interleaved), std::optional<int64_t>(3));
  EXPECT_EQ(whole_model_layer("blocks.2.ln1.weight", interleaved), std::optional<int64_t>(6));
  EXPECT_EQ(whole_model_name("blocks.3.mlp.fc2.bias", interleaved), "blocks.7.mlp.fc2.bias");
}

TEST(Reshard, MergedTp2Pp2Dp2CheckpointEqualsTheSingleRankModel) {
  testing::TempDir dir;
  build_layout(layout_config(2, 2, 2), dir / "ckpt");
  const MergedCheckpoint m = merge_checkpoint(dir / "ckpt");
  EXPECT_EQ(m.step, 5);
  EXPECT_EQ(m.layout.tp, 2);
  EXPECT_EQ(m.layout.pp, 2);
  EXPECT_EQ(m.layout.dp, 2);
  EXPECT_EQ(m.max_replica_difference, 0.0);
  EXPECT_EQ(m.max_tied_difference, 0.0);
  EXPECT_EQ(m.max_tp_copy_difference, 0.0);
  const auto ref = single_rank_parameters(layout_config(1, 1, 1));
  ASSERT_EQ(m.parameters.size(), ref.size());
  for (const auto& [name, want] : ref) {
    ASSERT_TRUE(m.parameters.count(name)) << name;
    const torch::Tensor& got = m.parameters.at(name);
    if (name == "embedding.weight") {  // 112 rows merged (TP2 padding), 104 in the single-rank model
      ASSERT_EQ(got.size(0), 112);
      EXPECT_TRUE(torch::equal(got.narrow(0, 0, kVocab), want.narrow(0, 0, kVocab))) << name;
    } else {
      EXPECT_TRUE(torch::equal(got, want)) << name;
    }
  }
}

TEST(Reshard, MergeReportsDivergedReplicasTiedCopiesAndTpCopies) {
  testing::TempDir dir;
  // rank = tp + 2 * (dp + 2 * stage). Rank 3 (tp 1, dp 1, stage 0): its ln1 weight is off by 0.5
  // from replica 0's (rank 1). Rank 4 (tp 0, dp 0, stage 1): the last stage's embedding copy is off
  // by 0.25 from stage 0's (and from its replica, rank 6, by as much: the replica maximum stays 0.5).
  // Rank 1 (tp 1, dp 0, stage 0): its copy of a replicated LayerNorm bias is off by 0.125 from TP
  // rank 0's.
  build_layout(layout_config(2, 2, 2), dir / "ckpt", [](int rank, GptModelImpl& model) {
    torch::NoGradGuard no_grad;
    if (rank == 3) model.blocks[0]->as<Block>()->ln1->weight.add_(0.5);
    if (rank == 1) model.blocks[1]->as<Block>()->ln2->bias.add_(0.125);
    if (rank == 4) model.embedding->weight[0][0].add_(0.25);
  });
  const MergedCheckpoint m = merge_checkpoint(dir / "ckpt");
  EXPECT_NEAR(m.max_replica_difference, 0.5, 1e-6);
  EXPECT_NEAR(m.max_tied_difference, 0.25, 1e-6);
  EXPECT_NEAR(m.max_tp_copy_difference, 0.125, 1e-6);
}

// Every re-sharded stage equals the stage its layout builds from the same seed.
void expect_reshard_matches(const MergedCheckpoint& m, const Config& target) {
  const auto reference = build_layout(target, "");
  const Config other_seed = layout_config(int(target.parallel.tp), int(target.parallel.pp), int(target.parallel.dp), 99);
  std::mutex mu;
  testing::run_layout({int(target.parallel.tp), int(target.parallel.pp), int(target.parallel.dp)},
                      [&](int rank, Distributed& d) {
                        GptModel model(gpt_options(other_seed), d.tp.get(), stage_range(target, d.coord().pp));
                        load_whole_model(*model, m.parameters, d.coord().tp, target.parallel.tp);
                        std::unique_lock<std::mutex> lock(mu);
                        const Shard& want = reference[rank];
                        for (const auto& p : model->named_parameters()) {
                          const torch::Tensor& w = want.params.at(p.key());
                          if (p.key() != "embedding.weight") {
                            EXPECT_TRUE(torch::equal(p.value(), w)) << p.key() << " on rank " << rank;
                            continue;
                          }
                          const int64_t per = w.size(0), first = d.coord().tp * per;
                          const int64_t real = std::clamp<int64_t>(kVocab - first, 0, per);  // rows < V here
                          EXPECT_TRUE(torch::equal(p.value().narrow(0, 0, real), w.narrow(0, 0, real))) << rank;
                          EXPECT_EQ(p.value().narrow(0, real, per - real).abs().sum().item<double>(), 0.0)
                              << "padding rows on rank " << rank;
                        }
                        lock.unlock();
                        d.world->barrier();  // as in build_layout
                      });
}

TEST(Reshard, Tp2Pp2CheckpointReshardsIntoOtherLayouts) {
  testing::TempDir dir;
  build_layout(layout_config(2, 2, 1), dir / "ckpt");
  const MergedCheckpoint m = merge_checkpoint(dir / "ckpt");
  for (const auto& [tp, pp, dp] : std::vector<std::array<int, 3>>{{1, 1, 1}, {2, 2, 1}, {4, 1, 1}, {1, 4, 1}, {2, 1, 2}}) {
    SCOPED_TRACE(fmt::format("tp={} pp={} dp={}", tp, pp, dp));
    expect_reshard_matches(m, layout_config(tp, pp, dp));
  }
}

// Interleaved 1F1B holds the same model in other pieces (stage k: layers k and k + 2 of 4 at pp 2,
// v 2): its checkpoint merges into the single-rank model and re-shards into non-interleaved
// layouts, and a non-interleaved one into the interleaved layout.
Config interleaved(Config c) {
  c.parallel.schedule = "interleaved_1f1b";
  c.parallel.virtual_stages = 2;
  c.train.global_batch_size = 2 * c.parallel.pp * c.parallel.dp;  // m = pp
  return c;
}

TEST(Reshard, InterleavedCheckpointsReshardToAndFromOneChunkPerStage) {
  testing::TempDir dir;
  build_layout(interleaved(layout_config(2, 2, 1)), dir / "interleaved");
  const MergedCheckpoint m = merge_checkpoint(dir / "interleaved");
  EXPECT_EQ(m.max_tied_difference, 0.0);
  const auto ref = single_rank_parameters(layout_config(1, 1, 1));
  ASSERT_EQ(m.parameters.size(), ref.size());
  for (const auto& [name, want] : ref) {
    ASSERT_TRUE(m.parameters.count(name)) << name;
    if (name != "embedding.weight") {
      EXPECT_TRUE(torch::equal(m.parameters.at(name), want)) << name;
    }
  }
  for (const auto& [tp, pp] : std::vector<std::array<int, 2>>{{1, 1}, {2, 2}, {1, 4}}) {
    SCOPED_TRACE(fmt::format("into tp={} pp={}, one chunk per stage", tp, pp));
    expect_reshard_matches(m, layout_config(tp, pp, 1));
  }
  build_layout(layout_config(1, 4, 1), dir / "plain");
  SCOPED_TRACE("a pp=4 checkpoint into tp=1 pp=2 v=2");
  expect_reshard_matches(merge_checkpoint(dir / "plain"), interleaved(layout_config(1, 2, 1)));
}

TEST(Reshard, BadCheckpointsAreNamed) {
  testing::TempDir dir;
  EXPECT_THAT([&] { merge_checkpoint(dir / "nothing"); },
              ::testing::ThrowsMessage<std::runtime_error>(::testing::HasSubstr("no checkpoint at")));
  build_layout(layout_config(2, 1, 1), dir / "ckpt");
  // A rank's file gone: the merge names it.
  const std::string ckpt = *latest_checkpoint(dir / "ckpt");
  std::filesystem::copy_file(ckpt + "/rank_00001.pt", dir / "rank1.pt");
  std::filesystem::remove(ckpt + "/rank_00001.pt");
  EXPECT_THAT([&] { merge_checkpoint(dir / "ckpt"); },
              ::testing::ThrowsMessage<std::runtime_error>(::testing::HasSubstr("rank_00001.pt does not exist")));
  std::filesystem::copy_file(dir / "rank1.pt", ckpt + "/rank_00001.pt");
  // A model of other sizes cannot take the merged parameters.
  const MergedCheckpoint m = merge_checkpoint(dir / "ckpt");
  Config wider = layout_config(1, 1, 1);
  wider.model.hidden_size = 64;
  GptModel model(gpt_options(wider));
  EXPECT_THAT([&] { load_whole_model(*model, m.parameters, 0, 1); },
              ::testing::ThrowsMessage<std::runtime_error>(::testing::HasSubstr("a model of other sizes")));
  // Files whose stored config describes another model than the one they hold.
  Config lying = layout_config(1, 1, 1);
  lying.model.hidden_size = 64;
  testing::TempDir dir2;
  GptModel small(gpt_options(layout_config(1, 1, 1)));
  auto opt = make_adamw(*small, lying.train);
  save_checkpoint(dir2 / "ckpt", TrainState{1, 2}, *small, *opt, {1, 1, 1, 0}, to_yaml(lying), 0);
  EXPECT_THAT([&] { merge_checkpoint(dir2 / "ckpt"); },
              ::testing::ThrowsMessage<std::runtime_error>(::testing::HasSubstr("model of its stored config has")));
}

}  // namespace
}  // namespace optcc

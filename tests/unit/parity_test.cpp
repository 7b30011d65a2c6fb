// Parity: TP x PP x DP training vs. a single-rank run of the same model, seed and data. The loss
// of every step and the final weights (each rank's shard vs. the matching slice) agree within
// fp32 tolerance; the tied embedding copies of the first and last stage stay bit-identical.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <regex>

#include "harness/distributed.h"
#include "harness/trainer.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

struct Dims {
  int tp, pp, dp;
};

constexpr double kLossTol = 1e-6;    // relative, per step (measured <= 6e-8)
constexpr double kWeightTol = 2e-5;  // absolute, after 5 AdamW steps at lr 1e-3 (measured <= 1.2e-6)

Config parity_config(const testing::TempDir& dir, Dims d) {
  Config c;
  c.data.prefix = dir / "corpus";
  c.data.dir = dir / "data";
  c.data.split = "100,0,0";  // no validation: parity is about training
  c.log.dir = dir / "results";
  c.log.run_name = fmt::format("tp{}pp{}dp{}", d.tp, d.pp, d.dp);
  c.model.num_layers = 4;
  c.model.hidden_size = 32;
  c.model.num_heads = 4;
  c.model.seq_len = 16;
  c.model.vocab_divisor = 32;  // 64 tokens pad to 64 for every tp here: same embedding everywhere
  c.model.hidden_dropout = 0.0;
  c.model.attention_dropout = 0.0;
  c.parallel.tp = d.tp;
  c.parallel.pp = d.pp;
  c.parallel.dp = d.dp;
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 8;
  c.train.train_steps = 5;
  c.train.warmup_steps = 1;
  c.train.lr = 1e-3;
  c.train.threads = 1;
  return c;
}

// Name of this rank's parameter in the single-rank model: blocks.i -> blocks.(first_layer + i).
std::string reference_name(const std::string& name, int64_t first_layer) {
  std::smatch m;
  static const std::regex block(R"(^blocks\.(\d+)\.(.*)$)");
  if (std::regex_match(name, m, block)) return fmt::format("blocks.{}.{}", std::stoll(m[1]) + first_layer, m[2].str());
  return name;
}

torch::Tensor matching_slice(const torch::Tensor& full, const torch::Tensor& shard, int tp_rank) {
  if (full.sizes().equals(shard.sizes())) return full;
  const int64_t dim = full.size(0) != shard.size(0) ? 0 : 1;
  return full.narrow(dim, tp_rank * shard.size(dim), shard.size(dim));
}

class Parity : public ::testing::TestWithParam<Dims> {};

TEST_P(Parity, LossesAndFinalWeightsMatchSingleRank) {
  const Dims dims = GetParam();
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 300);
  TrainOptions opt;
  opt.quiet = true;
  opt.keep_parameters = true;
  const auto ref = run_training(parity_config(dir, {1, 1, 1}), opt);  // also builds the index cache

  const int world = dims.tp * dims.pp * dims.dp;
  const Config cfg = parity_config(dir, dims);
  std::vector<TrainSummary> out(world);
  testing::run_ranks(world, [&](const testing::RankContext& ctx) {
    LaunchEnv env;
    env.rank = ctx.rank, env.world_size = world, env.local_rank = ctx.rank, env.local_world_size = world;
    env.source = "threads";
    auto dist = init_distributed({dims.tp, dims.pp, dims.dp}, world, env, ctx.timeout, ctx.store);
    out[ctx.rank] = run_training(cfg, opt, *dist);
  });

  double max_loss_rel = 0, max_weight = 0;
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(out[r].train_losses.size(), 5u);
    for (int s = 0; s < 5; ++s) {
      max_loss_rel = std::max(max_loss_rel, std::abs(out[r].train_losses[s] / ref.train_losses[s] - 1));
    }
    const int tp_rank = r % dims.tp, stage = r / (dims.tp * dims.dp);
    const int64_t first_layer = stage * (4 / dims.pp);
    for (const auto& [name, shard] : out[r].parameters) {
      const auto it = ref.parameters.find(reference_name(name, first_layer));
      ASSERT_NE(it, ref.parameters.end()) << name;
      auto expect = matching_slice(it->second, shard, tp_rank);
      max_weight = std::max(max_weight, (shard - expect).abs().max().item<double>());
    }
  }
  // Tied copies: stage 0's and the last stage's word embedding of the same (tp, dp) are identical.
  if (dims.pp > 1) {
    const int last = (dims.pp - 1) * dims.tp * dims.dp;
    for (int i = 0; i < dims.tp * dims.dp; ++i) {
      EXPECT_TRUE(torch::equal(out[i].parameters.at("embedding.weight"), out[last + i].parameters.at("embedding.weight")))
          << "tied embedding copies diverged on rank " << i;
    }
  }
  RecordProperty("max_loss_rel_diff", std::to_string(max_loss_rel));
  RecordProperty("max_weight_abs_diff", std::to_string(max_weight));
  std::printf("layout tp=%d pp=%d dp=%d: max relative loss diff %.3g, max weight diff %.3g\n", dims.tp, dims.pp,
              dims.dp, max_loss_rel, max_weight);
  EXPECT_LT(max_loss_rel, kLossTol);
  EXPECT_LT(max_weight, kWeightTol);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Parity,
                         ::testing::Values(Dims{2, 1, 1}, Dims{1, 2, 1}, Dims{1, 1, 2}, Dims{2, 2, 1}, Dims{1, 4, 1},
                                           Dims{2, 2, 2}),
                         [](const auto& info) {
                           return fmt::format("tp{}pp{}dp{}", info.param.tp, info.param.pp, info.param.dp);
                         });

}  // namespace
}  // namespace optcc

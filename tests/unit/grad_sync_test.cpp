// GradientSync (harness/train/grad_sync.h): the embedding synchronisation (baseline pair, FE) and
// selective stage compression on real GptModel stages over Gloo (ranks as threads).
//   - BR-09: embedding gradients overwritten with g(pp0,dp0)=1, g(pp0,dp1)=2, g(pp1,dp0)=3,
//     g(pp1,dp1)=4 end as (1+2)/2 + (3+4)/2 = 5.0 on every rank (0 ULP), baseline and FE alike;
//   - FE with DP PowerSGD keeps the embedding gradient (docs/design.md §5.4: the reference zeroed it);
//   - SC: the stages that compress follow docs/design.md §6.5's table.
#include <gtest/gtest.h>

#include "harness/train/grad_sync.h"
#include "tests/support/gloo_ranks.h"

namespace optcc {
namespace {

Config tiny(int pp, int dp, int tp = 1) {
  Config c;
  c.model.num_layers = 2;
  c.model.hidden_size = 16;
  c.model.num_heads = 2;
  c.model.seq_len = 8;
  c.model.vocab_size = 64;
  c.model.vocab_divisor = 32;
  c.parallel.pp = pp;
  c.parallel.dp = dp;
  c.parallel.tp = tp;
  return c;
}

GptModel stage_model(const Config& c, Distributed& d) {
  const int stage = d.coord().pp, stages = static_cast<int>(c.parallel.pp);
  StageRange r;
  r.first_layer = stage * c.model.num_layers / stages;
  r.num_layers = c.model.num_layers / stages;
  r.is_first = stage == 0;
  r.is_last = stage == stages - 1;
  GptOptions o;
  o.num_layers = c.model.num_layers;
  o.hidden_size = c.model.hidden_size;
  o.num_heads = c.model.num_heads;
  o.seq_len = c.model.seq_len;
  o.max_positions = c.model.seq_len;
  o.vocab_size = c.model.vocab_size;
  o.padded_vocab_size = c.padded_vocab_size();
  return GptModel(o, d.tp.get(), r);
}

// Every gradient = 1 + dp rank (so the DP mean is 1.5), the word embedding's = BR-09's constant.
void fill_grads(GptModel& model, const RankCoord& c) {
  torch::NoGradGuard no_grad;
  auto w = model->word_embedding();
  for (auto& p : model->parameters()) {
    p.mutable_grad() = torch::full_like(p, 1.0 + c.dp);
  }
  if (w.defined()) w.mutable_grad() = torch::full_like(w, 1.0 + c.dp + 2.0 * c.pp);
}

class EmbeddingSync : public ::testing::TestWithParam<bool> {};  // fused_embedding

TEST_P(EmbeddingSync, Br09FiveEverywhereToTheUlp) {
  const bool fused = GetParam();
  Config cfg = tiny(2, 2);
  cfg.compression.fused_embedding = fused;
  testing::run_layout({1, 2, 2}, [&](int, Distributed& d) {
    GptModel model = stage_model(cfg, d);
    GradientSync sync(cfg, model, d.dp.get(), d.embedding.get(), d.fused_embedding.get(), d.coord().pp);
    fill_grads(model, d.coord());
    d.meter.reset();
    ASSERT_TRUE(sync.reduce(model->parameters(), 0));
    auto w = model->word_embedding();
    for (auto& item : model->named_parameters()) {
      const auto& g = item.value().grad();
      const double expect = item.value().is_same(w) ? 5.0 : 1.5;
      EXPECT_TRUE(torch::equal(g, torch::full_like(g, expect))) << item.key();
    }
    // FE: one collective for the embedding, over 2d = 4 ranks; baseline: the pair after DP.
    const int64_t e = w.numel() * 4;
    EXPECT_EQ(d.meter.at(Traffic::kEmbedding, Link::kIntraNode).bytes, fused ? 2 * 3 * e / 4 : e);
    int64_t theta = 0;
    for (const auto& p : model->parameters()) theta += p.numel() * 4;
    EXPECT_EQ(d.meter.at(Traffic::kDataParallel, Link::kIntraNode).bytes, fused ? theta - e : theta);
  });
}

INSTANTIATE_TEST_SUITE_P(BaselineAndFe, EmbeddingSync, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "fused" : "pair"; });

TEST(EmbeddingSync, FeWithDpPowerSgdKeepsTheEmbeddingGradient) {
  Config cfg = tiny(2, 2);
  cfg.compression.fused_embedding = true;
  cfg.compression.dp.name = "powersgd";
  cfg.compression.dp.options = YAML::Load("{rank: 2, warmup_steps: 0}");
  testing::run_layout({1, 2, 2}, [&](int, Distributed& d) {
    GptModel model = stage_model(cfg, d);
    GradientSync sync(cfg, model, d.dp.get(), d.embedding.get(), d.fused_embedding.get(), d.coord().pp);
    ASSERT_TRUE(sync.compresses_dp());
    fill_grads(model, d.coord());
    ASSERT_TRUE(sync.reduce(model->parameters(), 0));
    const torch::Tensor g = model->word_embedding().grad();  // a handle, not a reference into a temporary
    EXPECT_TRUE(torch::equal(g, torch::full_like(g, 5.0)));  // never zeroed by the DP reducer
    for (const auto& rec : sync.dp_reducer().records()) EXPECT_NE(rec.name, "embedding.weight");
  });
}

TEST(EmbeddingSync, CompressedEmbeddingReducerGoesUnderTheEmbeddingClass) {
  Config cfg = tiny(2, 2);
  cfg.compression.embedding.name = "fp16";
  testing::run_layout({1, 2, 2}, [&](int, Distributed& d) {
    GptModel model = stage_model(cfg, d);
    GradientSync sync(cfg, model, d.dp.get(), d.embedding.get(), d.fused_embedding.get(), d.coord().pp);
    fill_grads(model, d.coord());
    d.meter.reset();
    ASSERT_TRUE(sync.reduce(model->parameters(), 0));
    const torch::Tensor g = model->word_embedding().grad();  // a handle, not a reference into a temporary
    EXPECT_TRUE(torch::equal(g, torch::full_like(g, 5.0)));  // 1.5 and 3.5 are exact in fp16
    EXPECT_EQ(d.meter.at(Traffic::kEmbedding, Link::kIntraNode).bytes, g.numel() * 2);  // fp16 pair
  });
}

// docs/design.md §6.5: stages 0..min(way, p)-1 compress.
TEST(SelectiveStages, CompressedStagesFollowTheSpecTable) {
  struct Row {
    int pp;
    std::string way;
    std::vector<bool> compressed;
  };
  for (const Row& row : {Row{4, "3", {true, true, true, false}}, Row{4, "2", {true, true, false, false}},
                         Row{2, "3", {true, true}}, Row{4, "all", {true, true, true, true}}}) {
    Config cfg = tiny(row.pp, 1);
    cfg.model.num_layers = 4;
    cfg.compression.dp.name = "powersgd";
    std::string why;
    ASSERT_TRUE(parse_dp_stages(row.way, cfg.compression.dp_stages, why)) << row.way << ": " << why;
    EXPECT_EQ(sc_way(cfg), std::min<int64_t>(row.pp, row.way == "all" ? row.pp : std::stoi(row.way)));
    std::vector<bool> got(row.pp);
    testing::run_layout({1, row.pp, 1}, [&](int, Distributed& d) {
      GptModel model = stage_model(cfg, d);
      GradientSync sync(cfg, model, d.dp.get(), d.embedding.get(), d.fused_embedding.get(), d.coord().pp);
      got[d.coord().pp] = sync.compresses_dp();
      EXPECT_EQ(sync.dp_reducer().name().rfind(sync.compresses_dp() ? "powersgd" : "none", 0), 0u);
    });
    EXPECT_EQ(got, row.compressed) << "pp " << row.pp << " way " << row.way;
  }
  for (std::string v : {"0", "-1", "three", "2x"}) {  // refused when the config is loaded
    DpStages s;
    std::string why;
    EXPECT_FALSE(parse_dp_stages(v, s, why)) << v;
    EXPECT_THROW(load_config("", {"compression.dp_stages=" + v}), ConfigError) << v;
  }
}

}  // namespace
}  // namespace optcc

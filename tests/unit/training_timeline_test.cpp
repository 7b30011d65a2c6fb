// Timelines, link emulation and skipping in real training runs (ranks as threads, TP2 x PP2 on
// two "nodes" of two ranks): /timeline only for the selected step with sane events, /breakdown
// adding up, emulated seconds in /traffic, the Chrome trace of the file, and skipped classes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "harness/records/results_reader.h"
#include "harness/tools/trace.h"
#include "harness/train/trainer.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

Config timeline_config(const testing::TempDir& dir, const std::string& name) {
  Config c;
  c.data.prefix = dir / "corpus";
  c.data.dir = dir / "data";
  c.data.split = "100,0,0";
  c.train.eval_interval = 0;  // no validation split
  c.log.dir = dir / "results";
  c.log.run_name = name;
  c.model.num_layers = 2;
  c.model.hidden_size = 32;
  c.model.num_heads = 4;
  c.model.seq_len = 16;
  c.model.vocab_divisor = 32;
  c.parallel.tp = 2;
  c.parallel.pp = 2;
  c.parallel.ranks_per_node = 2;  // TP inside a node, PP across
  c.train.micro_batch_size = 1;
  c.train.global_batch_size = 4;  // m = 4
  c.train.train_steps = 3;
  c.train.threads = 1;
  c.log.timeline_steps = {2};
  return c;
}

// Like testing::run_layout, with the config's ranks_per_node (run_layout puts every rank on one node).
std::vector<TrainSummary> train_threads(const Config& cfg) {
  const ParallelDims dims{static_cast<int>(cfg.parallel.tp), static_cast<int>(cfg.parallel.pp),
                          static_cast<int>(cfg.parallel.dp)};
  std::vector<TrainSummary> out(dims.world());
  testing::run_ranks(dims.world(), [&](const testing::RankContext& ctx) {
    LaunchEnv env;
    env.rank = ctx.rank, env.world_size = ctx.world, env.local_rank = ctx.rank, env.local_world_size = ctx.world;
    auto dist = init_distributed(dims, static_cast<int>(cfg.parallel.ranks_per_node), env, ctx.timeout, ctx.store);
    TrainOptions opt;
    opt.quiet = true;
    out[ctx.rank] = run_training(cfg, opt, *dist);
  });
  return out;
}

TEST(TrainingTimeline, SelectedStepOnlyEventsInsideTheStepAndBreakdownAddsUp) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  Config cfg = timeline_config(dir, "timeline");
  cfg.network.emulate = true;
  cfg.network.intra_node_gbps = 10.0;
  cfg.network.inter_node_gbps = 0.05;  // one 2 KB slice per message: ~40 µs each
  cfg.network.inter_node_latency_us = 50.0;
  const std::string path = train_threads(cfg)[0].results_path;

  const auto events = read_timeline(path);
  ASSERT_FALSE(events.empty());
  std::map<int, const TimelineEvent*> step_of_rank;
  for (const auto& r : events) {
    EXPECT_EQ(r.event.step, 2);  // only the selected step
    EXPECT_LE(r.event.start_us, r.event.end_us);
    if (r.event.kind == EventKind::kStep) step_of_rank[r.rank] = &r.event;
  }
  ASSERT_EQ(step_of_rank.size(), 4u);
  std::map<EventKind, int> kinds;
  for (const auto& r : events) {
    kinds[r.event.kind] += 1;
    const TimelineEvent& step = *step_of_rank.at(r.rank);
    EXPECT_GE(r.event.start_us, step.start_us) << kind_name(r.event.kind);  // nothing before the step began
    if (r.event.kind == EventKind::kForward || r.event.kind == EventKind::kBackward || r.event.kind == EventKind::kSend ||
        r.event.kind == EventKind::kRecv || r.event.kind == EventKind::kOptimizer) {
      EXPECT_LE(r.event.end_us, step.end_us) << kind_name(r.event.kind);
    }
  }
  EXPECT_EQ(kinds[EventKind::kForward], 4 * 4);  // m = 4 micro-batches on each of 4 ranks
  EXPECT_EQ(kinds[EventKind::kBackward], 4 * 4);
  EXPECT_GT(kinds[EventKind::kSend], 0);
  EXPECT_GT(kinds[EventKind::kEmulatedWait], 0);
  EXPECT_EQ(kinds[EventKind::kOptimizer], 4);

  const TableData b = read_results_table(path, "breakdown");
  ASSERT_EQ(b.rows, 1u);
  EXPECT_EQ(b.int_column("step")[0], 2);
  double sum = 0;
  for (int c = 0; c < kNumCategories; ++c) sum += b.double_column(std::string(category_name(static_cast<Category>(c))) + "_us")[0];
  EXPECT_NEAR(sum, b.double_column("step_us")[0], 1e-6 * b.double_column("step_us")[0]);
  EXPECT_GT(b.double_column("compute_us")[0], 0.0);
  EXPECT_GT(b.double_column("pp_fwd_us")[0] + b.double_column("pp_bwd_us")[0], 0.0);

  const TableData t = read_results_table(path, "traffic");
  double inter_emulated = 0, control_emulated = 0;
  for (size_t i = 0; i < t.rows; ++i) {
    if (t.int_column("link")[i] == 1) inter_emulated += t.double_column("emulated_seconds")[i];
    if (t.int_column("class")[i] == 5) control_emulated += t.double_column("emulated_seconds")[i];
  }
  EXPECT_GT(inter_emulated, 0.0);
  EXPECT_EQ(control_emulated, 0.0);  // bookkeeping is never delayed
  EXPECT_THAT(read_root_attribute(path, "network"), ::testing::HasSubstr("emulate=true"));
  EXPECT_EQ(read_root_attribute(path, "trainable_result"), "true");

  TraceOptions o{path, int64_t{2}, dir / "trace.json", true};
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(run_trace_command(o), 0);
  EXPECT_THAT(::testing::internal::GetCapturedStdout(), ::testing::HasSubstr("critical-path rank"));
  std::ifstream in(dir / "trace.json");
  const auto json = nlohmann::json::parse(in);
  size_t complete = 0;
  for (const auto& e : json["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++complete;
    for (const char* key : {"name", "ph", "ts", "dur", "pid", "tid"}) ASSERT_TRUE(e.contains(key)) << key;
  }
  EXPECT_EQ(complete, events.size());
  EXPECT_THROW(run_trace_command(TraceOptions{path, int64_t{3}, dir / "x.json", false}), std::runtime_error);
}

TEST(TrainingTimeline, NoTimelineStepsNoTimeline) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  Config cfg = timeline_config(dir, "plain");
  cfg.log.timeline_steps = {};
  const std::string path = train_threads(cfg)[0].results_path;
  EXPECT_FALSE(results_has_group(path, "timeline"));
  EXPECT_FALSE(results_has_group(path, "breakdown"));
  EXPECT_EQ(read_root_attribute(path, "network_emulation"), "off");
  const TableData t = read_results_table(path, "traffic");
  for (double v : t.double_column("emulated_seconds")) EXPECT_EQ(v, 0.0);
}

TEST(TrainingTimeline, SkippedClassesSendNothingAndMarkTheResult) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  Config cfg = timeline_config(dir, "skip");
  cfg.network.skip = {"pp_bwd", "embedding"};
  const auto out = train_threads(cfg);
  const std::string path = out[0].results_path;
  EXPECT_EQ(read_root_attribute(path, "trainable_result"), "false");
  const TableData t = read_results_table(path, "traffic");
  std::map<int64_t, int64_t> bytes, calls;  // by class
  for (size_t i = 0; i < t.rows; ++i) {
    bytes[t.int_column("class")[i]] += t.int_column("bytes")[i];
    calls[t.int_column("class")[i]] += t.int_column("calls")[i];
  }
  EXPECT_EQ(bytes[2], 0);  // pp_bwd
  EXPECT_GT(calls[2], 0);  // its hooks still ran
  EXPECT_EQ(bytes[4], 0);  // embedding
  EXPECT_GT(bytes[1], 0);  // pp_fwd still travels
  for (double loss : out[0].train_losses) EXPECT_TRUE(std::isfinite(loss));
}

}  // namespace
}  // namespace optcc

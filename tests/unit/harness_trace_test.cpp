// The timeline recorder (timeline.h), the Fig. 10 breakdown and the Chrome trace export
// (trace.h) on hand-made events with known answers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "harness/parallel/nic_table.h"
#include "harness/tools/trace.h"

namespace optcc {
namespace {

RankedEvent ev(int rank, EventKind kind, Stream stream, double start, double end, int mb = -1, int64_t step = 5) {
  RankedEvent r;
  r.rank = rank;
  r.event = {step, kind, stream, mb, start, end};
  return r;
}

double us_of(const StepBreakdown& b, Category c) { return b.us[static_cast<int>(c)]; }

TEST(Breakdown, CriticalRankAndPriorityCover) {
  const std::vector<RankedEvent> events = {
      ev(0, EventKind::kStep, Stream::kStep, 0, 100),
      ev(1, EventKind::kStep, Stream::kStep, 5, 130),  // ends last: the critical rank
      ev(0, EventKind::kForward, Stream::kCompute, 0, 90),
      ev(1, EventKind::kForward, Stream::kCompute, 10, 40, 0),
      ev(1, EventKind::kCollective, Stream::kTensorParallel, 20, 25, 0),  // TP inside forward
      ev(1, EventKind::kRecv, Stream::kPipelineBackward, 50, 70, 0),
      ev(1, EventKind::kSend, Stream::kPipelineForward, 45, 60, 1),      // overlaps the recv
      ev(1, EventKind::kEmulatedWait, Stream::kPipelineBackward, 60, 70, 0),  // inside the recv: ignored
      ev(1, EventKind::kCompress, Stream::kCompression, 70, 75, 0),
      ev(1, EventKind::kLepUpdate, Stream::kCompression, 72, 74, 0),
      ev(1, EventKind::kCompress, Stream::kDataParallel, 80, 110),       // compressing DP reducer
      ev(1, EventKind::kCollective, Stream::kDataParallel, 90, 100),     // its all-reduce
      ev(1, EventKind::kCollective, Stream::kEmbedding, 110, 115),
      ev(1, EventKind::kOptimizer, Stream::kCompute, 115, 125),
      ev(1, EventKind::kCollective, Stream::kControl, 125, 126),
      ev(1, EventKind::kForward, Stream::kCompute, 0, 500, 0, /*step=*/6),  // another step: not here
  };
  const auto rows = compute_breakdown(events);
  ASSERT_EQ(rows.size(), 1u);
  const StepBreakdown& b = rows[0];
  EXPECT_EQ(b.step, 5);
  EXPECT_EQ(b.rank, 1);
  EXPECT_DOUBLE_EQ(b.step_us, 125.0);
  EXPECT_DOUBLE_EQ(us_of(b, Category::kCompute), 25.0);           // [10,40) minus TP [20,25)
  EXPECT_DOUBLE_EQ(us_of(b, Category::kTensorParallel), 5.0);
  EXPECT_DOUBLE_EQ(us_of(b, Category::kPipelineForward), 5.0);    // [45,50) before the recv began
  EXPECT_DOUBLE_EQ(us_of(b, Category::kPipelineBackward), 20.0);  // [50,70), its emulated wait included
  EXPECT_DOUBLE_EQ(us_of(b, Category::kCompression), 5.0 + 20.0); // codec [70,75) + reducer's own work
  EXPECT_DOUBLE_EQ(us_of(b, Category::kDataParallel), 10.0);
  EXPECT_DOUBLE_EQ(us_of(b, Category::kEmbedding), 5.0);
  EXPECT_DOUBLE_EQ(us_of(b, Category::kOther), 11.0);             // optimizer 10 + control 1
  EXPECT_DOUBLE_EQ(us_of(b, Category::kIdle), 5.0 + 5.0 + 5.0 + 4.0);  // [5,10) [40,45) [75,80) [126,130)
  double sum = 0;
  for (double v : b.us) sum += v;
  EXPECT_DOUBLE_EQ(sum, b.step_us);
  EXPECT_THAT(breakdown_line(b), ::testing::HasSubstr("critical rank 1"));
  EXPECT_THAT(breakdown_text(rows), ::testing::HasSubstr("pp_bwd"));
}

TEST(Breakdown, UncompressedDpReductionCountsAsDp) {
  const auto rows = compute_breakdown({ev(0, EventKind::kStep, Stream::kStep, 0, 10),
                                       ev(0, EventKind::kDpReduce, Stream::kDataParallel, 2, 8),
                                       ev(0, EventKind::kCollective, Stream::kDataParallel, 3, 7)});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_DOUBLE_EQ(us_of(rows[0], Category::kDataParallel), 6.0);
  EXPECT_DOUBLE_EQ(us_of(rows[0], Category::kIdle), 4.0);
}

TEST(ChromeTrace, EveryEventHasTheFieldsAndOverlapsGetLanes) {
  const std::vector<RankedEvent> events = {
      ev(0, EventKind::kStep, Stream::kStep, 0, 100),
      ev(0, EventKind::kSend, Stream::kPipelineBackward, 10, 30, 3),  // two parts of one message:
      ev(0, EventKind::kSend, Stream::kPipelineBackward, 12, 40, 3),  // overlapping, not nested
      ev(0, EventKind::kEmulatedWait, Stream::kPipelineBackward, 20, 30, 3),  // nested in the first
      ev(2, EventKind::kForward, Stream::kCompute, 5, 50, 1),
      ev(2, EventKind::kForward, Stream::kCompute, 1, 2, 0, /*step=*/6),
  };
  const auto all = nlohmann::json::parse(chrome_trace_json(events));
  const auto step5 = nlohmann::json::parse(chrome_trace_json(events, 5));
  int complete = 0;
  std::set<std::pair<int, int>> named_threads;
  std::map<std::pair<int, int>, int> per_tid;
  for (const auto& e : step5["traceEvents"]) {
    if (e["ph"] == "M") {
      if (e["name"] == "thread_name") named_threads.insert({e["pid"].get<int>(), e["tid"].get<int>()});
      continue;
    }
    ++complete;
    for (const char* key : {"name", "ph", "ts", "dur", "pid", "tid"}) EXPECT_TRUE(e.contains(key)) << key;
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    per_tid[{e["pid"].get<int>(), e["tid"].get<int>()}] += 1;
  }
  EXPECT_EQ(complete, 5);  // step 6's event left out
  EXPECT_EQ(all["traceEvents"].size(), step5["traceEvents"].size() + 1);
  const int pp_bwd = static_cast<int>(Stream::kPipelineBackward);
  EXPECT_EQ((per_tid[{0, 100 * pp_bwd}]), 2);      // first send + its nested wait
  EXPECT_EQ((per_tid[{0, 100 * pp_bwd + 1}]), 1);  // the overlapping second send: its own lane
  for (const auto& [track, n] : per_tid) EXPECT_TRUE(named_threads.count(track)) << track.second;
  bool rank2_named = false;
  for (const auto& e : step5["traceEvents"]) {
    rank2_named |= e["name"] == "process_name" && e["pid"] == 2 && e["args"]["name"] == "rank 2";
  }
  EXPECT_TRUE(rank2_named);
}

TEST(Timeline, RecordsOnlyInsideASelectedStepOnThisThread) {
  Timeline t({2});
  t.set_origin(monotonic_ns());
  { TimelineScope not_recording(EventKind::kForward, Stream::kCompute, 0); }
  {
    Timeline::StepGuard guard(&t, 1);
    EXPECT_FALSE(guard.recording());
    EXPECT_EQ(Timeline::active(), nullptr);
    TimelineScope nothing(EventKind::kForward, Stream::kCompute, 0);
  }
  {
    Timeline::StepGuard guard(&t, 2);
    EXPECT_TRUE(guard.recording());
    EXPECT_EQ(Timeline::active(), &t);
    MicrobatchContext mb(4);
    TimelineScope outer(EventKind::kBackward, Stream::kCompute);  // takes micro-batch 4
    { TimelineScope inner(EventKind::kCompress, Stream::kCompression, 7); }
  }
  EXPECT_EQ(Timeline::active(), nullptr);
  EXPECT_EQ(Timeline::current_microbatch(), -1);
  const auto events = t.take_events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, EventKind::kCompress);
  EXPECT_EQ(events[0].microbatch, 7);
  EXPECT_EQ(events[1].kind, EventKind::kBackward);
  EXPECT_EQ(events[1].microbatch, 4);
  for (const auto& e : events) {
    EXPECT_EQ(e.step, 2);
    EXPECT_LE(e.start_us, e.end_us);
    EXPECT_GE(e.start_us, 0.0);
  }
  EXPECT_LE(events[1].start_us, events[0].start_us);  // outer encloses inner
  EXPECT_GE(events[1].end_us, events[0].end_us);
  EXPECT_TRUE(t.take_events().empty());
}

}  // namespace
}  // namespace optcc

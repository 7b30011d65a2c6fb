// The timeline in the results file (see timeline_records.h).
#include "harness/train/timeline_records.h"

#include <nlohmann/json.hpp>

#include "harness/train/breakdown.h"

namespace optcc {

std::vector<TableSpec> timeline_tables() {
  std::vector<Column> breakdown{{"step", ColumnType::kInt64, "steps"},
                                {"rank", ColumnType::kInt64, ""},
                                {"step_us", ColumnType::kFloat64, "us"}};
  for (int c = 0; c < kNumCategories; ++c) {
    breakdown.push_back({std::string(category_name(static_cast<Category>(c))) + "_us", ColumnType::kFloat64, "us"});
  }
  return {{"timeline",
           {{"step", ColumnType::kInt64, "steps"},
            {"rank", ColumnType::kInt64, ""},
            {"kind", ColumnType::kInt64, ""},
            {"stream", ColumnType::kInt64, ""},
            {"microbatch", ColumnType::kInt64, ""},
            {"start_us", ColumnType::kFloat64, "us"},
            {"end_us", ColumnType::kFloat64, "us"}}},
          {"breakdown", breakdown}};
}

std::map<std::string, std::string> timeline_attributes() {
  return {{"timeline_kinds", nlohmann::json(kind_names()).dump()},
          {"timeline_streams", nlohmann::json(stream_names()).dump()}};
}

std::vector<RankedEvent> gather_timeline(Distributed& d, const std::vector<TimelineEvent>& events) {
  constexpr int kWidth = 6;  // step, kind, stream, microbatch, start_us, end_us
  const TrafficMeter saved = d.meter;  // the gather is bookkeeping, not the step's traffic
  auto count = torch::tensor({static_cast<int64_t>(events.size())}, torch::kLong);
  d.world->all_reduce(count, Traffic::kControl, /*max=*/true);
  const int64_t rows = std::max<int64_t>(1, count.item<int64_t>());
  auto mine = torch::full({rows, kWidth + 1}, 0.0, torch::kDouble);  // last column: 1 = valid row
  auto a = mine.accessor<double, 2>();
  for (size_t i = 0; i < events.size(); ++i) {
    const TimelineEvent& e = events[i];
    const double v[kWidth + 1] = {static_cast<double>(e.step), static_cast<double>(e.kind), static_cast<double>(e.stream),
                                  static_cast<double>(e.microbatch), e.start_us, e.end_us, 1.0};
    for (int k = 0; k <= kWidth; ++k) a[static_cast<int64_t>(i)][k] = v[k];
  }
  auto all = d.world->all_gather(mine.unsqueeze(0), Traffic::kControl, 0);  // [world, rows, 7]
  d.meter = saved;
  std::vector<RankedEvent> out;
  if (d.rank() != 0) return out;
  auto g = all.accessor<double, 3>();
  for (int64_t r = 0; r < all.size(0); ++r) {
    for (int64_t i = 0; i < rows && g[r][i][kWidth] > 0; ++i) {
      RankedEvent ev;
      ev.rank = static_cast<int>(r);
      ev.event.step = static_cast<int64_t>(g[r][i][0]);
      ev.event.kind = static_cast<EventKind>(static_cast<int>(g[r][i][1]));
      ev.event.stream = static_cast<Stream>(static_cast<int>(g[r][i][2]));
      ev.event.microbatch = static_cast<int32_t>(g[r][i][3]);
      ev.event.start_us = g[r][i][4], ev.event.end_us = g[r][i][5];
      out.push_back(ev);
    }
  }
  return out;
}

std::string record_timeline_step(Distributed& d, MetricsSink* sink, Timeline& timeline) {
  const std::vector<RankedEvent> all = gather_timeline(d, timeline.take_events());
  if (!sink) return "";
  for (const RankedEvent& r : all) {
    const TimelineEvent& e = r.event;
    sink->append("timeline", {e.step, int64_t{r.rank}, int64_t{static_cast<int>(e.kind)},
                              int64_t{static_cast<int>(e.stream)}, int64_t{e.microbatch}, e.start_us, e.end_us});
  }
  const std::vector<StepBreakdown> rows = compute_breakdown(all);
  append_breakdown(*sink, rows);
  return rows.empty() ? "" : breakdown_line(rows.back());
}

}  // namespace optcc

// Chrome trace export and `optcc trace` (see trace.h).
#include "harness/tools/trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "harness/records/results_reader.h"

namespace optcc {
namespace {

// Maps the file's kind/stream indices to ours by name (root attributes timeline_kinds/streams).
std::vector<int> index_map(const std::string& path, const std::string& attribute, const std::vector<std::string>& ours) {
  const std::string text = read_root_attribute(path, attribute);
  std::vector<std::string> theirs = ours;
  if (!text.empty()) theirs = nlohmann::json::parse(text).get<std::vector<std::string>>();
  std::vector<int> map;
  for (const std::string& name : theirs) {
    auto it = std::find(ours.begin(), ours.end(), name);
    if (it == ours.end()) {
      throw std::runtime_error(fmt::format("{}: unknown {} entry '{}'; this optcc is older than the file", path,
                                           attribute, name));
    }
    map.push_back(static_cast<int>(it - ours.begin()));
  }
  return map;
}

// Lanes for one (rank, stream): an event goes to the first lane where it nests in, or follows,
// what is open there (Chrome's complete events on one thread must nest).
std::vector<int> assign_lanes(const std::vector<const RankedEvent*>& events) {
  std::vector<std::vector<double>> open;  // per lane: stack of end times
  std::vector<int> lanes;
  for (const RankedEvent* r : events) {
    size_t lane = 0;
    for (; lane < open.size(); ++lane) {
      auto& stack = open[lane];
      while (!stack.empty() && stack.back() <= r->event.start_us) stack.pop_back();
      if (stack.empty() || stack.back() >= r->event.end_us) break;
    }
    if (lane == open.size()) open.emplace_back();
    open[lane].push_back(r->event.end_us);
    lanes.push_back(static_cast<int>(lane));
  }
  return lanes;
}

nlohmann::json metadata(const char* what, int pid, int tid, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

}  // namespace

std::vector<RankedEvent> read_timeline(const std::string& path) {
  if (!results_has_group(path, "timeline")) {
    throw std::runtime_error(fmt::format("{} has no /timeline. Fix: run with log.timeline_steps set, e.g. "
                                         "--set log.timeline_steps=[5,6]", path));
  }
  const TableData t = read_results_table(path, "timeline");
  const auto kinds = index_map(path, "timeline_kinds", kind_names());
  const auto streams = index_map(path, "timeline_streams", stream_names());
  std::vector<RankedEvent> out(t.rows);
  for (size_t i = 0; i < t.rows; ++i) {
    RankedEvent& r = out[i];
    r.rank = static_cast<int>(t.int_column("rank")[i]);
    r.event.step = t.int_column("step")[i];
    r.event.kind = static_cast<EventKind>(kinds.at(static_cast<size_t>(t.int_column("kind")[i])));
    r.event.stream = static_cast<Stream>(streams.at(static_cast<size_t>(t.int_column("stream")[i])));
    r.event.microbatch = static_cast<int32_t>(t.int_column("microbatch")[i]);
    r.event.start_us = t.double_column("start_us")[i];
    r.event.end_us = t.double_column("end_us")[i];
  }
  return out;
}

std::string chrome_trace_json(const std::vector<RankedEvent>& events, std::optional<int64_t> step) {
  std::map<std::pair<int, int>, std::vector<const RankedEvent*>> by_track;  // (rank, stream)
  for (const RankedEvent& r : events) {
    if (!step || r.event.step == *step) by_track[{r.rank, static_cast<int>(r.event.stream)}].push_back(&r);
  }
  nlohmann::json out = nlohmann::json::array();
  std::map<int, bool> ranks;
  for (auto& [track, list] : by_track) {
    std::stable_sort(list.begin(), list.end(), [](const RankedEvent* a, const RankedEvent* b) {
      return a->event.start_us < b->event.start_us ||
             (a->event.start_us == b->event.start_us && a->event.end_us > b->event.end_us);
    });
    const std::vector<int> lanes = assign_lanes(list);
    const int lanes_used = lanes.empty() ? 0 : *std::max_element(lanes.begin(), lanes.end()) + 1;
    const std::string stream = stream_name(static_cast<Stream>(track.second));
    for (int lane = 0; lane < lanes_used; ++lane) {
      out.push_back(metadata("thread_name", track.first, 100 * track.second + lane,
                             lane == 0 ? stream : fmt::format("{} #{}", stream, lane + 1)));
    }
    ranks[track.first] = true;
    for (size_t i = 0; i < list.size(); ++i) {
      const TimelineEvent& e = list[i]->event;
      std::string name = kind_name(e.kind);
      if (e.microbatch >= 0) name += fmt::format(" mb {}", e.microbatch);
      out.push_back({{"name", name}, {"cat", stream}, {"ph", "X"}, {"ts", e.start_us},
                     {"dur", e.end_us - e.start_us}, {"pid", track.first}, {"tid", 100 * track.second + lanes[i]},
                     {"args", {{"step", e.step}, {"microbatch", e.microbatch}}}});
    }
  }
  for (const auto& [rank, _] : ranks) out.push_back(metadata("process_name", rank, 0, fmt::format("rank {}", rank)));
  return nlohmann::json{{"traceEvents", out}, {"displayTimeUnit", "ms"}}.dump(1) + "\n";
}

}  // namespace optcc

namespace optcc {

int run_trace_command(const TraceOptions& o) {
  if (o.output.empty() && !o.breakdown) {
    throw std::runtime_error("optcc trace: nothing to do. Fix: give -o trace.json (Chrome trace) and/or --breakdown");
  }
  std::vector<RankedEvent> events = read_timeline(o.results);
  std::vector<int64_t> steps;
  for (const RankedEvent& r : events) {
    if (std::find(steps.begin(), steps.end(), r.event.step) == steps.end()) steps.push_back(r.event.step);
  }
  if (o.step && std::find(steps.begin(), steps.end(), *o.step) == steps.end()) {
    throw std::runtime_error(fmt::format("optcc trace: step {} is not in the timeline of {} (recorded steps: {}). Fix: "
                                         "pick one of them, or rerun with log.timeline_steps including it",
                                         *o.step, o.results, fmt::join(steps, ", ")));
  }
  if (o.step) {
    events.erase(std::remove_if(events.begin(), events.end(), [&](const RankedEvent& r) { return r.event.step != *o.step; }),
                 events.end());
  }
  if (!o.output.empty()) {
    std::ofstream out(o.output);
    out << chrome_trace_json(events);
    if (!out) throw std::runtime_error(fmt::format("optcc trace: cannot write {}", o.output));
    const std::string which = o.step ? std::to_string(*o.step) : fmt::format("{}", fmt::join(steps, ", "));
    fmt::print("wrote {} complete events (step {}) of {} to {}; open it in https://ui.perfetto.dev or chrome://tracing\n",
               events.size(), which, o.results, o.output);
  }
  if (o.breakdown) fmt::print("{}", breakdown_text(compute_breakdown(events)));
  return 0;
}

}  // namespace optcc

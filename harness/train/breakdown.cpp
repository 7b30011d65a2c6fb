// The Fig. 10 breakdown (see breakdown.h).
#include "harness/train/breakdown.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <stdexcept>

namespace optcc {
namespace {

constexpr const char* kCategoryNames[kNumCategories] = {"compute", "tp",          "pp_fwd", "pp_bwd", "dp",
                                                        "embedding", "compression", "other",  "idle"};

struct Classified {
  int priority = -1;  // -1: not part of the breakdown (step, emulated_wait)
  Category category = Category::kIdle;
};

Category traffic_category(Stream s) {
  switch (s) {
    case Stream::kTensorParallel: return Category::kTensorParallel;
    case Stream::kPipelineForward: return Category::kPipelineForward;
    case Stream::kPipelineBackward: return Category::kPipelineBackward;
    case Stream::kDataParallel: return Category::kDataParallel;
    case Stream::kEmbedding: return Category::kEmbedding;
    default: return Category::kOther;
  }
}

// Priorities of trace.h, high to low.
Classified classify(const TimelineEvent& e) {
  switch (e.kind) {
    case EventKind::kSend:
    case EventKind::kRecv:
    case EventKind::kCollective: {
      static const std::map<Stream, int> order = {{Stream::kPipelineBackward, 16}, {Stream::kPipelineForward, 15},
                                                  {Stream::kDataParallel, 14},     {Stream::kEmbedding, 13},
                                                  {Stream::kTensorParallel, 12}};
      auto it = order.find(e.stream);
      return {it == order.end() ? 11 : it->second, traffic_category(e.stream)};
    }
    case EventKind::kCompress:
    case EventKind::kDecompress:
    case EventKind::kLepUpdate: return {8, Category::kCompression};
    case EventKind::kDpReduce: return {6, Category::kDataParallel};
    case EventKind::kForward:
    case EventKind::kBackward: return {4, Category::kCompute};
    case EventKind::kOptimizer:
    case EventKind::kEvaluation:
    case EventKind::kCheckpoint: return {3, Category::kOther};
    default: return {};
  }
}

// Splits [s, e] among the events of one rank by priority (trace.h, step 2); the rest is idle.
std::array<double, kNumCategories> sweep(const std::vector<const TimelineEvent*>& events, double s, double e) {
  struct Edge {
    double t;
    int delta;
    Classified c;
  };
  std::vector<Edge> edges;
  for (const TimelineEvent* ev : events) {
    const Classified c = classify(*ev);
    const double a = std::max(s, ev->start_us), b = std::min(e, ev->end_us);
    if (c.priority < 0 || b <= a) continue;
    edges.push_back({a, +1, c});
    edges.push_back({b, -1, c});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& x, const Edge& y) { return x.t < y.t; });
  std::array<double, kNumCategories> us{};
  std::map<int, std::map<Category, int>> open;  // priority -> category -> open count
  double t = s;
  for (const Edge& edge : edges) {
    const Category top = open.empty() ? Category::kIdle : open.rbegin()->second.begin()->first;
    us[static_cast<int>(top)] += edge.t - t;
    t = edge.t;
    auto& count = open[edge.c.priority][edge.c.category];
    count += edge.delta;
    if (count == 0) {
      open[edge.c.priority].erase(edge.c.category);
      if (open[edge.c.priority].empty()) open.erase(edge.c.priority);
    }
  }
  us[static_cast<int>(Category::kIdle)] += e - t;
  return us;
}

StepBreakdown breakdown_of_step(int64_t step, const std::vector<RankedEvent>& events) {
  StepBreakdown b;
  b.step = step;
  const TimelineEvent* critical = nullptr;
  for (const RankedEvent& r : events) {
    if (r.event.step != step || r.event.kind != EventKind::kStep) continue;
    if (!critical || r.event.end_us > critical->end_us) critical = &r.event, b.rank = r.rank;
  }
  std::vector<const TimelineEvent*> mine;
  for (const RankedEvent& r : events) {
    if (r.rank == b.rank && r.event.step == step) mine.push_back(&r.event);
  }
  b.step_us = critical->end_us - critical->start_us;
  b.us = sweep(mine, critical->start_us, critical->end_us);
  return b;
}

}  // namespace

const char* category_name(Category c) { return kCategoryNames[static_cast<int>(c)]; }

std::vector<StepBreakdown> compute_breakdown(const std::vector<RankedEvent>& events) {
  std::vector<int64_t> steps;
  for (const RankedEvent& r : events) {
    if (r.event.kind == EventKind::kStep) steps.push_back(r.event.step);
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  std::vector<StepBreakdown> out;
  for (int64_t step : steps) out.push_back(breakdown_of_step(step, events));
  return out;
}

std::string breakdown_text(const std::vector<StepBreakdown>& rows) {
  std::string out = fmt::format("{:>6} {:>5} {:>10}", "step", "rank", "step ms");
  for (int c = 0; c < kNumCategories; ++c) out += fmt::format(" {:>17}", kCategoryNames[c]);
  out += "\n";
  for (const StepBreakdown& b : rows) {
    out += fmt::format("{:>6} {:>5} {:>10.1f}", b.step, b.rank, b.step_us * 1e-3);
    for (int c = 0; c < kNumCategories; ++c) {
      out += fmt::format(" {:>9.1f} ({:>4.1f}%)", b.us[c] * 1e-3, b.step_us > 0 ? 100.0 * b.us[c] / b.step_us : 0.0);
    }
    out += "\n";
  }
  return out + "(ms on the critical-path rank, whose step ends last; method: harness/train/breakdown.h)\n";
}

std::string breakdown_line(const StepBreakdown& b) {
  std::string out = fmt::format("breakdown step {} (critical rank {}, {:.1f} ms):", b.step, b.rank, b.step_us * 1e-3);
  for (int c = 0; c < kNumCategories; ++c) {
    out += fmt::format(" {} {:.1f}%", kCategoryNames[c], b.step_us > 0 ? 100.0 * b.us[c] / b.step_us : 0.0);
  }
  return out;
}

void append_breakdown(MetricsSink& sink, const std::vector<StepBreakdown>& rows) {
  for (const StepBreakdown& b : rows) {
    std::vector<Cell> row{b.step, int64_t{b.rank}, b.step_us};
    for (double v : b.us) row.emplace_back(v);
    sink.append("breakdown", row);
  }
}

}  // namespace optcc

// The Fig. 10 time breakdown (docs/design.md §8.3) of a step, computed from the per-rank timeline events
// (timeline.h). Used by the trainer for /breakdown and by `optcc trace --breakdown`.
//
// Breakdown method (per step):
//   1. The critical path is the rank whose `step` event ends last; its step event [S, E] is the
//      step's wall time (E - S = step_us).
//   2. Every instant of [S, E] goes to ONE category: the highest-priority event of that rank
//      covering it, in this order (high to low):
//        pp_bwd, pp_fwd, dp, embedding, tp messages/collectives  -> that class
//        control collectives (grad norm, loss)                   -> other
//        compress, decompress, lep_update                       -> compression
//        dp_reduce (the uncompressed DP reduction's own work)    -> dp
//        forward, backward                                       -> compute
//        optimizer, evaluation, checkpoint                       -> other
//      Emulated waits are not separate: they lie inside their operation's event.
//   3. What no event covers is idle (loop overhead, data loading). Waiting in a receive for the
//      peer to post is not covered either (a receive's event starts when the sender posted,
//      communicator.h), so the pipeline bubble shows as idle, not as transfer time.
//   So compute + tp + pp_fwd + pp_bwd + dp + embedding + compression + other + idle = step_us
//   exactly. Communication nested in computation (TP all-reduces inside forward/backward,
//   collectives inside a compressing DP reducer) is counted as communication, the rest of the
//   enclosing span as its own category.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/parallel/timeline.h"
#include "harness/records/metrics.h"

namespace optcc {

enum class Category { kCompute, kTensorParallel, kPipelineForward, kPipelineBackward, kDataParallel, kEmbedding,
                      kCompression, kOther, kIdle };
constexpr int kNumCategories = 9;
/// "compute", "tp", "pp_fwd", "pp_bwd", "dp", "embedding", "compression", "other", "idle".
const char* category_name(Category c);

struct StepBreakdown {
  int64_t step = 0;
  int rank = 0;            // the critical-path rank
  double step_us = 0;      // its step's wall time
  std::array<double, kNumCategories> us{};  // per Category; sums to step_us
};

/// One StepBreakdown per step that has step events, in step order (method above).
std::vector<StepBreakdown> compute_breakdown(const std::vector<RankedEvent>& events);
/// A fixed-width table: one row per step, ms per category and its share of the step.
std::string breakdown_text(const std::vector<StepBreakdown>& rows);
/// One line for the training log: "breakdown step 5 (rank 0, 812.3 ms): compute 55% ...".
std::string breakdown_line(const StepBreakdown& b);
/// Appends rows to the /breakdown table (timeline_records.h) of `sink`.
void append_breakdown(MetricsSink& sink, const std::vector<StepBreakdown>& rows);

}  // namespace optcc

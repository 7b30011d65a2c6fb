// `optcc trace`: the timeline of a results file as Chrome trace-event JSON (Perfetto,
// chrome://tracing), and the Fig. 10 time breakdown (docs/design.md §8.3) computed from it.
//
// Chrome trace: one complete event ("ph": "X") per timeline event with name (kind, plus " mb N"
// for a micro-batch), cat (stream), ts and dur (µs), pid = global rank, tid = stream (a stream
// whose events overlap without nesting, e.g. two parts of one compressed message, gets extra
// lanes: tid = 100 * stream + lane), args {step, microbatch}; plus process_name and thread_name
// metadata events ("ph": "M") so the viewer shows "rank 3" and "pp_bwd".
//
// The breakdown itself: harness/train/breakdown.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/parallel/timeline.h"
#include "harness/train/breakdown.h"

namespace optcc {

/// The events of /timeline in the results file `path` (std::runtime_error naming the file when it
/// has no timeline: run with log.timeline_steps set).
std::vector<RankedEvent> read_timeline(const std::string& path);
/// Chrome trace-event JSON of `events` (only those of `step` when given).
std::string chrome_trace_json(const std::vector<RankedEvent>& events, std::optional<int64_t> step = std::nullopt);

/// `optcc trace RESULTS [--step N] [-o trace.json] [--breakdown]`: writes the JSON to `output`
/// (when not empty) and prints what it wrote; prints the breakdown table with `breakdown`.
/// Throws std::runtime_error when the file has no timeline, `step` was not recorded, or neither
/// an output nor --breakdown was asked for. Returns 0.
struct TraceOptions {
  std::string results;
  std::optional<int64_t> step;
  std::string output;
  bool breakdown = false;
};
int run_trace_command(const TraceOptions& o);

}  // namespace optcc

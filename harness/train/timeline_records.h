// The timeline in the results file (timeline.h records it): the /timeline and /breakdown tables,
// the gather of every rank's events to rank 0, and the per-step hook the trainer calls.
//
// /timeline   one row per event: step, rank, kind, stream, microbatch (int64; kind and stream
//             index the JSON lists in the root attributes timeline_kinds / timeline_streams),
//             start_us, end_us (float64, µs since the run's origin; start_us <= end_us).
// /breakdown  one row per recorded step (trace.h: critical path and method): step, rank (the
//             critical one), step_us, then µs of compute, tp, pp_fwd, pp_bwd, dp, embedding,
//             compression, other, idle; the nine add up to step_us.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "harness/parallel/distributed.h"
#include "harness/records/metrics.h"
#include "harness/parallel/timeline.h"

namespace optcc {

/// The two tables above (added to a run's results when log.timeline_steps is not empty).
std::vector<TableSpec> timeline_tables();
/// Root attributes naming kinds and streams: timeline_kinds, timeline_streams (JSON lists).
std::map<std::string, std::string> timeline_attributes();

/// World collective: every rank's `events` to rank 0, in rank order (other ranks get {}). One
/// all-reduce agrees on the largest count, one all-gather moves fixed-width rows (kControl; the
/// TrafficMeter is left as it was, so /traffic is unaffected).
std::vector<RankedEvent> gather_timeline(Distributed& d, const std::vector<TimelineEvent>& events);

/// After a selected step, on every rank: gathers the step's events and, where `sink` is given
/// (rank 0), appends them to /timeline and the step's breakdown to /breakdown. Returns the
/// breakdown line for the log (rank 0; "" elsewhere).
std::string record_timeline_step(Distributed& d, MetricsSink* sink, Timeline& timeline);

}  // namespace optcc

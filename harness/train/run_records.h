// Per-step records of a training run, beyond the loss: what every rank measured in a step
// (traffic by class and link, peak RSS, timings, the DP reducer's per-tensor records, the pipeline
// codec's counts, the Fig. 11 series and the Fig. 12 memory components), gathered to all ranks
// with ONE all-gather per step over the world group (Traffic::kControl) and written by rank 0.
// result_tables() is the schema of the HDF5 groups (harness/records/metrics.h) a run writes.
//
// Who calls what: every rank calls record_rank_stats() once per step, in step order, with the
// same StepExtras widths (max_dp_tensors, max_orth_pairs: agree on them before the first step);
// only rank 0 passes a sink. gather_names() is a world collective too.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "compression/grad_reducer.h"
#include "harness/config/config.h"
#include "harness/parallel/distributed.h"
#include "harness/records/metrics.h"
#include "compression/pipeline_codec.h"

namespace optcc {

/// The HDF5 groups of a run: train, eval, traffic, memory, timing, dp_totals, dp_tensors,
/// pipeline_codec, memory_components, lep_orthogonality, lep_diagnostics (columns and units
/// documented in run_records.cpp).
std::vector<TableSpec> result_tables();

/// Validation perplexity exp(loss), capped at exp(kPerplexityLossCap) so a diverged run does not
/// print inf; a capped value says so (`capped`, the eval table's `ppl_capped` column, the log line).
/// NaN in, NaN out: a NaN loss is never shown with a finite perplexity.
constexpr double kPerplexityLossCap = 20.0;  // nats; exp(20) ~ 4.85e8
struct Perplexity {
  double value;  // exp(min(loss, cap)); NaN when loss is NaN
  bool capped;   // loss > kPerplexityLossCap (value is exp(cap), a lower bound)
};
Perplexity perplexity(double loss);
/// The eval progress text: "valid loss 2.3026 | ppl 10.00", "... | ppl > 485165195.41 (capped)",
/// "valid loss nan | ppl nan".
std::string eval_text(double loss, const Perplexity& ppl);

/// This process's peak resident set size, bytes.
int64_t peak_rss_bytes();

constexpr int kMemoryComponents = 9;

/// What a rank adds to its step's row besides traffic and timings.
struct StepExtras {
  std::array<int64_t, kMemoryComponents> memory{};  // memory_components columns after rank
  const GradReducer* dp_reducer = nullptr;
  int64_t max_dp_tensors = 0;          // max over ranks of the DP tensor count
  PipelineCodec* codec = nullptr;
  int64_t max_orth_pairs = 0;          // m - 1 when the Fig. 11 check is on, else 0
  int64_t max_lep_sends = 0;           // m when log.lep_diagnostics is on, else 0
  bool tensor_detail = false;          // this step writes /dp_tensors rows (a logging step)
  double pipeline_compute_seconds = 0; // of the pipeline schedule, the time in its compute actions
                                       // (PipelineStepResult::compute_seconds); the rest is waiting
};

/// What a run's results file grows by, from its config alone (before the first step: optcc train
/// logs it, optcc sweep --check sums it over an experiment's runs). Rows are counted per table from
/// the layout, each row at 8 bytes per column of result_tables() (every column is a 64-bit integer
/// or float; HDF5 stores them in chunks of rows, which the file adds: demo-3d's 1.59 MB of rows took
/// 1.99 MB on disk). An upper bound where the count
/// depends on what a step measures: /traffic counts every (class, link) a rank can use in this
/// layout, /dp_tensors every DP tensor of every rank as if each were compressed (none when
/// compression.dp is none), /pipeline_codec every rank when there are stages.
struct ResultsProjection {
  int64_t rows_per_step = 0;     // rows of the tables written every step
  int64_t bytes_per_step = 0;    // their bytes
  int64_t detail_rows = 0;       // /dp_tensors rows at one logging step
  int64_t detail_bytes = 0;      // their bytes
  int64_t logging_steps = 0;     // steps that write /dp_tensors rows
  int64_t total_bytes = 0;       // over train.train_steps, evaluations included
};
ResultsProjection project_results(const Config& c);
/// "about 5.3 kB per step (89 rows); 1.6 MB for 300 steps (an upper bound on the rows' data; ...)":
/// the line optcc train logs.
std::string projection_text(const ResultsProjection& p, int64_t train_steps);
/// 1234 -> "1.2 kB", in powers of 1000.
std::string byte_text(double bytes);

/// Gathers this step's records of every rank to all ranks and, on the rank holding `sink`,
/// appends them (traffic, memory, timing, dp_totals, dp_tensors when x.tensor_detail, pipeline_codec,
/// memory_components, lep_orthogonality, lep_diagnostics). Resets the rank's TrafficMeter and the codec's stats.
void record_rank_stats(Distributed& d, MetricsSink* sink, int64_t step, double pipeline_seconds, double step_seconds,
                       const StepExtras& x);

/// Every rank's `names` on every rank, in rank order (a world collective).
std::vector<std::vector<std::string>> gather_names(Distributed& d, const std::vector<std::string>& names);

}  // namespace optcc

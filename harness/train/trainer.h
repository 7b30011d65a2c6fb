// The training loop of one rank under tensor x pipeline x data parallelism:
//   data -> GPT stage (TP layers) -> 1F1B pipeline step -> DP all-reduce -> tied-embedding sync ->
//   global-norm clipping -> AdamW,
// with evaluation, progress lines, HDF5 results (written by global rank 0, with every rank's
// traffic gathered to it) and per-rank checkpoints. A world of one rank runs the same code with
// every group of size one.
//
// Re-runs (a killed run started again, a Slurm requeue) never destroy results:
//   * Checkpoints: see TrainOptions. A run whose checkpoint.dir holds a checkpoint resumes from it
//     (resume_auto) or is refused before any work; it never restarts at step 0 silently.
//   * Results: <log.dir>/<run>.h5, <run>.resumed-<step>.h5 when resumed at <step>; when that name is
//     taken (an earlier attempt that died before its first checkpoint, a second resume from the same
//     checkpoint) the first free <name>.attempt-<n>.h5, n = 2, 3, ... (logged). An existing results
//     file is never truncated: Hdf5MetricsSink creates its file exclusively.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "harness/config/config.h"
#include "models/gpt.h"

namespace optcc {

struct Distributed;

/// Where a run starts. With checkpoints already in cfg.checkpoint_dir() (same run name, re-run):
///   resume set:         resume from that directory (an iter_* directory or its parent holding
///                       `latest`); std::runtime_error before any work if it holds no checkpoint.
///   resume_auto:        resume from checkpoint.dir's `latest` when it names a checkpoint, else start at
///                       step 0 (a first run). `optcc train --resume auto`; its default inside a Slurm
///                       job (SLURM_JOB_ID set), so a requeued job continues.
///   neither (default):  start at step 0 when checkpoint.dir has no `latest`; otherwise refuse with a
///                       std::runtime_error naming the directory, --resume auto / --resume, and the
///                       keys that give the run a directory of its own (log.run_name, checkpoint.dir).
/// A `latest` naming a missing checkpoint is an error in every mode (find_checkpoint).
struct TrainOptions {
  std::optional<std::string> resume;  // checkpoint dir (iter_* or its parent with `latest`)
  bool resume_auto = false;           // see above; ignored when `resume` is set
  std::string command_line;           // recorded in the results file
  bool quiet = false;                 // no progress lines (tests)
  bool keep_parameters = false;       // return the final parameters in the summary (tests)
};

struct TrainSummary {
  int64_t first_step = 0;            // steps completed before this run (0 unless resumed)
  int64_t last_step = 0;             // steps completed at the end
  std::vector<double> train_losses;  // one per step run, nats (the same on every rank)
  std::vector<double> eval_losses;   // one per evaluation, nats (the same on every rank)
  std::string results_path;          // the HDF5 file written (by global rank 0)
  std::string last_checkpoint;       // "" if none written
  int64_t skipped_steps = 0;         // optimizer steps skipped on non-finite gradients (BR-01)
  std::map<std::string, torch::Tensor> parameters;  // keep_parameters: this rank's, by name
};

/// Runs `cfg` on the ranks the launch environment describes (local launcher, Slurm, torchrun, or
/// one process). Throws ConfigError before any work on bad input, std::runtime_error on bad data
/// files or a non-finite loss, CommError when a peer fails.
TrainSummary run_training(Config cfg, const TrainOptions& options);

/// The same on an already initialised world (tests build one from ranks as threads).
TrainSummary run_training(Config cfg, const TrainOptions& options, Distributed& dist);

/// The model options a validated config describes (vocab resolved; seed = train.seed).
GptOptions gpt_options(const Config& cfg);

/// Intra-op threads for this process: cfg.train.threads, or hardware threads / local_ranks.
int64_t threads_for(const Config& cfg, int64_t local_ranks = 1);

}  // namespace optcc

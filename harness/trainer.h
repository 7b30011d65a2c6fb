// The training loop on one rank: data -> GPT -> AdamW, with evaluation, progress lines, HDF5
// results and checkpoints. (The 3D-parallel runner replaces the single-rank step in issue 3.)
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "harness/config.h"
#include "models/gpt.h"

namespace optcc {

struct TrainOptions {
  std::optional<std::string> resume;  // checkpoint dir (iter_* or its parent with `latest`)
  std::string command_line;           // recorded in the results file
  bool quiet = false;                 // no progress lines (tests)
};

struct TrainSummary {
  int64_t first_step = 0;            // steps completed before this run (0 unless resumed)
  int64_t last_step = 0;             // steps completed at the end
  std::vector<double> train_losses;  // one per step run, nats
  std::vector<double> eval_losses;   // one per evaluation, nats
  std::string results_path;          // the HDF5 file written
  std::string last_checkpoint;       // "" if none written
};

/// Runs `cfg` (validated here; throws ConfigError before any work on bad input, and
/// std::runtime_error on bad data files or a non-finite loss). Single rank: world size 1.
TrainSummary run_training(Config cfg, const TrainOptions& options);

/// The model options a validated config describes (vocab resolved; seed = train.seed).
GptOptions gpt_options(const Config& cfg);

/// Intra-op threads for this process: cfg.train.threads, or hardware threads / local_ranks.
int64_t threads_for(const Config& cfg, int64_t local_ranks = 1);

}  // namespace optcc

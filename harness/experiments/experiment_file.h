// Experiment files (experiments/README.md): a grid of runs over a base config, at two scales.
//
// load_experiment() reads and checks one file completely: the header comment, every key at every
// level, the types, the Slurm resources, each override (section and key known to the config, value
// of the right type), the grid axes and their run-name parts, and that each scale's base config (or
// benchmark program path) is a file under `root`. Every violation is an ExperimentError whose
// message names the file, the key, the value, the rule and the fix. Expansion into runs and the
// per-run config check are in sweep.h.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/config/config.h"

namespace optcc {

/// Bad experiment file; a ConfigError, so `optcc` reports it like a config error (exit status 2).
class ExperimentError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// The scale names every experiment file defines, in this order.
const std::vector<std::string>& experiment_scale_names();

/// `slurm:` of a scale: what one array task (one run) asks for, and how many tasks run at once.
/// The first five keys are required; the rest are optional, except that a scale asking for GPUs
/// (gpus_per_node > 0 or gpus_per_task > 0) must set array_limit, mem or exclusive (or both), and
/// gpus_per_task, with gpus_per_task * tasks_per_node == gpus_per_node (one rank per task; every
/// GPU of a node a rank's). load_experiment refuses a block that breaks these rules.
struct SlurmResources {
  int64_t nodes = 1;           // >= 1
  int64_t tasks_per_node = 1;  // >= 1; world size of a run = nodes * tasks_per_node
  int64_t gpus_per_node = 0;   // >= 0
  int64_t cpus_per_task = 1;   // >= 1
  std::string time;            // wall-clock limit HH:MM:SS (hours may exceed 24)
  int64_t array_limit = 0;     // `array_limit`: >= 1 = at most this many array tasks at once
                               // (sbatch --array=...%N); 0 = not set (no limit)
  std::string mem;             // `mem`: memory per node as sbatch --mem: digits + optional K|M|G|T
                               // ("0" = all of each node's memory); "" = not set
  bool exclusive = false;      // `exclusive`: whole nodes (sbatch --exclusive)
  int64_t gpus_per_task = 0;   // `gpus_per_task`: >= 0, GPUs bound to each task (sbatch --gpus-per-task)
  int64_t stop_signal_seconds = 300;  // `stop_signal_seconds`: SIGUSR1 this long before the time limit
                                      // (sbatch --signal=B:USR1@N): the run checkpoints, exits 75 and the
                                      // task requeues itself; 0 = none; at most 65535

  /// True when the block asks for GPUs (gpus_per_node > 0 or gpus_per_task > 0).
  bool needs_gpus() const { return gpus_per_node > 0 || gpus_per_task > 0; }
  /// "16 nodes x 8 GPUs" (or "1 node x 1 GPU"): the GPUs the block asks for, for messages.
  std::string gpu_text() const;
};

/// One value of a grid axis: its run-name part and the overrides (train: "section.key=value" as
/// --set; benchmark: "--benchmark_x=value" program options) it adds to a run.
struct AxisChoice {
  std::string part;
  std::vector<std::string> items;
};

/// One `grid:` axis. Either named variants (`variants: {name: [overrides]}`) or one key with
/// scalar values (`key: train.seed, values: [1, 2]`, parts label + value: seed1, seed2).
struct GridAxis {
  std::string name;
  std::vector<AxisChoice> choices;  // file order
};

/// One entry of `scales:`.
struct ExperimentScale {
  std::string name;                // cpu | paper
  std::string base;                // train: base config; benchmark: the program (repository-relative)
  std::vector<std::string> items;  // `set:` overrides (train) or `args:` (benchmark), in order
  SlurmResources slurm;
  std::vector<GridAxis> grid;      // the top-level grid with this scale's `grid:` axes replaced
};

struct Experiment {
  std::string file;                 // as given
  std::string name;                 // experiment.name, default the file stem; results/<name>/
  std::string kind = "train";       // train | benchmark
  std::vector<std::string> feeds;   // figures/tables it feeds (free text, for people and figures)
  std::string question, claim, expected;  // the header comment's three statements
  std::vector<ExperimentScale> scales;    // in experiment_scale_names() order
  /// The scale called `name`; ExperimentError listing the scales when there is none.
  const ExperimentScale& scale(const std::string& name) const;
};

/// True when the file at `path` has a line starting with `experiment:` (a top-level key): an
/// experiment file, not a config. Textual, so a file with broken YAML still counts (and then
/// fails to load) instead of passing for a config. False for an unreadable file.
bool is_experiment_file(const std::string& path);

/// Reads and checks the experiment file `path`. Paths inside it (base configs, programs) are
/// relative to `root`, the repository root (optcc sweep runs from there). Throws ExperimentError.
Experiment load_experiment(const std::string& path, const std::string& root = ".");

/// A name usable as a file name and a run-name part: [A-Za-z0-9._+-], not empty, not starting
/// with '.' or '-', at most 100 characters.
bool is_safe_name(const std::string& s);

}  // namespace optcc

// `optcc sweep`: one experiment file (experiment_file.h) at one scale, expanded into its runs.
// Slurm (slurm/submit), the local runner (slurm/local) and the tests all use this one expansion.
//
// Expansion (experiments/README.md): the cartesian product of the scale's grid axes, the first
// axis outermost; run index = position, from 0; run name = the axes' parts joined with '-'.
// A train run's arguments are
//   train --config BASE --set <scale set>... --set <grid overrides, axes in order>...
//         --set log.dir=results/<experiment> --set log.run_name=<run>
//         --set checkpoint.dir=results/<experiment>/ckpt/<run>
// (never --nproc: the local runner adds --nproc <world_size>, srun starts world_size tasks); it
// writes results/<experiment>/<run>.h5. A benchmark run's arguments are
//   PROGRAM <scale args>... <grid options>... --benchmark_out=results/<experiment>/<run>.json
//           --benchmark_out_format=json
// (Google Benchmark does not create results/<experiment>/: a runner creates results_dir first).
//
// Output of the command:
//   (default)   one line per run: INDEX<TAB>RUN<TAB>the grid's overrides, shell-quoted, space-separated
//   --json      {"experiment", "scale", "file", "kind", "feeds", "results_dir", "slurm": {nodes,
//               tasks_per_node, gpus_per_node, cpus_per_task, time, array_limit (null = not set),
//               mem (null = not set), exclusive, gpus_per_task}, "needs_gpus" (the slurm block asks
//               for GPUs), "gpus" ("16 nodes x 8 GPUs", SlurmResources::gpu_text; null without), "build": {"cuda" (kBuiltWithCuda), "description" (build_description())},
//               "runs": [{"index", "run", "kind", "axes": {axis: part}, "overrides", "results",
//               "checkpoint_dir" ("" for a benchmark), "world_size", "args", "compression" (what
//               the run compresses, compression_label in config.h, e.g. "baseline" or
//               "dp=powersgd(rank=4)"; null for a benchmark or a config that does not load),
//               "match_regime" (its network.match_regime; "" when off)}]}
//               (slurm/submit reads needs_gpus, gpus and build from here instead of deriving them.)
//   --index I   run I's args, one per line
//   --check     first: a scale whose slurm block asks for GPUs is refused when this binary was built
//               without CUDA (gpu_build_refusal; exit status 2, nothing else checked). Then every train
//               run's config loaded (load_config) and validated as `optcc train` does (resolve_vocab,
//               Config::validate(world_size)); exit status 2 naming each bad run.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/experiments/experiment_file.h"

namespace optcc {

struct SweepRun {
  int64_t index = 0;
  std::string run;                                         // e.g. baseline-seed1
  std::vector<std::pair<std::string, std::string>> axes;   // axis name -> this run's part, axis order
  std::vector<std::string> overrides;                      // the grid's, axes in order
  std::string results;                                     // results/<experiment>/<run>.h5 (.json)
  std::string checkpoint_dir;                              // results/<experiment>/ckpt/<run>; "" benchmark
  int64_t world_size = 1;                                  // slurm nodes * tasks_per_node
  std::vector<std::string> args;                           // optcc arguments (train) or the command line
  std::string compression;  // what the run compresses (compression_label, config.h); "" until
                            // label_runs() loads its config, and for a benchmark run
  std::string match_regime;  // its network.match_regime (label_runs(), as `compression`): a run that
                             // derives its links; the runners pin one derivation per comparison
};

struct SweepPlan {
  std::string experiment, scale, file, kind, base;
  std::vector<std::string> feeds;
  std::string results_dir;                                 // results/<experiment>
  SlurmResources slurm;
  std::vector<SweepRun> runs;                              // in index order
};

/// Expands `scale` (cpu | paper) of `e`. Throws ExperimentError for an unknown scale, or when two
/// runs get the same name (naming both indices and the parts that collided).
SweepPlan expand_experiment(const Experiment& e, const std::string& scale);

/// `s` as one shell word: unchanged when it is plain ([A-Za-z0-9._+=/:,@%-]), else in single quotes.
std::string shell_quote(const std::string& s);

/// One line per run: INDEX<TAB>RUN<TAB>overrides (shell-quoted where needed), each ending in '\n'.
std::string sweep_listing(const SweepPlan& plan);
/// The --json object (header comment).
nlohmann::json sweep_json(const SweepPlan& plan);

/// Sets each train run's `compression` and `match_regime` from its loaded config (base under `root`, its --set list);
/// a run whose config does not load keeps "" (`--check` names the problem). `--json` calls it.
void label_runs(SweepPlan& plan, const std::string& root = ".");

/// A run whose config does not load or validate: its index, name and the ConfigError's message.
struct RunProblem {
  int64_t index = 0;
  std::string run, error;
};
struct SweepCheck {
  std::vector<RunProblem> problems;  // every bad run, in index order
  int64_t checked = 0;               // runs whose config was loaded
  int64_t vocab_from_data_config = 0;  // runs validated with data.vocab_size (dataset not prepared)
  int64_t results_bytes = 0;         // the runs' projected results files, summed (run_records.h)
  int64_t largest_results_bytes = 0;  // the largest of them
};
/// Loads each train run's config exactly as its args say (base under `root`, the --set list in
/// order), resolves the vocabulary (falling back to data.vocab_size when the dataset's <prefix>.json
/// is missing, as `optcc config show`), validates it for the run's world size and projects its
/// results file (project_results, harness/train/run_records.h). Never throws for
/// a bad run; collects them all. A benchmark plan has nothing to load (its options were checked
/// by load_experiment): checked = 0.
SweepCheck check_sweep(const SweepPlan& plan, const std::string& root = ".");

/// Why `plan` cannot run with a binary built with(out) CUDA (`built_with_cuda`, described by
/// `build`, e.g. build_description()), or "" when it can: a slurm block that asks for GPUs needs a
/// CUDA build. The message names the experiment, its file, the scale, what the block asks, the
/// build and the fix. `optcc sweep --check` passes this binary's kBuiltWithCuda.
std::string gpu_build_refusal(const SweepPlan& plan, bool built_with_cuda, const std::string& build);

struct SweepOptions {
  std::string file;
  std::string scale;
  bool json = false;
  bool check = false;
  std::optional<int64_t> index;
  std::string root = ".";  // the repository root: paths in the file and in each run are relative to it
};
/// `optcc sweep FILE --scale S [--json | --index I | --check]` (run from the repository root): prints to
/// stdout (check failures to stderr). Returns 0, or 2 when --check refused the scale for this build
/// or found a bad run. Throws
/// ExperimentError for a bad file or an --index out of range.
int run_sweep_command(const SweepOptions& o);

}  // namespace optcc

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

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "harness/config/config.h"
#include "harness/parallel/layout.h"
#include "harness/records/checkpoint.h"
#include "harness/train/optimizer.h"
#include "models/gpt.h"

namespace c10 {
class DebugInfoGuard;
}

namespace optcc {

namespace data {
class GptDataset;
}
struct Distributed;
struct StepExtras;
class BatchLoader;
class GptStageFunctions;
class GradientSync;
class OuterSync;
class Hdf5MetricsSink;
class MemoryTracker;
class PipelineCodec;
class PipelineSchedule;
class RunLock;
class StageLink;
class Timeline;
class DynamicLossScaler;
struct PipelineCodecSnapshot;

/// Where a run starts. With checkpoints already in cfg.checkpoint_dir() (same run name, re-run):
///   resume set:         resume from that directory (an iter_* directory or its parent holding
///                       `latest`); std::runtime_error before any work if it holds no checkpoint.
///   resume_auto:        resume from checkpoint.dir's `latest` when it names a checkpoint, else start at
///                       step 0 (a first run). `optcc train --resume auto`; its default in a requeued
///                       Slurm job (SLURM_RESTART_COUNT >= 1), so a requeue continues.
///   neither (default):  start at step 0 when checkpoint.dir has no `latest`; otherwise refuse with a
///                       std::runtime_error naming the directory, --resume auto / --resume, and the
///                       keys that give the run a directory of its own (log.run_name, checkpoint.dir).
/// A `latest` naming a missing checkpoint is an error in every mode (find_checkpoint).
struct TrainOptions {
  std::optional<std::string> resume;  // checkpoint dir (iter_* or its parent with `latest`)
  bool resume_auto = false;           // see above; ignored when `resume` is set
  /// Resume even when this run's config changes keys a resume may not change (resume_check.h):
  /// each change is logged and kept in the results file (`resume_config_changes`). Off: refused.
  bool allow_config_change = false;
  std::string command_line;           // recorded in the results file
  bool quiet = false;                 // no progress lines (tests)
  bool keep_parameters = false;       // return the final parameters in the summary (tests)
  /// Fault injection (tests): called on every rank with the step being run (1-based), the global
  /// rank and this rank's local fp32 gradients after the pipeline schedule, before the overflow
  /// check (loss_scaler.h); it may write into them (an inf, to see every rank skip).
  std::function<void(int64_t step, int rank, const std::vector<torch::Tensor>& grads)> on_local_gradients;
  // Tests: called on every rank before step `step` (1-based) runs, with the compressor state a
  // checkpoint saves (checkpoint.h CheckpointPart: save / load), e.g. to put a NaN into it.
  std::function<void(int64_t step, int rank, const std::vector<CheckpointPart>& parts)> on_step_state;
  /// network.match_regime: called on every rank (collective) before the link emulator is built, to
  /// set cfg.network.scale and the latencies; returns the text recorded as the root attribute
  /// network_regime. `optcc train` passes harness/perfmodel/regime.h derive_network_regime (this
  /// layer cannot name the simulator); without it a config with match_regime is refused.
  std::function<std::string(Config& cfg, Distributed& d)> derive_network;
};

struct TrainSummary {
  int64_t first_step = 0;            // steps completed before this run (0 unless resumed)
  int64_t last_step = 0;             // steps completed at the end
  std::vector<double> train_losses;  // one per step run, nats (the same on every rank)
  std::vector<double> eval_losses;   // one per evaluation, nats (the same on every rank)
  std::string results_path;          // the HDF5 file written (by global rank 0)
  std::string last_checkpoint;       // "" if none written
  int64_t skipped_steps = 0;         // steps skipped on inf/NaN gradients (loss_scaler.h)
  std::vector<double> loss_scales;   // fp16: the loss scale each step ran with (1 otherwise)
  int stopped_by_signal = 0;         // SIGTERM/SIGUSR1 (stop_signal.h): stopped after last_step, checkpointed; else 0
  std::map<std::string, torch::Tensor> parameters;  // keep_parameters: this rank's, by name
};

/// The token datasets of a run (valid: null when the validation split is empty).
struct RunData {
  std::shared_ptr<const data::GptDataset> train, valid;
};

/// One rank's training run. The constructor assembles the parts from the config, in this order
/// (the order is part of the result: it fixes every RNG draw and every collective):
///   set-up (vocabulary, validation, resume point, threads, seed) -> model and optimizer ->
///   pipeline (codec, stage link, TP wire dtype, schedule) -> gradient sync (with SC's choice) ->
///   checkpoint parts -> resume() -> records (widths, names, results file).
/// Every rank of the world constructs a Trainer and calls run(); both are collective.
class Trainer {
 public:
  Trainer(Config cfg, const TrainOptions& options, Distributed& d);
  ~Trainer();
  Trainer(const Trainer&) = delete;  // the parts hold references to model_
  Trainer& operator=(const Trainer&) = delete;

  /// Evaluation at step 0 (when not resumed), the steps, evaluations and checkpoints, the final
  /// evaluation. Returns what the run did.
  TrainSummary run();

 private:
  struct StepResult;

  void set_up();
  void apply_network_regime();
  void claim_directories();
  void take_run_locks();
  void check_writable_dirs();
  void on_every_rank(const std::string& what, const std::function<void()>& fn);
  void flush_results();
  void count_skipped_step(StepResult& r);
  void check_state_after_skip();
  [[noreturn]] void stop_on_nonfinite_gradients(int first_rank);
  void stop_on_signal(int signal);
  void build_model_and_optimizer();
  void build_pipeline();
  void build_gradient_sync();
  void choose_sc_auto();
  void build_checkpoint_parts();
  void resume();
  void check_resume_config();
  void build_records();
  std::map<std::string, std::string> result_attributes() const;
  void log_start() const;
  void start_timeline();

  StepResult step();
  void update(StepResult& r);
  void skip_step(StepResult& r, const std::vector<torch::Tensor>& grads);
  void record_step(const StepResult& r, double pipeline_seconds, int64_t activations_peak);
  void log_progress(const StepResult& r);
  void evaluate(int64_t step);
  void save();

  Distributed& d_;
  TrainOptions options_;
  std::shared_ptr<MemoryTracker> memory_;
  std::unique_ptr<c10::DebugInfoGuard> memory_guard_;  // installed before any tensor of the run
  Config cfg_;                                         // vocabulary resolved, validated
  std::optional<std::string> resume_from_;             // the checkpoint to resume from, if any
  bool writer_ = false, quiet_ = true;
  std::vector<std::unique_ptr<RunLock>> locks_;  // global rank 0: checkpoint.dir and results name (run_lock.h)
  std::string resume_config_changes_;  // "key: saved -> now" lines (resume_check.h); "" when none
  RankCoord coord_;
  int stages_ = 1;
  StageRange range_;
  int64_t m_ = 1;                   // micro-batches per step
  std::vector<int64_t> act_shape_;  // [s, b, h] of a pipeline message
  RunData data_;
  GptModel model_{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  LrSchedule lr_;
  CheckpointLayout layout_;
  std::string config_yaml_;
  std::shared_ptr<PipelineCodec> codec_;
  std::unique_ptr<StageLink> link_;
  std::unique_ptr<PipelineSchedule> pipeline_;
  std::unique_ptr<GptStageFunctions> stage_fn_;
  std::vector<bool> sc_compress_;  // [stages]: SC, which stages compress their DP gradients
  std::string sc_auto_text_;       // dp_stages: auto, how the choice was made
  std::string network_regime_;  // network.match_regime: how the scale was derived ("" without)
  std::string sc_stages_;          // the choice, for the log and results
  std::unique_ptr<GradientSync> grad_sync_;
  std::unique_ptr<OuterSync> outer_;  // compression.dp_strategy: diloco (outer_sync.h); null under allreduce
  std::vector<CheckpointPart> checkpoint_parts_;
  TrainState state_;
  std::unique_ptr<StepExtras> extras_;
  std::vector<std::vector<std::string>> all_dp_names_;
  std::unique_ptr<BatchLoader> loader_;
  TrainSummary summary_;
  std::unique_ptr<Hdf5MetricsSink> sink_;
  std::unique_ptr<Timeline> timeline_;  // log.timeline_steps (timeline.h); empty when none
  int64_t tokens_per_step_ = 0;
  std::vector<torch::Tensor> params_;
  double seconds_run_ = 0.0;
  std::unique_ptr<DynamicLossScaler> scaler_;  // fp16's loss scale; S = 1 otherwise (loss_scaler.h)
  std::unique_ptr<PipelineCodecSnapshot> codec_before_step_;  // compressing codecs: put back on a skip
};

/// What `optcc train` checks once, in the launching process before any rank starts: data.prefix's
/// prepared files exist (<prefix>.bin and .idx; .json too when model.vocab_size is 0), and the
/// checkpoint rule of TrainOptions (checkpoint.dir already holding a checkpoint needs --resume or
/// --resume auto). `prepare_command` is how to prepare this run's data, written with the caller's
/// own --config and --set (so an overridden data.prefix is the one prepared); the error quotes it.
/// Throws ConfigError naming the missing files, or std::runtime_error for the checkpoint rule.
void check_run_inputs(const Config& cfg, const TrainOptions& options, const std::string& prepare_command);

/// Runs `cfg` on the ranks the launch environment describes (local launcher, Slurm, torchrun, or
/// one process). Throws ConfigError before any work on bad input, std::runtime_error on bad data
/// files or a non-finite loss, CommError when a peer fails.
TrainSummary run_training(Config cfg, const TrainOptions& options);

/// The same on an already initialised world (tests build one from ranks as threads).
TrainSummary run_training(Config cfg, const TrainOptions& options, Distributed& dist);

/// The model options a validated config describes (vocab resolved; seed = train.seed).
GptOptions gpt_options(const Config& cfg);

/// The layers and ends of pipeline stage `stage` (0-based) of a validated config.
StageRange stage_range(const Config& c, int stage);

/// Intra-op threads for this process: cfg.train.threads, or hardware threads / local_ranks.
int64_t threads_for(const Config& cfg, int64_t local_ranks = 1);

}  // namespace optcc

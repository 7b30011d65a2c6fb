// `optcc eval --checkpoint DIR`: loss, perplexity and LAMBADA-style last-word accuracy of a
// checkpoint on held-out documents, on one process or any TP x PP x DP layout (the reference's
// val_check_gpt.py; the Table 3 analogue on our corpus).
//
// The model: the checkpoint merged into a whole model and cut into the eval layout's shards
// (checkpoint_reshard.h). The eval layout is tp = pp = dp = 1 unless --layout tp,pp,dp or
// --set parallel.* say otherwise; its world size must equal --nproc (or the launcher's ranks).
//
// Loss and perplexity: exactly the samples a training evaluation sees, averaged the same way
// (Trainer's validation_loss): the split's GptDataset built with the run's seed and
// eval_iters * micro_batch_size * dp samples (dp: the TRAINING layout's, from the checkpoint), read
// as N = eval_iters * dp micro-batches of micro_batch_size samples, micro-batch j holding samples
// [j*b, (j+1)*b) (training: micro-batch i of DP replica r is j = i*dp + r). Loss = mean over the N
// micro-batches of their mean token cross-entropy; the eval layout's DP replica r takes micro-batches
// j = r, r + dp', ... and the sums are all-reduced. So the single-process loss of the checkpoint of
// step S equals the training run's evaluation at step S up to fp32 rounding (summation order,
// TP splits), when that evaluation was uncompressed.
//   Compression: training evaluations send their forward pipeline messages through the training
//   codec (compression.pipeline_forward) and TP all-reduces in compression.tp's dtype; eval does
//   neither (it evaluates the model itself, uncompressed, whatever the training's compression
//   section says). With pipeline_forward or tp compression the training's logged losses therefore
//   differ from eval's by the compression's effect; EvalResult::note says so. Compression of
//   backward messages (CB, LEP) and of DP/embedding gradients never enters an evaluation.
// --set train.eval_iters / train.micro_batch_size change the sample count (then the training
// run's value is not comparable); --split test uses the test documents (data.split's third weight).
//
// Last-word accuracy: datasets/last_word.h (word boundaries from <data.prefix>.vocab; no
// SentencePiece in this process), on the first --documents items of the split (default 1000;
// 0 skips the metric), batched micro_batch_size at a time, right-padded to seq_len (the model is
// causal: padding never changes an earlier position's prediction).
//
// Results: a new HDF5 file, never a write into the training run's file (the trainer's rule: results
// files are created exclusively and never modified, so a figure built from a run's file never sees
// a half-written group, and a crash of eval cannot damage the run's records):
// <log.dir>/<run>.eval-<step>.h5 (or <run>.eval-<step>.attempt-<n>.h5 when taken), or --output
// (which must not exist). Root attributes: kind = "eval_checkpoint", checkpoint, checkpoint_step,
// trained_layout, eval_layout, split, config (the run's), eval_config, run attributes (revision,
// versions, host, command line), training_results (the run's file whose /eval has step S, if
// found) and training_not_comparable (why the run's evaluation was not compared: --split test,
// other eval_iters / micro_batch_size / data.split / data.prefix); one table /eval_checkpoint, one
// row (columns in eval_checkpoint.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/config/config.h"
#include "harness/parallel/distributed.h"

namespace optcc {

struct EvalOptions {
  std::string checkpoint;              // checkpoint.dir holding `latest`, or an iter_* directory
  std::string split = "valid";         // valid | test
  std::vector<std::string> overrides;  // --set; only the keys eval_settable_keys() lists
  std::string layout;                  // --layout "tp,pp,dp"; "" = 1,1,1 (before --set)
  int64_t documents = 1000;            // last-word items; 0 = no last-word metric
  std::string output;                  // results file; "" = <log.dir>/<run>.eval-<step>.h5
  std::string command_line;            // recorded in the results file
  bool quiet = false;                  // no log lines (tests)
};

struct EvalResult {
  int64_t step = 0;                    // the checkpoint's step
  std::string split;
  double loss = 0.0;                   // nats, mean over micro-batches (see above)
  double ppl = 0.0;                    // exp(loss), capped as the trainer's (run_records.h)
  bool ppl_capped = false;
  int64_t samples = 0;                 // sequences of seq_len + 1 tokens evaluated
  int64_t lastword_documents = 0;      // items evaluated
  int64_t lastword_correct = 0;
  int64_t lastword_skipped = 0;        // documents of the split without an item (no word/context)
  double lastword_accuracy = 0.0;      // correct / documents; NaN when none
  std::optional<double> training_loss; // the training run's evaluation at `step`, when found
  std::string training_results;        // the file it came from
  std::string not_comparable;          // why it was not looked up (--split test, other samples), or ""
  double max_replica_difference = 0.0; // merge_checkpoint's checks (0 for a sound checkpoint)
  double max_tied_difference = 0.0;
  double max_tp_copy_difference = 0.0;
  std::string trained_layout, eval_layout;
  std::string note;                    // why the training run's loss may differ (compression), or ""
  std::string results_path;            // written by global rank 0 ("" on other ranks)
};

/// The keys --set may change in eval; every other key is the checkpoint's (the model, its data,
/// its seed) and is refused with a ConfigError naming the key and these.
const std::vector<std::string>& eval_settable_keys();

/// The eval config: the checkpoint's `trained` config with the parallel section reset to one rank,
/// no compression, no network emulation, no timeline; then --layout and --set; global_batch_size set
/// to micro_batch_size * dp (eval takes no optimizer step); validated for `world_size` ranks
/// (e.g. TP must divide the heads). Throws ConfigError.
Config eval_config(const Config& trained, const EvalOptions& o, int64_t world_size);

/// eval_config for the checkpoint of `o` (its rank 0 file only, no parameters): what a launcher
/// checks before forking `world_size` ranks. Throws as read_checkpoint_config and eval_config.
Config eval_config_of(const EvalOptions& o, int64_t world_size);

/// Evaluates on every rank of `d` (collective: every rank calls it). Throws std::runtime_error
/// before any work when the checkpoint is missing or inconsistent, the split is empty (naming
/// data.split and the fix), the tokenizer's .vocab is missing (with --documents > 0), or the
/// results file cannot be created; ConfigError for bad options.
EvalResult run_eval(const EvalOptions& o, Distributed& d);

/// The same on the ranks of the launch environment (local launcher, Slurm, torchrun, one process).
EvalResult run_eval(const EvalOptions& o);

/// The result as the lines `optcc eval` prints.
std::string eval_report(const EvalResult& r);

}  // namespace optcc

// Checkpoints: model, optimizer, RNG state, data position and step, one file per rank, written
// atomically (temporary name, then rename) so a crash never leaves a half-written checkpoint.
//
// Layout: <dir>/iter_0000100/rank_00000.pt and <dir>/latest (text: "iter_0000100"), the latter
// replaced atomically after every rank's file is in place. Resuming restores everything needed
// for bit-identical continuation on CPU (same layout and thread count).
// Files are device-agnostic: every tensor is read onto the host, whatever device wrote it, and
// loading places the model's and the optimizer's tensors on the device of the model's parameters
// (a GPU run's checkpoint is evaluated on CPU ranks, and resumed on another GPU index);
// compressor parts move their state to the gradients' device on first use.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace optcc {

/// A stateful component saved with the checkpoint (compressor state: DP and embedding reducers'
/// error-feedback buffers, warm-start Q and generators, the pipeline codec's Q and LEP buffers;
/// BR-03). `name` keys it in the file; `identity` (e.g. "powersgd(rank=4)") must be equal on load,
/// so a run never resumes a compressor's state into a different compressor. `load` throws
/// std::invalid_argument when the saved state does not fit this run (e.g. StateMismatch: kept for
/// other tensors); load_checkpoint() reports it with the file, the part and the fix.
struct CheckpointPart {
  std::string name;
  std::string identity;
  std::function<void(torch::serialize::OutputArchive&)> save;
  std::function<void(torch::serialize::InputArchive&)> load;
};

/// What the training loop needs besides model and optimizer.
struct TrainState {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // global data position (see BatchLoader)
};

/// Identifies the layout a checkpoint belongs to; loading onto another layout is an error.
struct CheckpointLayout {
  int64_t tp = 1, pp = 1, dp = 1, rank = 0;
};

/// Writes this rank's checkpoint for `state.step` under `dir` (through write(2) and fsync; a full
/// disk or a file-size limit is an error naming the file and the OS error, never an abort), then
/// calls `all_written` with whether its own file is in place; every rank calls this function, and
/// `all_written` must return whether EVERY rank's file is (the trainer: a world all-reduce). Then
/// rank 0 points `latest` at it and, when keep > 0, calls prune_checkpoints(dir, state.step, keep)
/// (keep = 0: keep all). So `latest` always names a complete checkpoint that pruning never removes.
/// When some rank failed, every rank removes its file of this step, `all_written` is called once
/// more (with true, as a barrier), rank 0 removes the step's directory, and every rank throws
/// std::runtime_error (the failing rank's names the file and the OS error). Returns the checkpoint
/// directory.
std::string save_checkpoint(const std::string& dir, const TrainState& state, torch::nn::Module& model,
                            torch::optim::Optimizer& optimizer, const CheckpointLayout& layout,
                            const std::string& config_yaml, int64_t keep,
                            const std::function<bool(bool)>& all_written = [](bool ok) { return ok; },
                            const std::map<std::string, at::Generator>& generators = {},
                            const std::vector<CheckpointPart>& parts = {});

/// Removes checkpoints under `dir` so that `keep` (>= 1) remain: the one of `written_step` (just
/// written; always kept, whatever else is there) and the newest keep - 1 of lower step. Directories
/// of a HIGHER step are the future of an abandoned timeline (a run resumed from an earlier
/// checkpoint, or started over) and are always removed first: they are not this run's progress, and
/// kept they would crowd out its own checkpoints. Order is by the step parsed from "iter_<digits>",
/// never by name; other entries are left alone. Called by save_checkpoint on rank 0 after `latest`
/// names `written_step`, so `latest` never names a removed directory. Returns the removed
/// directories; throws std::runtime_error naming the path when one cannot be removed.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t written_step, int64_t keep);

/// Every rank file <iter>/rank_NNNNN.pt is written with <file>.sha256 beside it (the SHA-256 of its
/// bytes in sha256sum's format, so `sha256sum -c` checks it by hand), the checksum before the file
/// takes its name. Every load checks it first: a missing or different checksum is an error naming
/// the file and both digests, the newest older checkpoint whose file of that rank is intact, and the
/// --resume command that uses it; nothing of a corrupt file is loaded.
std::string checkpoint_checksum_file(const std::string& file);
/// "" when `file` matches its checksum file; else why not (missing checksum, or both digests).
/// Throws std::runtime_error naming the file when it cannot be read.
std::string checkpoint_checksum_problem(const std::string& file);

/// The checkpoint directory `latest` points to under `dir`, if any (whether or not it exists).
std::optional<std::string> latest_checkpoint(const std::string& dir);

/// The checkpoint a resume from `path` loads: the directory `latest` names when `path` holds
/// `latest`, else `path` itself when it holds rank_00000.pt (an iter_* directory), else nullopt
/// (no checkpoint there). Throws std::runtime_error naming both when `latest` names a directory
/// without rank_00000.pt (removed or never completed) rather than letting a resume start over.
std::optional<std::string> find_checkpoint(const std::string& path);

/// Loads this rank's file from checkpoint directory `ckpt` (an iter_* directory, or a directory
/// holding `latest`) into model/optimizer, the default CPU generator and `generators` (saved under
/// the same names, e.g. the model's attention-dropout generator) and every part of `parts` (BR-03).
/// Throws std::runtime_error naming the file and the mismatch (NaN/inf anywhere in it, see
/// non_finite_tensors; layout, missing tensor, shape, a
/// part missing or saved by a different compressor, or a part whose load() throws
/// std::invalid_argument, e.g. state kept for other tensors: the part, its reason and the fix).
TrainState load_checkpoint(const std::string& ckpt, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, const CheckpointLayout& layout,
                           const std::map<std::string, at::Generator>& generators = {},
                           const std::vector<CheckpointPart>& parts = {});

/// The keys ("optimizer/...", "state/<part>/...", "model/...") of the floating-point tensors under
/// `ar` that hold a NaN or an infinity, depth first. load_checkpoint refuses a file with any:
/// naming them, the rank and the newest older intact checkpoint (a non-finite error-feedback or LEP
/// buffer turns every later step into a skipped one).
std::vector<std::string> non_finite_tensors(torch::serialize::InputArchive& ar, const std::string& prefix = "");

/// The same for the live state: AdamW's (or Adam's) moments where they live ("optimizer/group G
/// parameter I/exp_avg"; another optimizer through its saved state, "optimizer/..."), and each
/// compressor part as it would be saved ("state/<part>/...", one part at a time through host memory,
/// no file). The trainer calls it at the first of a series of skipped steps.
std::vector<std::string> non_finite_state(torch::optim::Optimizer& optimizer, const std::vector<CheckpointPart>& parts);

/// One tensor `key` of the part `name` in this rank's file of checkpoint `ckpt` (as for
/// load_checkpoint), without loading anything else; nullopt when the file has no such part/key.
/// For decisions that must be known before the other parts can be built (SC auto's stage choice).
std::optional<torch::Tensor> read_checkpoint_tensor(const std::string& ckpt, int64_t rank, const std::string& name,
                                                    const std::string& key);

/// One rank's file of a checkpoint as plain data: what a merge of the shards needs (no optimizer,
/// generator or compressor state). `parameters` are keyed as that rank's model names them.
struct CheckpointFile {
  std::string path;
  int64_t step = 0;
  int64_t consumed_samples = 0;
  CheckpointLayout layout;  // the layout it was written under, and the rank that wrote it
  std::string config_yaml;  // the run's effective config (to_yaml, vocabulary resolved)
  std::map<std::string, torch::Tensor> parameters;
};

/// The file of `rank` in checkpoint `ckpt` (an iter_* directory, or a directory holding `latest`,
/// as find_checkpoint resolves it): meta data always, the model parameters when `with_parameters`.
/// Throws std::runtime_error naming the path when there is no checkpoint, no file for that rank,
/// the file cannot be read or has another format version.
CheckpointFile read_checkpoint_file(const std::string& ckpt, int64_t rank, bool with_parameters = true);

}  // namespace optcc

// Checkpoints: model, optimizer, RNG state, data position and step, one file per rank, written
// atomically (temporary name, then rename) so a crash never leaves a half-written checkpoint.
//
// Layout: <dir>/iter_0000100/rank_00000.pt and <dir>/latest (text: "iter_0000100"), the latter
// replaced atomically after every rank's file is in place. Resuming restores everything needed
// for bit-identical continuation on CPU (same layout and thread count).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace optcc {

class GradReducer;

/// What the training loop needs besides model and optimizer.
struct TrainState {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // global data position (see BatchLoader)
};

/// Identifies the layout a checkpoint belongs to; loading onto another layout is an error.
struct CheckpointLayout {
  int64_t tp = 1, pp = 1, dp = 1, rank = 0;
};

/// Writes this rank's checkpoint for `state.step` under `dir`, waits in `barrier` (every rank
/// calls this function; the barrier makes sure all files exist), then rank 0 points `latest` at
/// it and prunes all but the newest `keep` checkpoints (keep = 0: keep all).
/// Throws std::runtime_error naming the path on I/O failure. Returns the checkpoint directory.
std::string save_checkpoint(const std::string& dir, const TrainState& state, torch::nn::Module& model,
                            torch::optim::Optimizer& optimizer, const CheckpointLayout& layout,
                            const std::string& config_yaml, int64_t keep,
                            const std::function<void()>& barrier = [] {},
                            const std::map<std::string, at::Generator>& generators = {},
                            const GradReducer* reducer = nullptr);

/// The checkpoint directory `latest` points to under `dir`, if any.
std::optional<std::string> latest_checkpoint(const std::string& dir);

/// Loads this rank's file from checkpoint directory `ckpt` (an iter_* directory, or a directory
/// holding `latest`) into model/optimizer, the default CPU generator and `generators` (saved under
/// the same names, e.g. the model's attention-dropout generator) and the DP reducer's state
/// (error-feedback buffers, warm-start Q, generator; BR-03) when `reducer` is given. Throws
/// std::runtime_error naming the file and the mismatch (layout, missing tensor, shape).
TrainState load_checkpoint(const std::string& ckpt, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, const CheckpointLayout& layout,
                           const std::map<std::string, at::Generator>& generators = {},
                           GradReducer* reducer = nullptr);

}  // namespace optcc

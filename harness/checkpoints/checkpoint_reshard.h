// A checkpoint written under any TP x PP x DP layout as one whole model, and that model cut into the
// shards of any other layout (`optcc eval --checkpoint`; the reference's checkpoint converter).
//
// Contract of the merge (merge_checkpoint):
//   * Input: the per-rank files of one checkpoint (harness/records/checkpoint.h), rank = tp + TP *
//     (dp + DP * pp). The layout and the run's config come from the files themselves (meta/layout,
//     meta/config); nothing is given on the side.
//   * Which parameter is split how is asked from the model (models/sharding.h: tp_splits, the
//     layers' TpSplit): column-parallel weights and biases along dim 0, row-parallel weights along
//     dim 1 (their biases replicated), the vocab-parallel word embedding along its padded vocabulary
//     rows, everything else replicated (TP rank 0's copy is taken; the others are compared,
//     max_tp_copy_difference). Stage k's block i is layer
//     first_layer(k) + i of the whole model (the config's stage_layer_counts, stage_range()).
//   * DP replicas hold identical parameters (every update is all-reduced): replica 0 is taken and
//     the others are compared (max_replica_difference). The tied word embedding is taken from
//     stage 0 and compared with the last stage's copy (max_tied_difference). The three differences
//     are reported, not enforced: a caller decides (optcc eval prints them; the tests require 0).
//     A TP copy difference means the TP ranks of a stage trained different LayerNorms/biases: their
//     hidden-dropout masks differed (ranks as threads share one default generator; separate
//     processes seeded alike draw the same masks), and the merged model is TP rank 0's view.
//   * Output: whole-model parameter names (a GptModel built without TP group on one stage) with
//     their whole shapes; the word embedding keeps the source's padded row count (vocab_divisor * tp
//     of the source layout): load_whole_model fits it to the target's.
//   Every rank's file is read (optimizer state included), so memory is about the size of the whole
//   checkpoint; fine for the models optcc trains on CPU.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>

#include "harness/config/config.h"
#include "harness/records/checkpoint.h"
#include "models/gpt.h"

namespace optcc {

struct MergedCheckpoint {
  std::string dir;          // the iter_* directory that was read
  int64_t step = 0;         // optimizer steps completed when it was written
  CheckpointLayout layout;  // the layout it was written under (rank 0)
  Config config;            // the run's effective config as stored (vocabulary resolved)
  std::map<std::string, torch::Tensor> parameters;  // whole-model name -> whole tensor
  double max_replica_difference = 0.0;  // max |x_r - x_0| over DP replicas r > 0, every parameter
  double max_tied_difference = 0.0;     // max |E_last - E_0| of the word embedding's two copies
  double max_tp_copy_difference = 0.0;  // max |x_t - x_0| over TP ranks t > 0 of replicated parameters
};

/// The config a checkpoint stores (rank 0's file; parameters are not read), with its step and
/// layout: what a launcher needs before it forks. Throws std::runtime_error when `checkpoint` holds
/// no checkpoint or the file cannot be read, ConfigError when the stored config does not load.
MergedCheckpoint read_checkpoint_config(const std::string& checkpoint);

/// The whole model of `checkpoint` (checkpoint.dir holding `latest`, or an iter_* directory).
/// Throws std::runtime_error naming the file and the parameter when a rank's file is missing, holds
/// another layout or step than rank 0's, lacks a parameter the config's model has, holds one it
/// does not have, or a merged tensor's shape differs from the whole model's.
MergedCheckpoint merge_checkpoint(const std::string& checkpoint);

/// Copies into `model` (one stage of any layout, built with a TP group of `tp_size` ranks in which
/// it is rank `tp_rank`) its shards of `whole` (merge_checkpoint's parameters): replicated
/// parameters whole, split ones as block tp_rank of tp_size (models/sharding.h), the word
/// embedding's rows fitted to the model's padded vocabulary first (padding rows zero). Throws
/// std::runtime_error naming the parameter when `whole` lacks it or its shard's shape differs
/// from the model's (a model of other sizes than the checkpoint's).
void load_whole_model(GptModelImpl& model, const std::map<std::string, torch::Tensor>& whole, int64_t tp_rank,
                      int64_t tp_size);

}  // namespace optcc

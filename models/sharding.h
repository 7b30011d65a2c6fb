// Where each parameter of a GPT stage lives in the whole model, and how it is split over the
// tensor-parallel group: what merging a checkpoint's shards into one model and cutting a whole model
// into another layout's shards need (harness/checkpoints/checkpoint_reshard.h does the file side).
//
// Nothing here is a second table of the model: the split of a parameter is asked from the layer
// that registered it (TpSplit, tensor_parallel.h: ColumnParallelLinear splits weight and bias along
// dim 0, RowParallelLinear its weight along dim 1 and keeps its bias whole, VocabParallelEmbedding its
// padded vocabulary rows); every other parameter (LayerNorms, GptModel's position_embedding) is
// replicated. The pipeline side is the stage's StageRange: its block i is layer layer_of(i) (first_layer + i
// with one model chunk; interleaved stages hold several chunks, gpt.h).
// The tied word embedding: stage 0 holds it as the input embedding and, with more than one stage,
// the last stage holds a copy used as the output layer; both are "embedding.weight" in the whole
// model (one tensor: a whole model on one stage uses it for both).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "models/gpt.h"

namespace optcc {

/// Every parameter of `model` (keys as model.named_parameters()) -> how it is split over the TP
/// group, from the type of the module that registered it (see the header comment). The same for
/// every TP size: a model built without a TP group (tp == nullptr) reports the splits it would have.
std::map<std::string, TpSplit> tp_splits(const GptModelImpl& model);

/// The whole-model layer of a stage's parameter name: stage.layer_of(i) for "blocks.<i>.<rest>"
/// (first_layer + i with one model chunk); nullopt for every other name (the embeddings, the final LayerNorm).
std::optional<int64_t> whole_model_layer(const std::string& stage_name, const StageRange& stage);

/// A stage's parameter name in the whole model: "blocks.<i>.<rest>" -> "blocks.<stage.layer_of(i)>.<rest>";
/// every other name is the same in both.
std::string whole_model_name(const std::string& stage_name, const StageRange& stage);

/// The whole tensor from the TP shards of one parameter, in group-rank order: their concatenation
/// along split.dim, or shards[0] when replicated. Throws std::invalid_argument when `shards` is empty.
torch::Tensor merge_tp_shards(const std::vector<torch::Tensor>& shards, const TpSplit& split);

/// `whole` (a merged vocabulary-padded tensor, rows over some padded vocabulary >= true_vocab) with
/// `padded_rows` rows: rows [0, true_vocab) copied, the padding rows zero (they never enter a loss or
/// a logit that counts, BR-15; the padded size depends on the TP size, vocab_divisor * tp).
/// Throws std::invalid_argument when whole has fewer than true_vocab rows or padded_rows < true_vocab.
torch::Tensor fit_vocab_rows(const torch::Tensor& whole, int64_t true_vocab, int64_t padded_rows);

/// Group rank `rank`'s shard (a contiguous copy) of the whole tensor `whole` among `size` ranks:
/// block `rank` of `size` along split.dim, or `whole` itself (copied) when replicated. Throws
/// std::invalid_argument when split.dim's size is not divisible by `size`.
torch::Tensor tp_shard(const torch::Tensor& whole, const TpSplit& split, int64_t rank, int64_t size);

}  // namespace optcc

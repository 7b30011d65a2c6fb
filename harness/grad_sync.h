// Gradient reduction after a step's pipeline schedule (the baseline order of spec §1.2):
//   1. data parallel: the configured GradReducer (compression/grad_reducer.h; `none` is Megatron
//      v2.5 "local DDP": one flattened buffer, divided by dp, all-reduced after the schedule
//      returned, no bucketing or overlap), over the gradients that ensure_grads() returns;
//   2. tied embedding: on the first and last stage (pp > 1) the word-embedding gradient is
//      all-reduced (sum) over the 2-rank embedding group, so the two copies get the same update;
//   3. global gradient norm over the model-parallel group (each parameter counted once).
// All ranks of the respective groups must call these in the same order.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "harness/communicator.h"
#include "models/gpt.h"

namespace optcc {

/// The gradients of `params`, in order; a parameter without one gets zeros first, so every rank
/// hands the DP reducer the same list of tensors. The returned tensors alias the .grad fields.
std::vector<torch::Tensor> ensure_grads(const std::vector<torch::Tensor>& params);

/// Step 2. No-op when `embedding` is null (middle stages) or has one rank (pp == 1).
void sync_tied_embedding_grad(GptModel& model, Communicator* embedding);

/// Step 3. sqrt of the sum of squared gradients of the whole model: sharded parameters count on
/// every TP rank, TP-replicated ones (LayerNorm, position embedding, row-parallel biases) on TP rank
/// 0 only, and the last stage's copy of the word embedding not at all when pp > 1 (it equals stage
/// 0's). All-reduced over `model_parallel` (null = this rank alone). Same value on every rank.
double global_grad_norm(GptModel& model, Communicator* model_parallel, int tp_rank, int stages);

/// Scales every gradient by max_norm / (norm + 1e-6) when norm > max_norm > 0.
void clip_grads_to(const std::vector<torch::Tensor>& params, double norm, double max_norm);

}  // namespace optcc

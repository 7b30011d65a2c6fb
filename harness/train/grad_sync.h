// Gradient reduction after a step's pipeline schedule (the baseline order of docs/design.md §1.2; the class
// GradientSync below adds FE, SC and the embedding reducer on top of these steps):
//   1. data parallel: the configured GradReducer (compression/grad_reducer.h; `none` is Megatron
//      v2.5 "local DDP": one flattened buffer, divided by dp, all-reduced after the schedule
//      returned, no bucketing or overlap), over the gradients that ensure_grads() returns;
//   2. tied embedding: on the first and last stage (pp > 1) the word-embedding gradient is
//      all-reduced (sum) over the 2-rank embedding group, so the two copies get the same update;
//   3. global gradient norm over the model-parallel group (each parameter counted once).
// All ranks of the respective groups must call these in the same order.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "compression/grad_reducer.h"
#include "harness/records/checkpoint.h"
#include "harness/parallel/communicator.h"
#include "harness/config/config.h"
#include "models/gpt.h"

namespace optcc {

/// The gradients of `params`, in order; a parameter without one gets zeros first, so every rank
/// hands the DP reducer the same list of tensors. The returned tensors alias the .grad fields.
std::vector<torch::Tensor> ensure_grads(const std::vector<torch::Tensor>& params);

/// Step 2. No-op when `embedding` is null (middle stages) or has one rank (pp == 1).
void sync_tied_embedding_grad(GptModel& model, Communicator* embedding);

/// The DP reducer of a stage: compression.dp when `compresses` (SC's choice for the stage) and
/// compression.dp is not `none`; otherwise the uncompressed NoneReducer with
/// parallel.grad_reduce_dtype's wire. GradientSync and the traffic model build it here.
/// std::invalid_argument from the registry for an unknown name or option.
std::unique_ptr<GradReducer> make_dp_reducer(const Config& cfg, bool compresses);

/// Steps 1-2 with the configured compressors, for one rank (docs/design.md §1.2, §5.2, §5.5, §6.5):
///   - SC: this stage reduces its DP gradients with compression.dp when stage_compresses_dp()
///     (compression/stage_selection.h) says so, else with `none` (raw); compresses_dp() tells which.
///   - Baseline embedding sync (fused_embedding: false): the word-embedding gradient is in the DP
///     list; afterwards the first and last stage sum it over the 2-rank embedding group (through
///     compression.embedding when that is not `none`: its mean over the pair, times 2).
///   - FE (fused_embedding: true): the word-embedding gradient leaves the DP list; the first and
///     last stage then sum it over the fused group ({stage 0, stage p-1} x all DP replicas, one
///     group per TP rank, RankLayout::fused_embedding_group) and divide by d. Equal to the baseline
///     in exact arithmetic, and to 0 ULP when the sums are exact (BR-09: 5.0 everywhere). With a
///     compressing embedding reducer: its mean over the 2d ranks, times 2. The DP reducer never
///     touches (so never zeroes) the embedding gradient (docs/design.md §5.4).
///   - parallel.grad_reduce_dtype: compute on a bf16/fp16 run: the uncompressed DP reduction (the
///     `none` reducer of every stage that does not compress) carries the compute dtype on the wire
///     and still sums in fp32 (NoneReducer in compression/grad_reducer.h: the gradients ÷ dp, times
///     the loss scale on fp16, rounded to 16 bits; an all-to-all, an fp32 sum rounded once, an
///     all-gather). Compressing reducers and the embedding sync are unaffected.
///   - compression.dp_strategy: diloco: step 1 is left out (each replica keeps its own gradients;
///     the replicas meet in harness/train/outer_sync.h's outer step); the embedding pair still sums.
/// Every rank calls reduce() once per step after the schedule, with the same step on all ranks.
/// Returns false when a compressing reducer found NaN/Inf gradients (NonFiniteGradients, on all
/// ranks of its group alike; its state is untouched): the caller must skip the optimizer step on
/// every rank (the trainer does so by poisoning the global gradient norm). The remaining
/// collectives of the step are still issued, so the peers never wait in vain.
class GradientSync {
 public:
  /// `compress_dp`: whether this stage compresses its DP gradients; nullopt = stage_compresses_dp() for the stage
  /// (required for dp_stages: auto, which the caller resolves: std::invalid_argument otherwise).
  GradientSync(const Config& cfg, GptModel& model, Communicator* dp, Communicator* embedding,
               Communicator* fused_embedding, int stage, std::optional<bool> compress_dp = std::nullopt);

  /// `loss_scale`: the fp16 loss scale S of the step (1 otherwise); the gradients are already
  /// unscaled, a 16-bit uncompressed wire carries them times S (see above).
  bool reduce(const std::vector<torch::Tensor>& params, int64_t step, double loss_scale = 1.0);
  /// The largest |local gradient · S| this stage's DP wire carries (NoneReducer::
  /// wire_overflow_limit; infinity unless an fp16 uncompressed wire): the trainer's overflow check
  /// counts a larger value as an overflow, before any reduction.
  double wire_overflow_limit() const;

  bool compresses_dp() const { return compress_dp_; }
  bool fused() const { return fused_; }
  GradReducer& dp_reducer() { return *dp_reducer_; }
  GradReducer* embedding_reducer() { return embedding_reducer_.get(); }
  /// Checkpoint parts of the stateful reducers ("dp_reducer", "embedding_reducer"). Each reducer
  /// knows its tensors by parameter name and shape (the DP list without the word embedding under
  /// FE; the word embedding alone), so loading state kept for another list (e.g. FE switched)
  /// throws StateMismatch naming the first difference (GradReducer::save).
  std::vector<CheckpointPart> checkpoint_parts();
  /// The gradients handed to the DP reducer, by parameter name (for records()).
  const std::vector<std::string>& dp_tensor_names() const { return dp_names_; }

 private:
  GptModel& model_;
  Communicator* dp_;
  Communicator* embedding_;
  Communicator* fused_embedding_;
  int64_t dp_size_;
  bool fused_;
  bool local_replica_;  // dp_strategy: diloco, no DP reduction
  bool compress_dp_;
  std::unique_ptr<GradReducer> dp_reducer_;
  NoneReducer* uncompressed_ = nullptr;  // dp_reducer_ when this stage reduces uncompressed
  std::unique_ptr<GradReducer> embedding_reducer_;  // null: plain sum
  std::vector<std::string> dp_names_;
  std::vector<std::string> all_names_;
};

/// Step 3. sqrt of the sum of squared gradients of the whole model: sharded parameters count on
/// every TP rank, TP-replicated ones (LayerNorm, position embedding, row-parallel biases) on TP rank
/// 0 only, and the last stage's copy of the word embedding not at all when pp > 1 (it equals stage
/// 0's). All-reduced over `model_parallel` (null = this rank alone). Same value on every rank.
/// One host synchronisation (sum_of_squares), whatever the number of parameters.
double global_grad_norm(GptModel& model, Communicator* model_parallel, int tp_rank, int stages);

/// Σ over `grads` (defined ones) of Σ g², each tensor's sum in its own dtype (ATen's sum), the
/// tensors' sums added in double in list order on the host: the value a loop of
/// `g.pow(2).sum().item<double>()` gives, with one host synchronisation instead of one per tensor.
double sum_of_squares(const std::vector<torch::Tensor>& grads);

/// Scales every gradient by max_norm / (norm + 1e-6) when norm > max_norm > 0 (one multi-tensor
/// operation).
void clip_grads_to(const std::vector<torch::Tensor>& params, double norm, double max_norm);

}  // namespace optcc

// Tensor parallelism, Megatron-LM style: four conjugate autograd mappings and the layers built on
// them. t = tp->size() ranks of one TP group each hold 1/t of every sharded weight; activations
// are either replicated (same full tensor on every TP rank) or split along the last dim.
//
//   mapping                 forward                        backward
//   copy_to_tp_region       identity                       all-reduce(sum)
//   reduce_from_tp_region   all-reduce(sum)                identity
//   scatter_to_tp_region    keep own 1/t of the last dim   all-gather along the last dim
//   gather_from_tp_region   all-gather along the last dim  keep own 1/t of the last dim
//
// Contract shared by everything here:
// - `tp` may be null or a group of one rank: then every mapping returns its input (no autograd
//   node, no traffic) and the layers are plain unsharded layers.
// - Every function and every layer forward that communicates is COLLECTIVE over the TP group: all
//   ranks of the group call it, in the same order, with same-shaped tensors; the backward passes
//   communicate too, so all TP ranks also run backward over the same graph.
// - `*tp` must outlive the autograd graph (backward uses it). Traffic is Traffic::kTensorParallel.
// - Shards are contiguous blocks in group-rank order: rank r holds [r*n/t, (r+1)*n/t).
//
// Initialisation: each layer draws the FULL weight from its own generator (seed, tag) with
// init_full_normal below, then keeps its shard, so every TP size starts from the same model and
// matches the unsharded GPT (models/gpt.cpp with no TP group: t = 1) bit for bit.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "harness/parallel/communicator.h"

namespace optcc {

/// A tensor of `sizes` fp32 ~ N(0, std) from the generator seeded with seed * 1000003 + tag: the
/// one draw of every GPT weight, sharded or not (models/gpt.cpp's position embedding too). No grad.
torch::Tensor init_full_normal(torch::IntArrayRef sizes, double std, uint64_t seed, uint64_t tag);

inline int tp_size(const Communicator* tp) { return tp ? tp->size() : 1; }
inline int tp_rank(const Communicator* tp) { return tp ? tp->rank() : 0; }

// --- Mappings (any float dtype, any shape unless stated) -------------------------------------
/// [.., n] replicated -> same; grad summed over the TP group.
torch::Tensor copy_to_tp_region(const torch::Tensor& x, Communicator* tp);
/// [.., n] partial sums -> [.., n] their sum over the group; grad passed through.
torch::Tensor reduce_from_tp_region(const torch::Tensor& x, Communicator* tp);
/// [.., n] replicated -> [.., n/t] this rank's slice (contiguous). REQUIRES n % t == 0.
torch::Tensor scatter_to_tp_region(const torch::Tensor& x, Communicator* tp);
/// [.., n/t] per rank -> [.., n] concatenated in group-rank order.
torch::Tensor gather_from_tp_region(const torch::Tensor& x, Communicator* tp);

// --- Layers ----------------------------------------------------------------------------------
/// How one parameter of a layer below is laid out over the TP group: what merging a checkpoint's
/// shards into one model and cutting it into another layout need (models/sharding.h). dim < 0:
/// replicated (every TP rank holds the whole tensor); else split into t contiguous blocks along
/// `dim`, group rank r holding block r (the `own_shard` of the constructors). vocab_padded: dim 0
/// runs over the padded vocabulary, whose rows >= the true vocabulary are padding (BR-15).
struct TpSplit {
  int64_t dim = -1;
  bool vocab_padded = false;
};

/// A parameter in another dtype, made once per change of the parameter rather than at every use. In
/// mixed precision the fp32 master weights change only at the optimizer step (each in-place update
/// bumps the tensor's version counter), so the linear layers cast them once per step, not once per
/// micro-batch: a stage with m micro-batches reads and writes its weights m times less for casts. The
/// cast keeps its autograd edge to the parameter (its backward holds no tensors, so every micro-batch's
/// backward may pass through it and accumulate into the fp32 gradient, bit for bit as separate casts
/// would). A cast made with grad mode off is not handed out with it on, nor the reverse. Holds one cast
/// copy of the parameter (e.g. bf16: half its bytes) between steps. Not thread-safe: one module, one thread.
class CastCache {
 public:
  /// `param` itself when it already has x's dtype (or is undefined), else its cast to x's dtype.
  torch::Tensor like(const torch::Tensor& param, const torch::Tensor& x);
  /// `param` in `dtype`, as like().
  torch::Tensor as(const torch::Tensor& param, c10::ScalarType dtype);
  /// Casts made on this thread so far, by every CastCache (for tests: once per step, not per micro-batch).
  static int64_t casts_made();

 private:
  const c10::TensorImpl* impl_ = nullptr;
  int64_t version_ = -1;
  c10::ScalarType dtype_ = c10::ScalarType::Undefined;
  bool grad_mode_ = false;
  torch::Tensor cast_;
};

/// Both linear layers compute in x's dtype: their fp32 weight and bias are cast to it where used
/// (mixed precision; fp32 x: no cast; once per optimizer step, CastCache), and the gradients return
/// fp32 to the parameters.
///
/// y = x W^T + b with W's output rows split over the group (Megatron ColumnParallelLinear).
/// Input x [.., in] replicated; output [.., out/t] (or [.., out] replicated if gather_output).
/// REQUIRES out % t == 0.
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(int64_t in, int64_t out, Communicator* tp, bool gather_output, double std,
                           uint64_t seed, uint64_t tag);
  torch::Tensor forward(const torch::Tensor& x);
  /// "weight": rows (dim 0); "bias": dim 0. Throws std::invalid_argument for another name.
  static TpSplit split_of(const std::string& parameter);
  torch::Tensor weight;  // [out/t, in] fp32: rows [r*out/t, (r+1)*out/t) of the full weight
  torch::Tensor bias;    // [out/t] fp32, zero-initialised
 private:
  Communicator* tp_;
  bool gather_output_;
  CastCache weight_cast_, bias_cast_;
};
TORCH_MODULE(ColumnParallelLinear);

/// y = x W^T + b with W's input columns split over the group (Megatron RowParallelLinear).
/// Input [.., in/t] if input_is_parallel, else [.., in] replicated (scattered here); output
/// [.., out] replicated. REQUIRES in % t == 0.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t in, int64_t out, Communicator* tp, bool input_is_parallel, double std,
                        uint64_t seed, uint64_t tag);
  torch::Tensor forward(const torch::Tensor& x);
  /// "weight": columns (dim 1); "bias": replicated. Throws std::invalid_argument for another name.
  static TpSplit split_of(const std::string& parameter);
  torch::Tensor weight;  // [out, in/t] fp32: columns [r*in/t, (r+1)*in/t) of the full weight
  torch::Tensor bias;    // [out] fp32, zero; added after the reduction, replicated on all TP ranks
 private:
  Communicator* tp_;
  bool input_is_parallel_;
  CastCache weight_cast_, bias_cast_;
};
TORCH_MODULE(RowParallelLinear);

/// Word embedding with rows split over the group. REQUIRES padded_vocab % t == 0 (pad the
/// vocabulary to a multiple of t first, BR-15). forward(tokens [..] int64 in [0, padded_vocab))
/// -> [.., hidden] fp32 replicated: each rank looks up the tokens in its rows, zeroes the rest,
/// and the group sums.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(int64_t padded_vocab, int64_t hidden, Communicator* tp, double std, uint64_t seed,
                             uint64_t tag);
  /// tokens [..] int64 -> rows [.., hidden] in output_dtype() (fp32 unless set), summed over TP.
  torch::Tensor forward(const torch::Tensor& tokens);
  /// Mixed precision: the rows are gathered from the fp32 weight and cast to `dtype` before the TP
  /// all-reduce (so it carries the compute dtype). Default Float: no cast.
  void set_output_dtype(c10::ScalarType dtype) { output_dtype_ = dtype; }
  c10::ScalarType output_dtype() const { return output_dtype_; }
  int64_t vocab_start() const { return start_; }  // first global row held here
  int64_t vocab_end() const { return end_; }      // one past the last
  /// "weight": rows (dim 0) of the padded vocabulary. Throws std::invalid_argument otherwise.
  static TpSplit split_of(const std::string& parameter);
  /// The weight in `dtype` for the tied output layer's logits (CastCache: once per optimizer step).
  torch::Tensor weight_as(c10::ScalarType dtype) { return weight_cast_.as(weight, dtype); }
  torch::Tensor weight;                           // [Vp/t, hidden] fp32: rows [start, end)
 private:
  CastCache weight_cast_;
  Communicator* tp_;
  int64_t start_, end_;
  c10::ScalarType output_dtype_ = c10::ScalarType::Float;
};
TORCH_MODULE(VocabParallelEmbedding);

/// Per-token cross-entropy (nats) over a vocabulary split by columns.
/// logits_local [.., Vp/t] fp32: global columns [vocab_start, vocab_start + Vp/t) of the logits.
/// labels [..] int64 in [0, true_vocab) (same shape as logits_local without its last dim).
/// Columns with global index >= true_vocab are padding and excluded from the softmax (-inf), so
/// the loss equals cross_entropy over the true vocabulary for every t (BR-15).
/// Returns [..] fp32, identical on every TP rank. Backward: d logits_local = (softmax - onehot) *
/// grad, local to each shard (0 on padded columns). Collective: three all-reduces of [N] floats.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits_local, const torch::Tensor& labels,
                                           int64_t vocab_start, int64_t true_vocab, Communicator* tp);

/// Tied output layer: x [.., h] replicated, word_embedding_local [Vp/t, h] -> logits [.., Vp/t]
/// (this rank's vocabulary columns). x's gradient is summed over the group (copy_to_tp_region).
torch::Tensor parallel_lm_logits(const torch::Tensor& x, const torch::Tensor& word_embedding_local,
                                 Communicator* tp);

}  // namespace optcc

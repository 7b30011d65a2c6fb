// Megatron-style GPT: learned absolute positions, pre-LayerNorm blocks, causal self-attention,
// GeLU MLP of 4h, final LayerNorm, word embedding tied with the output layer.
//
// One GptModel holds what one rank owns under tensor x pipeline parallelism:
//   * layers [first_layer, first_layer + num_stage_layers) of the model (a pipeline stage);
//   * the word + position embeddings if it is the first stage;
//   * the final LayerNorm and the tied output layer if it is the last stage. When the model has
//     more than one stage, the last stage holds its own copy of the word embedding, initialised
//     equal to stage 0's (docs/design.md §1.2) and kept equal by the embedding-gradient sync;
//   * of each of those, this tensor-parallel rank's shard (models/tensor_parallel.h): QKV and fc1
//     are column-parallel (whole heads per rank), attention proj and fc2 row-parallel, the word
//     embedding vocab-parallel, the loss vocab-parallel cross-entropy over the true vocabulary.
// With tp == nullptr and the default stage range it is the whole single-rank model.
//
// Layout follows Megatron-LM: activations between blocks are sequence-first [s, b, h] (fp32, or the
// compute dtype under mixed precision: GptOptions::compute_dtype), so the
// tensors that cross pipeline stages have the layout Optimus-CC's compressor expects (docs/design.md §1.4).
// The model makes no communication calls itself: all of it goes through the TP mapping functions.
//
// Initialisation is deterministic from `seed` and independent of thread count and layout: every
// weight is drawn in full from its own generator (seed, tag) and then sharded; N(0, init_std), with
// the residual output projections (attention proj, MLP fc2) at init_std / sqrt(2 * num_layers).
// Biases are zero, LayerNorm is (1, 0).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "models/tensor_parallel.h"

namespace optcc {

/// How attention computes softmax(q k^T / sqrt(d) + causal mask) v (config key model.attention):
///   kExplicit  two batched GEMMs around a masked softmax (fp32 under mixed precision): the [b,
///              heads, s, s] scores are written and read; attention dropout masks come from the TP
///              rank's host generator, so they are the same on every device and layout.
///   kFused     ATen's fused kernel (LibTorch >= 2.0; flash attention on CUDA): no score matrix in
///              memory; no attention dropout (refused with model.attention_dropout > 0).
///   kAuto      kFused on a GPU where the build has it and no attention dropout is drawn (dropout 0,
///              or evaluation), kExplicit otherwise (CPU ranks keep the explicit path, whose GEMMs
///              run on oneDNN).
enum class AttentionKernel { kAuto, kExplicit, kFused };
/// The config spellings, in enum order: "auto", "explicit", "fused".
const std::vector<std::string>& attention_kernel_names();
/// Throws std::invalid_argument naming the spellings.
AttentionKernel attention_kernel(const std::string& name);
const std::string& attention_kernel_name(AttentionKernel k);
/// The kernel a forward pass uses: kExplicit or kFused (kAuto resolved as above).
AttentionKernel attention_kernel_used(AttentionKernel k, bool on_gpu, double attention_dropout, bool training);

struct GptOptions {
  int64_t num_layers = 2;           // L of the whole model
  int64_t hidden_size = 64;         // h
  int64_t num_heads = 2;
  int64_t seq_len = 64;             // s
  int64_t max_positions = 64;       // rows of the position embedding (>= seq_len)
  int64_t vocab_size = 128;         // true vocabulary V; the loss covers only [0, V)
  int64_t padded_vocab_size = 128;  // rows of the word embedding (BR-15); multiple of the TP size
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  double init_std = 0.02;
  uint64_t seed = 1234;
  /// Dtype of the compute (models/precision.h): Float (the default) leaves every tensor fp32, as
  /// before mixed precision existed. BFloat16 / Half: the parameters stay fp32 (master weights)
  /// and are cast to it where used, so their gradients come back fp32; the embedding output,
  /// residual stream, linear layers and attention matmuls run in it, and the activations between
  /// stages ([s, b, h]) and the TP all-reduces carry it; LayerNorm, softmax, the logits' cross-
  /// entropy and head_logits() run in fp32 (upcast, then cast back).
  c10::ScalarType compute_dtype = c10::ScalarType::Float;
  AttentionKernel attention = AttentionKernel::kAuto;  // model.attention
};

/// Which part of the model this rank holds (a pipeline stage). Default: all of it.
/// Interleaved 1F1B (chunks = v > 1): the stage holds v model chunks of num_layers layers each, chunk c
/// starting at layer first_layer + c * chunk_stride (stage k of p: first_layer = k * num_layers,
/// chunk_stride = p * num_layers, so chunk c is virtual stage c * p + k). Its blocks are numbered
/// chunk-major: block i is chunk i / num_layers.
struct StageRange {
  int64_t first_layer = 0;
  int64_t num_layers = -1;  // per chunk; -1 = all layers from first_layer (one chunk only)
  bool is_first = true;     // holds the embeddings (chunk 0 runs them)
  bool is_last = true;      // holds final LayerNorm + output layer (the last chunk runs them)
  int64_t chunks = 1;       // model chunks (parallel.virtual_stages)
  int64_t chunk_stride = 0; // whole-model layers from one chunk's first layer to the next's
  /// The whole-model layer of this stage's block `block` (0 .. chunks * num_layers - 1).
  int64_t layer_of(int64_t block) const {
    return first_layer + (block / num_layers) * chunk_stride + block % num_layers;
  }
};

/// Causal multi-head self-attention on [s, b, h]; this TP rank computes heads/t heads.
/// Attention-probability dropout draws from `rng`, a generator private to this TP rank (Megatron's
/// model-parallel RNG): different head shards get independent masks. Everything else (hidden
/// dropout) uses LibTorch's default generator, seeded identically on all ranks, because those
/// activations are replicated across TP ranks and must get the same mask.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const GptOptions& o, int64_t layer, Communicator* tp, at::Generator rng);
  torch::Tensor forward(const torch::Tensor& x);  // [s, b, h] -> [s, b, h] (replicated over TP)
  ColumnParallelLinear qkv{nullptr};               // weight [3h/t, h], rows as [heads/t, 3, head_dim]
  RowParallelLinear proj{nullptr};                 // weight [h, h/t]
 private:
  int64_t local_heads_, head_dim_;
  double dropout_;
  AttentionKernel kernel_;
  at::Generator rng_;
  torch::Tensor causal_mask_;  // [s, s] bool, true above the diagonal (future positions)
};
TORCH_MODULE(CausalSelfAttention);

/// Position-wise MLP: h -> 4h -> GeLU -> h (4h split over TP).
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const GptOptions& o, int64_t layer, Communicator* tp);
  torch::Tensor forward(const torch::Tensor& x);  // [s, b, h] -> [s, b, h]
  ColumnParallelLinear fc1{nullptr};               // weight [4h/t, h]
  RowParallelLinear fc2{nullptr};                  // weight [h, 4h/t]
};
TORCH_MODULE(Mlp);

/// Pre-LayerNorm transformer block: x + drop(attn(ln1(x))), then + drop(mlp(ln2(.))).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GptOptions& o, int64_t layer, Communicator* tp, at::Generator attention_rng);
  torch::Tensor forward(const torch::Tensor& x);  // [s, b, h] -> [s, b, h]
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
 private:
  double dropout_;
};
TORCH_MODULE(Block);

class GptModelImpl : public torch::nn::Module {
 public:
  /// `tp` (may be null) must outlive the model. Throws c10::Error on inconsistent options.
  explicit GptModelImpl(const GptOptions& o, Communicator* tp = nullptr, StageRange stage = {});

  /// First stage: tokens [b, s] int64 -> hidden [s, b, h] in the compute dtype.
  torch::Tensor embed(const torch::Tensor& tokens);
  /// This stage's blocks of model chunk `chunk` (0 .. stage().chunks - 1): [s, b, h] -> [s, b, h].
  torch::Tensor run_layers(torch::Tensor x, int64_t chunk = 0);
  /// Last stage: hidden [s, b, h] and labels [b, s] int64 -> mean cross-entropy (nats), fp32 scalar.
  /// Its backward computes the output layer's weight gradient even under a WeightGradDeferral
  /// (kernels/gemm.h: the logits' gradient is too large to hold until W).
  /// At TP 1, logits larger than kPlainLogitsBytes in fp32 go through chunked_lm_cross_entropy
  /// (models/chunked_loss.h: never all fp32 logits at once); else the plain cross-entropy.
  torch::Tensor head_loss(const torch::Tensor& x, const torch::Tensor& labels);
  /// Last stage: hidden [s, b, h] -> fp32 logits [s, b, V] over the true vocabulary (padding dropped),
  /// gathered over the TP group (collective over it: every TP rank calls it).
  torch::Tensor head_logits(const torch::Tensor& x);
  /// Whole model only (first and last stage): tokens [b, s] -> logits [s, b, V] (padding dropped).
  torch::Tensor forward(const torch::Tensor& tokens);
  /// Whole model only: samples [b, s + 1] int64 -> mean next-token cross-entropy (nats).
  torch::Tensor loss(const torch::Tensor& samples);

  const GptOptions& options() const { return opt_; }
  const StageRange& stage() const { return stage_; }
  /// This TP rank's attention-dropout generator (seeded from seed, tp rank); checkpoints save it.
  at::Generator attention_generator() const { return attention_rng_; }
  /// The word-embedding shard [Vp/t, h] (first stage: input embedding; last stage: output layer),
  /// or an undefined tensor on middle stages.
  torch::Tensor word_embedding() const;

  VocabParallelEmbedding embedding{nullptr};  // first and last stages
  torch::Tensor position_embedding;           // [max_positions, h], first stage only
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm final_ln{nullptr};     // last stage only

 private:
  GptOptions opt_;
  StageRange stage_;
  Communicator* tp_;
  at::Generator attention_rng_;
};
TORCH_MODULE(GptModel);

/// True for parameters that take no weight decay: biases and LayerNorm weights (by name).
bool is_no_decay_parameter(const std::string& name);

/// True for parameters replicated (not sharded) across TP ranks: LayerNorms, position embedding,
/// row-parallel biases. The global gradient norm counts them on TP rank 0 only.
bool is_tp_replicated_parameter(const std::string& name);

/// Model FLOPs of one training step (forward + backward = 3x forward, no recomputation) for
/// `sequences` samples, Megatron's count: 3 * sequences * s * (24 L h^2 + 4 L s h + 2 h V).
/// The attention term counts the full s x s score matrix, as Megatron-LM and the paper do.
double gpt_train_flops(const GptOptions& o, int64_t sequences);

/// Number of parameters held by this model object (this rank's shards).
int64_t count_parameters(GptModel& model);

}  // namespace optcc

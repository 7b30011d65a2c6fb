// Megatron-style GPT (single rank): learned absolute positions, pre-LayerNorm blocks, causal
// self-attention, GeLU MLP of 4h, final LayerNorm, word embedding tied with the output layer.
//
// Layout follows Megatron-LM: activations between blocks are sequence-first [s, b, h] fp32, so the
// tensors that later cross pipeline stages have the layout Optimus-CC's compressor expects
// (optimus-cc-spec.md §1.4, §2.3). The QKV weight rows are grouped per head ([heads, 3, head_dim]),
// so a contiguous row shard holds whole heads, as tensor parallelism needs.
//
// Initialisation is deterministic from `GptOptions::seed` and independent of the thread count:
// every weight is drawn from its own generator in a fixed order (see gpt.cpp), N(0, init_std), with
// the residual output projections (attention proj, MLP fc2) at init_std / sqrt(2 * num_layers)
// (GPT-2 / Megatron scaled init). Biases are zero, LayerNorm is (1, 0).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace optcc {

struct GptOptions {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;         // h
  int64_t num_heads = 2;
  int64_t seq_len = 64;             // s
  int64_t max_positions = 64;       // rows of the position embedding (>= seq_len)
  int64_t vocab_size = 128;         // true vocabulary V; logits cover only [0, V)
  int64_t padded_vocab_size = 128;  // rows of the word embedding (BR-15 padding); >= vocab_size
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  double init_std = 0.02;
  uint64_t seed = 1234;
};

/// Causal multi-head self-attention on [s, b, h].
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptOptions& o);
  torch::Tensor forward(const torch::Tensor& x);  // [s, b, h] -> [s, b, h]
  torch::nn::Linear qkv{nullptr};                 // weight [3h, h], rows as [heads, 3, head_dim]
  torch::nn::Linear proj{nullptr};                // weight [h, h]
 private:
  int64_t heads_, head_dim_;
  double dropout_;
  torch::Tensor causal_mask_;  // [s, s] bool, true above the diagonal (future positions)
};
TORCH_MODULE(CausalSelfAttention);

/// Position-wise MLP: h -> 4h -> GeLU -> h.
class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const GptOptions& o);
  torch::Tensor forward(const torch::Tensor& x);  // [s, b, h] -> [s, b, h]
  torch::nn::Linear fc1{nullptr};                 // weight [4h, h]
  torch::nn::Linear fc2{nullptr};                 // weight [h, 4h]
};
TORCH_MODULE(Mlp);

/// Pre-LayerNorm transformer block: x + drop(attn(ln1(x))), then + drop(mlp(ln2(.))).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptOptions& o);
  torch::Tensor forward(const torch::Tensor& x);  // [s, b, h] -> [s, b, h]
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
 private:
  double dropout_;
};
TORCH_MODULE(Block);

/// The whole model on one rank.
class GptModelImpl : public torch::nn::Module {
 public:
  explicit GptModelImpl(const GptOptions& o);
  /// tokens [b, s] int64 -> logits [s, b, V] fp32 (padded vocabulary rows excluded).
  torch::Tensor forward(const torch::Tensor& tokens);
  /// Mean next-token cross-entropy (nats) of a batch of samples [b, s + 1] int64: inputs are
  /// samples[:, :-1], labels samples[:, 1:]. Returns a scalar fp32 tensor with grad.
  torch::Tensor loss(const torch::Tensor& samples);
  const GptOptions& options() const { return opt_; }

  torch::Tensor word_embedding;      // [V_padded, h]; also the output layer (tied)
  torch::Tensor position_embedding;  // [max_positions, h]
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm final_ln{nullptr};

 private:
  GptOptions opt_;
};
TORCH_MODULE(GptModel);

/// True for parameters that take no weight decay: biases and LayerNorm weights (by name).
bool is_no_decay_parameter(const std::string& name);

/// Model FLOPs of one training step (forward + backward = 3x forward, no recomputation) for
/// `sequences` samples, Megatron's count: 3 * sequences * s * (24 L h^2 + 4 L s h + 2 h V).
/// The attention term counts the full s x s score matrix, as Megatron-LM and the paper do.
double gpt_train_flops(const GptOptions& o, int64_t sequences);

/// Number of parameters (word embedding counted once).
int64_t count_parameters(GptModel& model);

}  // namespace optcc

#include "models/gpt.h"

#include "compat/fused_attention.h"
#include "models/chunked_loss.h"
#include "models/flops.h"
#include "kernels/gemm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace optcc {
namespace {

namespace F = torch::nn::functional;

// Init tags: 1 word embedding, 2 position embedding, 100 + 8 * layer + {0 qkv, 1 proj, 2 fc1, 3 fc2}.
constexpr uint64_t kWordEmbeddingTag = 1;
constexpr uint64_t kPositionEmbeddingTag = 2;
uint64_t layer_tag(int64_t layer, int64_t which) { return 100 + static_cast<uint64_t>(layer) * 8 + which; }

double out_std(const GptOptions& o) { return o.init_std / std::sqrt(2.0 * o.num_layers); }

torch::nn::LayerNorm layer_norm(int64_t h) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({h}).eps(1e-5));
}

// LayerNorm in fp32 whatever the compute dtype (Megatron's mixed precision); fp32 input: unchanged.
torch::Tensor norm_fp32(torch::nn::LayerNorm& ln, const torch::Tensor& x) {
  if (x.scalar_type() == torch::kFloat) return ln(x);
  return ln(x.to(torch::kFloat)).to(x.scalar_type());
}

torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return p > 0 ? F::dropout(x, F::DropoutFuncOptions().p(p).training(training)) : x;
}

// Dropout with an explicit generator: keep with probability 1 - p, scale by 1 / (1 - p). The
// generator is a CPU one (the same masks on every device and TP layout): on a GPU the mask is
// drawn on the host and copied.
torch::Tensor dropout_with(const torch::Tensor& x, double p, bool training, at::Generator& gen) {
  if (!(p > 0) || !training) return x;
  auto keep = x.is_cpu() ? torch::empty_like(x).bernoulli_(1.0 - p, gen)
                         : torch::empty(x.sizes(), x.options().device(torch::kCPU)).bernoulli_(1.0 - p, gen).to(x.device());
  return x * keep * (1.0 / (1.0 - p));
}

}  // namespace

const std::vector<std::string>& attention_kernel_names() {
  static const std::vector<std::string> names{"auto", "explicit", "fused"};
  return names;
}

AttentionKernel attention_kernel(const std::string& name) {
  const auto& names = attention_kernel_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<AttentionKernel>(i);
  }
  throw std::invalid_argument("unknown attention kernel '" + name + "' (auto, explicit or fused)");
}

const std::string& attention_kernel_name(AttentionKernel k) { return attention_kernel_names().at(static_cast<size_t>(k)); }

AttentionKernel attention_kernel_used(AttentionKernel k, bool on_gpu, double attention_dropout, bool training) {
  if (k != AttentionKernel::kAuto) return k;
  const bool draws_dropout = training && attention_dropout > 0;
  return kHasFusedAttention && on_gpu && !draws_dropout ? AttentionKernel::kFused : AttentionKernel::kExplicit;
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptOptions& o, int64_t layer, Communicator* tp,
                                                 at::Generator rng)
    : local_heads_(o.num_heads / tp_size(tp)), head_dim_(o.hidden_size / o.num_heads), dropout_(o.attention_dropout),
      kernel_(o.attention), rng_(std::move(rng)) {
  TORCH_CHECK(o.num_heads % tp_size(tp) == 0, "num_heads ", o.num_heads, " not divisible by TP size ", tp_size(tp));
  TORCH_CHECK(o.attention != AttentionKernel::kFused || o.attention_dropout == 0,
              "fused attention draws no attention dropout, but attention_dropout is ", o.attention_dropout);
  const int64_t h = o.hidden_size;
  qkv = register_module("qkv", ColumnParallelLinear(h, 3 * h, tp, false, o.init_std, o.seed, layer_tag(layer, 0)));
  proj = register_module("proj", RowParallelLinear(h, h, tp, true, out_std(o), o.seed, layer_tag(layer, 1)));
  causal_mask_ = torch::ones({o.seq_len, o.seq_len}, torch::kBool).triu(1);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t s = x.size(0), b = x.size(1);
  // [s, b, 3h/t] -> [s, b, heads/t, 3, hd] -> q, k, v each [b, heads/t, s, hd]
  // unbind, not three selects: its backward stacks the three gradients into one tensor, where each
  // select's would zero a full-size gradient and the three be added.
  const auto qkv3 = qkv(x).view({s, b, local_heads_, 3, head_dim_}).permute({3, 1, 2, 0, 4}).unbind(0);
  if (attention_kernel_used(kernel_, x.is_cuda(), dropout_, is_training()) == AttentionKernel::kFused) {
    const auto ctx = fused_causal_attention(qkv3[0], qkv3[1], qkv3[2]);  // [b, heads/t, s, hd]
    return proj(ctx.permute({2, 0, 1, 3}).reshape({s, b, local_heads_ * head_dim_}));
  }
  auto q = qkv3[0] * (1.0 / std::sqrt(static_cast<double>(head_dim_)));
  auto scores = gemm_bmm(q, qkv3[1].transpose(-2, -1));  // [b, heads/t, s, s]
  if (causal_mask_.device() != x.device()) causal_mask_ = causal_mask_.to(x.device());  // not a buffer: moved once here
  const auto mask = s == causal_mask_.size(0) ? causal_mask_
                                              : torch::ones({s, s}, torch::TensorOptions(torch::kBool).device(x.device())).triu(1);
  scores.masked_fill_(mask, -std::numeric_limits<float>::infinity());
  // Softmax in fp32 under mixed precision, its probabilities cast back for the second matmul.
  auto soft = scores.scalar_type() == torch::kFloat ? torch::softmax(scores, -1)
                                                     : torch::softmax(scores, -1, torch::kFloat).to(scores.scalar_type());
  auto probs = dropout_with(soft, dropout_, is_training(), rng_);
  auto ctx = gemm_bmm(probs, qkv3[2]);                                          // [b, heads/t, s, hd]
  ctx = ctx.permute({2, 0, 1, 3}).reshape({s, b, local_heads_ * head_dim_});  // [s, b, h/t]
  return proj(ctx);
}

MlpImpl::MlpImpl(const GptOptions& o, int64_t layer, Communicator* tp) {
  const int64_t h = o.hidden_size;
  fc1 = register_module("fc1", ColumnParallelLinear(h, 4 * h, tp, false, o.init_std, o.seed, layer_tag(layer, 2)));
  fc2 = register_module("fc2", RowParallelLinear(4 * h, h, tp, true, out_std(o), o.seed, layer_tag(layer, 3)));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) { return fc2(torch::gelu(fc1(x))); }

BlockImpl::BlockImpl(const GptOptions& o, int64_t layer, Communicator* tp, at::Generator attention_rng)
    : dropout_(o.hidden_dropout) {
  ln1 = register_module("ln1", layer_norm(o.hidden_size));
  attn = register_module("attn", CausalSelfAttention(o, layer, tp, std::move(attention_rng)));
  ln2 = register_module("ln2", layer_norm(o.hidden_size));
  mlp = register_module("mlp", Mlp(o, layer, tp));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto y = x + maybe_dropout(attn(norm_fp32(ln1, x)), dropout_, is_training());
  return y + maybe_dropout(mlp(norm_fp32(ln2, y)), dropout_, is_training());
}

GptModelImpl::GptModelImpl(const GptOptions& o, Communicator* tp, StageRange stage)
    : opt_(o), stage_(stage), tp_(tp),
      attention_rng_(at::detail::createCPUGenerator(o.seed * 1000003ULL + 2718 + static_cast<uint64_t>(tp_rank(tp)))) {
  TORCH_CHECK(o.padded_vocab_size >= o.vocab_size, "padded_vocab_size < vocab_size");
  TORCH_CHECK(o.max_positions >= o.seq_len, "max_positions < seq_len");
  if (stage_.num_layers < 0) {
    TORCH_CHECK(stage_.chunks == 1, "a stage of ", stage_.chunks, " model chunks needs num_layers per chunk");
    stage_.num_layers = o.num_layers - stage_.first_layer;
  }
  TORCH_CHECK(stage_.chunks >= 1 && (stage_.chunks == 1 || stage_.chunk_stride >= stage_.num_layers),
              "stage of ", stage_.chunks, " chunks with chunk_stride ", stage_.chunk_stride, " < num_layers ",
              stage_.num_layers, " (chunks would overlap)");
  const int64_t last_layer =
      stage_.num_layers == 0 ? stage_.first_layer : stage_.layer_of(stage_.chunks * stage_.num_layers - 1) + 1;
  TORCH_CHECK(stage_.first_layer >= 0 && last_layer <= o.num_layers,
              "stage layers [", stage_.first_layer, ", ", last_layer, ") outside the model's ", o.num_layers, " layers");
  if (stage_.is_first || stage_.is_last) {
    embedding = register_module("embedding", VocabParallelEmbedding(o.padded_vocab_size, o.hidden_size, tp,
                                                                    o.init_std, o.seed, kWordEmbeddingTag));
    embedding->set_output_dtype(o.compute_dtype);
  }
  if (stage_.is_first) {
    position_embedding = register_parameter(
        "position_embedding", init_full_normal({o.max_positions, o.hidden_size}, o.init_std, o.seed, kPositionEmbeddingTag));
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < stage_.chunks * stage_.num_layers; ++i) {
    blocks->push_back(Block(o, stage_.layer_of(i), tp, attention_rng_));
  }
  if (stage_.is_last) final_ln = register_module("final_ln", layer_norm(o.hidden_size));
}

torch::Tensor GptModelImpl::word_embedding() const { return embedding ? embedding->weight : torch::Tensor(); }

torch::Tensor GptModelImpl::embed(const torch::Tensor& tokens) {
  TORCH_CHECK(stage_.is_first, "embed() called on a stage without the embedding");
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
              "GptModel::embed expects int64 tokens [b, s], got ", tokens.sizes());
  const int64_t s = tokens.size(1);
  TORCH_CHECK(s <= opt_.max_positions, "sequence length ", s, " exceeds max_positions ", opt_.max_positions);
  // The word-embedding rows arrive in the compute dtype (summed over TP in it); the position
  // embedding is added in fp32, then the sum is cast (nothing changes under fp32).
  auto words = embedding(tokens.t());
  auto positions = position_embedding.narrow(0, 0, s).unsqueeze(1);
  auto x = words.scalar_type() == torch::kFloat ? words + positions
                                                : (words.to(torch::kFloat) + positions).to(opt_.compute_dtype);  // [s, b, h]
  return maybe_dropout(x, opt_.hidden_dropout, is_training());
}

torch::Tensor GptModelImpl::run_layers(torch::Tensor x, int64_t chunk) {
  TORCH_CHECK(chunk >= 0 && chunk < stage_.chunks, "run_layers: chunk ", chunk, " of a stage with ", stage_.chunks,
              " chunks");
  for (int64_t i = chunk * stage_.num_layers; i < (chunk + 1) * stage_.num_layers; ++i) {
    x = blocks->ptr(i)->as<Block>()->forward(x);
  }
  return x;
}

torch::Tensor GptModelImpl::head_loss(const torch::Tensor& x, const torch::Tensor& labels) {
  TORCH_CHECK(stage_.is_last, "head_loss() called on a stage without the output layer");
  const WeightGradDeferralPause whole_backward;  // the output layer's weight gradient stays in B (gemm.h)
  // Mixed precision: the logits GEMM in the compute dtype, the cross-entropy on fp32 logits.
  auto h = norm_fp32(final_ln, x);
  if (tp_size(tp_) == 1) {  // one rank: the GEMM over all padded rows (aligned), the softmax over the true vocabulary
    const auto weight = embedding->weight_as(h.scalar_type());  // [Vp, h], Vp a multiple of 128
    const int64_t rows = h.numel() / h.size(-1), vp = weight.size(0);
    if (rows * vp * 4 > kPlainLogitsBytes) {  // large logits: never all of them in fp32 at once
      return chunked_lm_cross_entropy(h.reshape({rows, h.size(-1)}), weight, labels.t().reshape({-1}), opt_.vocab_size,
                                      chunked_loss_rows(vp));
    }
    auto logits = gemm_linear(h, weight).narrow(-1, 0, opt_.vocab_size);  // x·Eᵀ [s, b, V] of [s, b, Vp]
    return F::cross_entropy(logits.to(torch::kFloat).reshape({-1, opt_.vocab_size}), labels.t().reshape({-1}));
  }
  auto logits = parallel_lm_logits(h, embedding->weight_as(h.scalar_type()), tp_).to(torch::kFloat);  // [s, b, Vp/t]
  auto per_token = vocab_parallel_cross_entropy(logits, labels.t(), embedding->vocab_start(), opt_.vocab_size, tp_);
  return per_token.mean();
}

torch::Tensor GptModelImpl::head_logits(const torch::Tensor& x) {
  TORCH_CHECK(stage_.is_last, "head_logits() called on a stage without the output layer");
  const auto h = norm_fp32(final_ln, x);
  auto logits = gather_from_tp_region(parallel_lm_logits(h, embedding->weight_as(h.scalar_type()), tp_), tp_);
  return logits.narrow(-1, 0, opt_.vocab_size).to(torch::kFloat);  // [s, b, V]
}

torch::Tensor GptModelImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(stage_.is_first && stage_.is_last, "forward() needs the whole model on this rank");
  return head_logits(run_layers(embed(tokens)));
}

torch::Tensor GptModelImpl::loss(const torch::Tensor& samples) {
  const int64_t s = samples.size(1) - 1;
  return head_loss(run_layers(embed(samples.narrow(1, 0, s))), samples.narrow(1, 1, s));
}

bool is_no_decay_parameter(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("bias") || name.find("ln") != std::string::npos;
}

bool is_tp_replicated_parameter(const std::string& name) {
  return name.find("ln") != std::string::npos || name == "position_embedding" ||
         name.find("proj.bias") != std::string::npos || name.find("fc2.bias") != std::string::npos;
}

double gpt_train_flops(const GptOptions& o, int64_t sequences) {
  // models/flops.h: forward + backward = 3 × forward, per sequence (b = 1).
  const double forward = double(o.num_layers) * layer_forward_flops(o.hidden_size, o.seq_len, 1) +
                         logits_forward_flops(o.hidden_size, o.seq_len, 1, o.vocab_size);
  return double(sequences) * (forward + backward_flops(forward));
}

int64_t count_parameters(GptModel& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

}  // namespace optcc

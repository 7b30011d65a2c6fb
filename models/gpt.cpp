#include "models/gpt.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>

namespace optcc {
namespace {

namespace F = torch::nn::functional;

// Each weight gets its own generator seeded from (seed, tag), so its values do not depend on the
// order modules are built in or on how it is later sharded.
void init_normal(torch::Tensor& w, double std, uint64_t seed, uint64_t tag) {
  auto gen = at::detail::createCPUGenerator(seed * 1000003ULL + tag);
  torch::NoGradGuard no_grad;
  w.normal_(0.0, std, gen);
}

uint64_t layer_tag(int64_t layer, int64_t which) { return 100 + static_cast<uint64_t>(layer) * 8 + which; }

// Layers are built before the model knows their index, so the block index rides in a field.
struct InitTags {
  static thread_local int64_t layer;
};
thread_local int64_t InitTags::layer = 0;

torch::nn::Linear make_linear(int64_t in, int64_t out, double std, uint64_t seed, uint64_t tag) {
  torch::nn::Linear lin(torch::nn::LinearOptions(in, out).bias(true));
  init_normal(lin->weight, std, seed, tag);
  torch::NoGradGuard no_grad;
  lin->bias.zero_();
  return lin;
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptOptions& o)
    : heads_(o.num_heads), head_dim_(o.hidden_size / o.num_heads), dropout_(o.attention_dropout) {
  const int64_t h = o.hidden_size;
  const double out_std = o.init_std / std::sqrt(2.0 * o.num_layers);
  qkv = register_module("qkv", make_linear(h, 3 * h, o.init_std, o.seed, layer_tag(InitTags::layer, 0)));
  proj = register_module("proj", make_linear(h, h, out_std, o.seed, layer_tag(InitTags::layer, 1)));
  causal_mask_ = torch::ones({o.seq_len, o.seq_len}, torch::kBool).triu(1);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t s = x.size(0), b = x.size(1);
  // [s, b, 3h] -> [s, b, heads, 3, hd] -> q, k, v each [b, heads, s, hd]
  auto qkv5 = qkv(x).view({s, b, heads_, 3, head_dim_}).permute({3, 1, 2, 0, 4});
  auto q = qkv5[0] * (1.0 / std::sqrt(static_cast<double>(head_dim_)));
  auto k = qkv5[1];
  auto v = qkv5[2];
  auto scores = torch::matmul(q, k.transpose(-2, -1));  // [b, heads, s, s]
  const auto& mask = s == causal_mask_.size(0) ? causal_mask_
                                               : torch::ones({s, s}, torch::kBool).triu(1);
  scores.masked_fill_(mask, -std::numeric_limits<float>::infinity());
  auto probs = torch::softmax(scores, -1);
  if (dropout_ > 0) probs = F::dropout(probs, F::DropoutFuncOptions().p(dropout_).training(is_training()));
  auto ctx = torch::matmul(probs, v);                       // [b, heads, s, hd]
  ctx = ctx.permute({2, 0, 1, 3}).reshape({s, b, heads_ * head_dim_});  // [s, b, h]
  return proj(ctx);
}

MlpImpl::MlpImpl(const GptOptions& o) {
  const int64_t h = o.hidden_size;
  const double out_std = o.init_std / std::sqrt(2.0 * o.num_layers);
  fc1 = register_module("fc1", make_linear(h, 4 * h, o.init_std, o.seed, layer_tag(InitTags::layer, 2)));
  fc2 = register_module("fc2", make_linear(4 * h, h, out_std, o.seed, layer_tag(InitTags::layer, 3)));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return fc2(torch::gelu(fc1(x)));
}

BlockImpl::BlockImpl(const GptOptions& o) : dropout_(o.hidden_dropout) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden_size}).eps(1e-5)));
  attn = register_module("attn", CausalSelfAttention(o));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden_size}).eps(1e-5)));
  mlp = register_module("mlp", Mlp(o));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto drop = [&](const torch::Tensor& t) {
    return dropout_ > 0 ? F::dropout(t, F::DropoutFuncOptions().p(dropout_).training(is_training())) : t;
  };
  auto y = x + drop(attn(ln1(x)));
  return y + drop(mlp(ln2(y)));
}

GptModelImpl::GptModelImpl(const GptOptions& o) : opt_(o) {
  TORCH_CHECK(o.padded_vocab_size >= o.vocab_size, "padded_vocab_size < vocab_size");
  TORCH_CHECK(o.max_positions >= o.seq_len, "max_positions < seq_len");
  word_embedding = register_parameter("word_embedding", torch::empty({o.padded_vocab_size, o.hidden_size}));
  position_embedding = register_parameter("position_embedding", torch::empty({o.max_positions, o.hidden_size}));
  init_normal(word_embedding, o.init_std, o.seed, 1);
  init_normal(position_embedding, o.init_std, o.seed, 2);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_layers; ++i) {
    InitTags::layer = i;
    blocks->push_back(Block(o));
  }
  InitTags::layer = 0;
  final_ln = register_module("final_ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden_size}).eps(1e-5)));
}

torch::Tensor GptModelImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
              "GptModel::forward expects int64 tokens [b, s], got ", tokens.sizes());
  const int64_t s = tokens.size(1);
  TORCH_CHECK(s <= opt_.max_positions, "sequence length ", s, " exceeds max_positions ", opt_.max_positions);
  // [b, s] -> [s, b, h]
  auto x = torch::embedding(word_embedding, tokens.t()) + position_embedding.narrow(0, 0, s).unsqueeze(1);
  if (opt_.hidden_dropout > 0) {
    x = F::dropout(x, F::DropoutFuncOptions().p(opt_.hidden_dropout).training(is_training()));
  }
  for (auto& block : *blocks) x = block->as<Block>()->forward(x);
  x = final_ln(x);
  // Tied output layer over the true vocabulary only: padded rows never receive probability.
  return torch::matmul(x, word_embedding.narrow(0, 0, opt_.vocab_size).t());  // [s, b, V]
}

torch::Tensor GptModelImpl::loss(const torch::Tensor& samples) {
  const int64_t s = samples.size(1) - 1;
  auto inputs = samples.narrow(1, 0, s);
  auto labels = samples.narrow(1, 1, s).t().reshape({-1});  // [s * b], sequence-first like logits
  auto logits = forward(inputs);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, opt_.vocab_size}), labels);
}

bool is_no_decay_parameter(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("bias") || name.find("ln") != std::string::npos;
}

double gpt_train_flops(const GptOptions& o, int64_t sequences) {
  const double L = o.num_layers, h = o.hidden_size, s = o.seq_len, V = o.vocab_size;
  return 3.0 * sequences * s * (24.0 * L * h * h + 4.0 * L * s * h + 2.0 * h * V);
}

int64_t count_parameters(GptModel& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

}  // namespace optcc

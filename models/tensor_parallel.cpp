#include "models/tensor_parallel.h"
#include "kernels/gemm.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace optcc {
namespace {

namespace F = torch::nn::functional;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool trivial(const Communicator* tp) { return tp == nullptr || tp->size() == 1; }

// IValue holds no raw pointers, so the Communicator rides in saved_data as an integer; the header
// requires the group to outlive the graph.
void save_tp(AutogradContext* ctx, Communicator* tp) {
  ctx->saved_data["tp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(tp));
}
Communicator* load_tp(AutogradContext* ctx) {
  return reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["tp"].toInt()));
}

// A fresh contiguous sum (or max) over the group; `x` itself is never written (autograd may hold it).
torch::Tensor all_reduced(const torch::Tensor& x, Communicator* tp, bool max = false) {
  auto y = x.clone(at::MemoryFormat::Contiguous);
  if (tp) tp->all_reduce(y, Traffic::kTensorParallel, max);
  return y;
}

// This rank's 1/t block of the last dim, as a contiguous copy.
torch::Tensor own_slice(const torch::Tensor& x, const Communicator* tp) {
  const int64_t n = x.size(-1), t = tp->size();
  TORCH_CHECK(n % t == 0, "scatter to TP region: last dim ", n, " is not divisible by the TP size ", t,
              " of group ", tp->name());
  return x.narrow(-1, tp->rank() * (n / t), n / t).contiguous();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* tp) {
    save_tp(ctx, tp);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_reduced(g[0], load_tp(ctx)), torch::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, Communicator* tp) {
    return all_reduced(x, tp);
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], torch::Tensor()}; }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* tp) {
    save_tp(ctx, tp);
    return own_slice(x, tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {load_tp(ctx)->all_gather(g[0], Traffic::kTensorParallel, -1), torch::Tensor()};
  }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* tp) {
    save_tp(ctx, tp);
    return tp->all_gather(x, Traffic::kTensorParallel, -1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {own_slice(g[0], load_tp(ctx)), torch::Tensor()};
  }
};

// Cross-entropy over column shards [N, Vl] (Megatron's _VocabParallelCrossEntropy, plus the
// padding mask). `tp` may be null (one rank).
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& labels,
                               int64_t start, int64_t true_vocab, Communicator* tp) {
    const int64_t vl = logits.size(1);
    const int64_t valid = std::clamp<int64_t>(true_vocab - start, 0, vl);  // true-vocabulary columns here
    torch::Tensor masked = logits;
    if (valid < vl) {  // padded columns take no probability mass (BR-15)
      masked = logits.clone();
      masked.narrow(1, valid, vl - valid).fill_(-std::numeric_limits<float>::infinity());
    }
    auto row_max = all_reduced(std::get<0>(masked.max(1)), tp, /*max=*/true);  // [N]
    auto shifted = masked - row_max.unsqueeze(1);                            // [N, Vl], <= 0
    auto probs = shifted.exp();
    auto sum_exp = all_reduced(probs.sum(1), tp);  // [N]
    auto in_shard = (labels >= start) & (labels < start + vl);
    auto local_label = (labels - start).masked_fill(in_shard.logical_not(), 0);
    auto target = shifted.gather(1, local_label.unsqueeze(1)).squeeze(1).masked_fill(in_shard.logical_not(), 0.0);
    target = all_reduced(target, tp);  // [N]: the label's shifted logit, from the rank that holds it
    probs.div_(sum_exp.unsqueeze(1));  // softmax shard (not yet saved, so in place is safe)
    ctx->save_for_backward({probs, local_label, in_shard});
    return sum_exp.log() - target;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto saved = ctx->get_saved_variables();
    const auto& softmax = saved[0];
    auto hit = saved[2].to(softmax.scalar_type()).unsqueeze(1);  // [N, 1]: 1 where the label is local
    auto grad = softmax.scatter_add(1, saved[1].unsqueeze(1), -hit) * g[0].unsqueeze(1);
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor init_full_normal(torch::IntArrayRef sizes, double std, uint64_t seed, uint64_t tag) {
  auto gen = at::detail::createCPUGenerator(seed * 1000003ULL + tag);  // every weight's draw (tensor_parallel.h)
  torch::NoGradGuard no_grad;
  auto w = torch::empty(sizes, torch::kFloat);
  w.normal_(0.0, std, gen);
  return w;
}

namespace {
// The dimensions the layers split (their constructors shard along them; split_of() reports them).
constexpr int64_t kColumnParallelDim = 0;  // ColumnParallelLinear: output rows (weight and bias)
constexpr int64_t kRowParallelDim = 1;     // RowParallelLinear: input columns of the weight
constexpr int64_t kVocabDim = 0;           // VocabParallelEmbedding: vocabulary rows

[[noreturn]] void unknown_parameter(const char* layer, const std::string& parameter) {
  throw std::invalid_argument(std::string(layer) + " has no parameter '" + parameter + "' (weight, bias)");
}

// This rank's contiguous block of `full` along `dim` (n/t of n), as its own tensor.
torch::Tensor own_shard(const torch::Tensor& full, int64_t dim, const Communicator* tp) {
  const int64_t per = full.size(dim) / tp_size(tp);
  return full.narrow(dim, tp_rank(tp) * per, per).clone();
}
}  // namespace

namespace {
thread_local int64_t g_casts_made = 0;

// A parameter in the dtype of the activation it meets: itself when they agree (fp32 runs), else a
// cast whose backward returns the gradient in the parameter's own dtype (fp32 master weights).
torch::Tensor like(const torch::Tensor& param, const torch::Tensor& x) {
  if (!param.defined() || param.scalar_type() == x.scalar_type()) return param;
  ++g_casts_made;
  return param.to(x.scalar_type());
}
}  // namespace

torch::Tensor CastCache::as(const torch::Tensor& param, c10::ScalarType dtype) {
  if (!param.defined() || param.scalar_type() == dtype) return param;
  const bool grad_mode = at::GradMode::is_enabled();
  if (!cast_.defined() || impl_ != param.unsafeGetTensorImpl() || version_ != param._version() || dtype_ != dtype ||
      grad_mode_ != grad_mode) {
    cast_ = param.to(dtype);
    ++g_casts_made;
    impl_ = param.unsafeGetTensorImpl(), version_ = param._version(), dtype_ = dtype, grad_mode_ = grad_mode;
  }
  return cast_;
}

torch::Tensor CastCache::like(const torch::Tensor& param, const torch::Tensor& x) { return as(param, x.scalar_type()); }

int64_t CastCache::casts_made() { return g_casts_made; }

torch::Tensor copy_to_tp_region(const torch::Tensor& x, Communicator* tp) {
  return trivial(tp) ? x : CopyToRegion::apply(x, tp);
}
torch::Tensor reduce_from_tp_region(const torch::Tensor& x, Communicator* tp) {
  return trivial(tp) ? x : ReduceFromRegion::apply(x, tp);
}
torch::Tensor scatter_to_tp_region(const torch::Tensor& x, Communicator* tp) {
  return trivial(tp) ? x : ScatterToRegion::apply(x, tp);
}
torch::Tensor gather_from_tp_region(const torch::Tensor& x, Communicator* tp) {
  return trivial(tp) ? x : GatherFromRegion::apply(x, tp);
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in, int64_t out, Communicator* tp, bool gather_output,
                                                   double std, uint64_t seed, uint64_t tag)
    : tp_(tp), gather_output_(gather_output) {
  const int64_t t = tp_size(tp);
  TORCH_CHECK(out % t == 0, "ColumnParallelLinear(tag ", tag, "): out_features ", out,
              " is not divisible by the TP size ", t, "; each rank holds out/t weight rows");
  auto full = init_full_normal({out, in}, std, seed, tag);
  weight = register_parameter("weight", own_shard(full, kColumnParallelDim, tp));
  bias = register_parameter("bias", torch::zeros({out / t}));
}

TpSplit ColumnParallelLinearImpl::split_of(const std::string& parameter) {
  if (parameter == "weight" || parameter == "bias") return {kColumnParallelDim, false};
  unknown_parameter("ColumnParallelLinear", parameter);
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  auto y = gemm_linear(copy_to_tp_region(x, tp_), weight_cast_.like(weight, x), bias_cast_.like(bias, x));  // [.., out/t]
  return gather_output_ ? gather_from_tp_region(y, tp_) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in, int64_t out, Communicator* tp, bool input_is_parallel,
                                             double std, uint64_t seed, uint64_t tag)
    : tp_(tp), input_is_parallel_(input_is_parallel) {
  const int64_t t = tp_size(tp);
  TORCH_CHECK(in % t == 0, "RowParallelLinear(tag ", tag, "): in_features ", in,
              " is not divisible by the TP size ", t, "; each rank holds in/t weight columns");
  auto full = init_full_normal({out, in}, std, seed, tag);
  weight = register_parameter("weight", own_shard(full, kRowParallelDim, tp));
  bias = register_parameter("bias", torch::zeros({out}));
}

TpSplit RowParallelLinearImpl::split_of(const std::string& parameter) {
  if (parameter == "weight") return {kRowParallelDim, false};
  if (parameter == "bias") return {};  // added once after the reduction: replicated
  unknown_parameter("RowParallelLinear", parameter);
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  if (trivial(tp_)) return gemm_linear(x, weight_cast_.like(weight, x), bias_cast_.like(bias, x));  // one rank: with the bias
  auto x_local = input_is_parallel_ ? x : scatter_to_tp_region(x, tp_);  // [.., in/t]
  return reduce_from_tp_region(gemm_linear(x_local, weight_cast_.like(weight, x)), tp_) +
         bias_cast_.like(bias, x);  // bias once, after the sum
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t padded_vocab, int64_t hidden, Communicator* tp,
                                                       double std, uint64_t seed, uint64_t tag)
    : tp_(tp) {
  const int64_t t = tp_size(tp);
  TORCH_CHECK(padded_vocab % t == 0, "VocabParallelEmbedding: padded vocabulary ", padded_vocab,
              " is not divisible by the TP size ", t, "; pad it to a multiple of t (BR-15)");
  const int64_t per = padded_vocab / t;
  start_ = tp_rank(tp) * per;
  end_ = start_ + per;
  auto full = init_full_normal({padded_vocab, hidden}, std, seed, tag);
  weight = register_parameter("weight", full.narrow(kVocabDim, start_, per).clone());
}

TpSplit VocabParallelEmbeddingImpl::split_of(const std::string& parameter) {
  if (parameter == "weight") return {kVocabDim, true};
  unknown_parameter("VocabParallelEmbedding", parameter);
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(tokens.scalar_type() == torch::kLong, "VocabParallelEmbedding expects int64 tokens, got ",
              tokens.scalar_type());
  auto rows = [&](const torch::Tensor& ids) {  // gathered in fp32, then cast (no copy under fp32)
    auto r = F::embedding(ids, weight);
    return r.scalar_type() == output_dtype_ ? r : r.to(output_dtype_);
  };
  if (trivial(tp_)) return rows(tokens);
  auto outside = (tokens < start_) | (tokens >= end_);
  auto local = (tokens - start_).masked_fill(outside, 0);  // any valid row; zeroed below
  auto out = rows(local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_tp_region(out, tp_);  // summed over TP in the output dtype
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits_local, const torch::Tensor& labels,
                                           int64_t vocab_start, int64_t true_vocab, Communicator* tp) {
  TORCH_CHECK(logits_local.dim() >= 1 && logits_local.scalar_type() == torch::kFloat,
              "vocab_parallel_cross_entropy expects fp32 logits [.., Vp/t], got ", logits_local.scalar_type(), " ",
              logits_local.sizes());
  const int64_t vl = logits_local.size(-1);
  TORCH_CHECK(labels.scalar_type() == torch::kLong && labels.sizes() == logits_local.sizes().slice(0, logits_local.dim() - 1),
              "vocab_parallel_cross_entropy: labels must be int64 ", logits_local.sizes().slice(0, logits_local.dim() - 1),
              ", got ", labels.scalar_type(), " ", labels.sizes());
  TORCH_CHECK(vocab_start == tp_rank(tp) * vl, "vocab_parallel_cross_entropy: vocab_start ", vocab_start,
              " is not TP rank ", tp_rank(tp), " x shard width ", vl);
  TORCH_CHECK(true_vocab > 0 && true_vocab <= vl * tp_size(tp), "vocab_parallel_cross_entropy: true vocabulary ",
              true_vocab, " outside (0, padded ", vl * tp_size(tp), "]");
  auto loss = VocabParallelCrossEntropy::apply(logits_local.reshape({-1, vl}), labels.reshape({-1}), vocab_start,
                                               true_vocab, trivial(tp) ? nullptr : tp);
  return loss.view(labels.sizes());
}

torch::Tensor parallel_lm_logits(const torch::Tensor& x, const torch::Tensor& word_embedding_local, Communicator* tp) {
  TORCH_CHECK(word_embedding_local.dim() == 2 && x.size(-1) == word_embedding_local.size(1),
              "parallel_lm_logits: x [.., ", x.size(-1), "] does not match the embedding shard ",
              word_embedding_local.sizes());
  return gemm_linear(copy_to_tp_region(x, tp), like(word_embedding_local, x));  // [.., Vp/t], x's dtype
}

}  // namespace optcc

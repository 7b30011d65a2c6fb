#include "models/chunked_loss.h"

#include <algorithm>
#include <limits>

namespace optcc {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

/// One chunk's fp32 logits [c, Vp] of h_c [c, hidden] and weight [Vp, hidden] (GEMM in their dtype),
/// the columns from `vocab` on (padding) set to −inf.
torch::Tensor chunk_logits(const torch::Tensor& h_c, const torch::Tensor& weight, int64_t vocab) {
  auto logits = torch::mm(h_c, weight.t()).to(torch::kFloat);
  if (vocab < logits.size(1)) logits.narrow(1, vocab, logits.size(1) - vocab).fill_(-std::numeric_limits<float>::infinity());
  return logits;
}

struct ChunkedLmCrossEntropy : torch::autograd::Function<ChunkedLmCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& weight,
                               const torch::Tensor& labels, int64_t vocab, int64_t chunk_rows) {
    const int64_t n = h.size(0);
    auto lse = torch::empty({n}, h.options().dtype(torch::kFloat));
    auto total = torch::zeros({}, h.options().dtype(torch::kFloat));
    for (int64_t r0 = 0; r0 < n; r0 += chunk_rows) {
      const int64_t c = std::min(chunk_rows, n - r0);
      const auto logits = chunk_logits(h.narrow(0, r0, c), weight, vocab);  // [c, Vp] fp32
      const auto l = torch::logsumexp(logits, 1);                     // [c]
      lse.narrow(0, r0, c).copy_(l);
      const auto picked = logits.gather(1, labels.narrow(0, r0, c).unsqueeze(1)).squeeze(1);
      total.add_((l - picked).sum());
    }
    ctx->save_for_backward({h, weight, labels, lse});
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->saved_data["vocab"] = vocab;
    return total / static_cast<double>(n);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &weight = saved[1], &labels = saved[2], &lse = saved[3];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const int64_t vocab = ctx->saved_data["vocab"].toInt();
    const int64_t n = h.size(0);
    const auto scale = grad_out[0].to(torch::kFloat) / static_cast<double>(n);  // 0-d, no host sync
    auto grad_h = torch::empty_like(h);
    auto grad_w = torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat));
    for (int64_t r0 = 0; r0 < n; r0 += chunk_rows) {
      const int64_t c = std::min(chunk_rows, n - r0);
      const auto h_c = h.narrow(0, r0, c);
      auto p = chunk_logits(h_c, weight, vocab).sub_(lse.narrow(0, r0, c).unsqueeze(1)).exp_();  // softmax [c, Vp], 0 on padding
      p.scatter_add_(1, labels.narrow(0, r0, c).unsqueeze(1), -torch::ones({c, 1}, p.options()));  // − onehot
      p.mul_(scale);
      const auto p_low = p.to(h.scalar_type());
      grad_h.narrow(0, r0, c).copy_(torch::mm(p_low, weight));
      grad_w.add_(torch::mm(p_low.t(), h_c));
    }
    return {grad_h, grad_w.to(weight.scalar_type()), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t chunked_loss_rows(int64_t vocab) { return std::max<int64_t>(1, kChunkedLossBytes / (4 * std::max<int64_t>(1, vocab))); }

torch::Tensor chunked_lm_cross_entropy(const torch::Tensor& h, const torch::Tensor& weight, const torch::Tensor& labels,
                                       int64_t vocab, int64_t chunk_rows) {
  TORCH_CHECK(h.dim() == 2 && weight.dim() == 2 && h.size(1) == weight.size(1) && h.scalar_type() == weight.scalar_type(),
              "chunked_lm_cross_entropy: needs h [N, hidden] and weight [V, hidden] of one dtype, got ", h.sizes(), " ",
              h.scalar_type(), " and ", weight.sizes(), " ", weight.scalar_type());
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == h.size(0) && labels.scalar_type() == torch::kLong,
              "chunked_lm_cross_entropy: labels must be int64 [", h.size(0), "], got ", labels.scalar_type(), " ",
              labels.sizes());
  TORCH_CHECK(chunk_rows >= 1 && h.size(0) >= 1, "chunked_lm_cross_entropy: chunk_rows ", chunk_rows, " and N ",
              h.size(0), " must be >= 1");
  TORCH_CHECK(vocab >= 1 && vocab <= weight.size(0), "chunked_lm_cross_entropy: vocab ", vocab, " outside [1, ",
              weight.size(0), "] (the weight's rows)");
  return ChunkedLmCrossEntropy::apply(h, weight, labels, vocab, chunk_rows);
}

}  // namespace optcc

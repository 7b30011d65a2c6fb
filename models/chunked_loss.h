// The output layer and the cross-entropy as one operation that never holds the fp32 logits of the
// whole batch: rows are taken a chunk at a time, forward and backward (the backward recomputes each
// chunk's logits). For one TP rank's output layer (GptModel::head_loss at TP 1) when the logits are
// large; on a GPU the fp32 [tokens, vocabulary] tensor (824 MB for 4,096 tokens over 50,304 words)
// and its copies are otherwise a good part of a bf16 step.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace optcc {

/// Mean cross-entropy (nats) of logits = h·weightᵀ over the first `vocab` columns against labels,
/// as a 0-d fp32 tensor, computed `chunk_rows` rows at a time.
///   h      [N, hidden] in the compute dtype (fp32 or bf16/fp16), requires grad or not;
///   weight [Vp, hidden] same dtype (the output layer, tied to the word embedding), Vp ≥ vocab:
///          the padded rows (a multiple of 128 keeps the GEMMs aligned) take part in the GEMMs, and
///          their logits are set to −inf, so they are out of the softmax and get zero gradient;
///   labels [N] int64 in [0, vocab).
/// Each chunk's logits are computed in the compute dtype, then softmax, log-sum-exp and the
/// gradient (softmax − onehot)/N in fp32, as F::cross_entropy on fp32 logits does. Saved for the
/// backward: h, weight, labels and the per-row log-sum-exp [N] fp32; the backward recomputes each
/// chunk's logits (one more GEMM per chunk), so at most chunk_rows × V fp32 values live at once.
/// Gradients: d h in h's dtype; d weight summed over the chunks in fp32, returned in weight's dtype.
/// Equal to F::cross_entropy((h·weightᵀ)[:, :vocab]) and its gradients to fp32 rounding (a test:
/// 1e-6 relative in fp32). Throws c10::Error on mismatched shapes or dtypes.
torch::Tensor chunked_lm_cross_entropy(const torch::Tensor& h, const torch::Tensor& weight, const torch::Tensor& labels,
                                       int64_t vocab, int64_t chunk_rows);

/// Rows per chunk for `vocab` columns of logits (padded): as many as keep one chunk's fp32 logits within
/// kChunkedLossBytes (at least 1).
constexpr int64_t kChunkedLossBytes = int64_t{64} << 20;  // 64 MiB
int64_t chunked_loss_rows(int64_t vocab);

/// GptModel::head_loss at TP 1 takes the chunked form when the whole batch's fp32 logits would
/// exceed this (256 MiB); below it, the plain cross-entropy on fp32 logits (cheaper: no recompute).
constexpr int64_t kPlainLogitsBytes = int64_t{256} << 20;

}  // namespace optcc

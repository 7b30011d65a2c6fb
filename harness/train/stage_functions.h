// The GPT model's forward pass on one rank's pipeline stage, written once: stage_body() is what
// every forward runs (training through the pipeline runner's GptStageFunctions, the trainer's
// validation and `optcc eval` through stage_forward()), so the three cannot drift apart.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "harness/parallel/pipeline_runner.h"
#include "harness/parallel/stage_link.h"
#include "models/gpt.h"

namespace optcc {

/// This stage's part of one micro-batch's forward pass through its model chunk `chunk`: the
/// embedding of `tokens` [b, s] (int64) on the first stage's chunk 0, else `input` (the previous
/// virtual stage's hidden states [s, b, h]), through the chunk's blocks; the hidden states [s, b, h]
/// (the last chunk of the last stage's before its head).
inline torch::Tensor stage_body(GptModelImpl& model, const torch::Tensor& input, const torch::Tensor& tokens,
                                int chunk = 0) {
  return model.run_layers(model.stage().is_first && chunk == 0 ? model.embed(tokens) : input, chunk);
}

/// Forward only, through `link` (evaluation; every rank of the pipeline calls it for micro-batch
/// `mb`, in micro-batch order): for each of the stage's model chunks in order, receive from the
/// previous virtual stage (not on the first), stage_body(), send to the next (not from the last).
/// Returns the last stage's hidden states [s, b, h]; undefined elsewhere. `tokens` [b, s] is read
/// on the first stage only.
inline torch::Tensor stage_forward(GptModelImpl& model, StageLink& link, int mb, const torch::Tensor& tokens) {
  const auto& st = model.stage();
  torch::Tensor x;
  for (int c = 0; c < static_cast<int>(st.chunks); ++c) {
    x = stage_body(model, st.is_first && c == 0 ? torch::Tensor() : link.recv_forward(mb, c), tokens, c);
    if (!(st.is_last && c == st.chunks - 1)) link.send_forward(x, mb, c);
  }
  return st.is_last ? x : torch::Tensor();
}

// What the pipeline runner calls on this rank: embed on the first stage, this stage's blocks, the
// loss on the last stage. Micro-batch data is loaded before each step by the stages that need it.
class GptStageFunctions final : public StageFunctions {
 public:
  /// m = micro-batches per step (the loss of each is divided by it, so their gradients sum to the step's).
  GptStageFunctions(GptModel& model, int64_t microbatches) : model_(model), m_(microbatches) {}
  std::vector<torch::Tensor> batches;  // [b, s + 1] per micro-batch (first and last stage)
  /// fp16's loss scale S (harness/train/loss_scaler.h): the last stage returns loss / m · S, so
  /// the backward pass carries S-times larger gradients. 1 = no scaling (not even a multiply).
  double loss_scale = 1.0;

  torch::Tensor forward(int mb, int chunk, const torch::Tensor& input) override {
    const auto& st = model_->stage();
    const bool embeds = st.is_first && chunk == 0, heads = st.is_last && chunk == st.chunks - 1;
    torch::Tensor x;
    if (embeds || heads) TORCH_CHECK(mb < static_cast<int>(batches.size()), "no data for micro-batch ", mb);
    const int64_t s = embeds || heads ? batches[mb].size(1) - 1 : 0;
    x = stage_body(*model_, input, embeds ? batches[mb].narrow(1, 0, s) : torch::Tensor(), chunk);
    if (!heads) return x;
    auto loss = model_->head_loss(x, batches[mb].narrow(1, 1, s)) / static_cast<double>(m_);
    return loss_scale == 1.0 ? loss : loss * loss_scale;
  }

 private:
  GptModel& model_;
  int64_t m_;
};

}  // namespace optcc

// The GPT model as the pipeline runner sees it on one rank (internal to harness/train: the Trainer
// and SC's calibration step run the same stage functions).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "harness/parallel/pipeline_runner.h"
#include "models/gpt.h"

namespace optcc {

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

  torch::Tensor forward(int mb, const torch::Tensor& input) override {
    const auto& st = model_->stage();
    torch::Tensor x;
    if (st.is_first || st.is_last) TORCH_CHECK(mb < static_cast<int>(batches.size()), "no data for micro-batch ", mb);
    const int64_t s = st.is_first || st.is_last ? batches[mb].size(1) - 1 : 0;
    x = st.is_first ? model_->embed(batches[mb].narrow(1, 0, s)) : input;
    x = model_->run_layers(x);
    if (!st.is_last) return x;
    auto loss = model_->head_loss(x, batches[mb].narrow(1, 1, s)) / static_cast<double>(m_);
    return loss_scale == 1.0 ? loss : loss * loss_scale;
  }

 private:
  GptModel& model_;
  int64_t m_;
};

}  // namespace optcc

// Micro-batches of GPT samples as tensors, with a resumable position.
//
// The global sample order is fixed by the GptDataset's shuffle. A step consumes
// global_batch_size consecutive samples; within it, micro-batch i of data-parallel rank r holds
// samples [pos + r*b, pos + (r+1)*b) with pos advancing by b*dp per micro-batch (Megatron's
// pretraining sampler). So the stream of a run resumed at step k equals the uninterrupted one.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "datasets/gpt_dataset.h"

namespace optcc {

class BatchLoader {
 public:
  /// `dataset` samples have seq_len + 1 tokens. `consumed_samples` is the global position
  /// (samples taken by all data-parallel ranks so far); `dp_rank` in [0, dp_size). Micro-batches
  /// are read on the host and delivered on `device` (the rank's GPU in a CUDA run).
  BatchLoader(std::shared_ptr<const data::GptDataset> dataset, int64_t seq_len,
              int64_t micro_batch_size, int64_t dp_rank = 0, int64_t dp_size = 1,
              int64_t consumed_samples = 0, torch::Device device = torch::kCPU);
  /// Next micro-batch for this rank: [b, seq_len + 1] int64 on the loader's device. Wraps around at
  /// the dataset's end.
  torch::Tensor next();
  int64_t consumed_samples() const { return consumed_; }
  void set_consumed_samples(int64_t n) { consumed_ = n; }

 private:
  std::shared_ptr<const data::GptDataset> dataset_;
  int64_t seq_len_, micro_batch_, dp_rank_, dp_size_, consumed_;
  torch::Device device_;
};

}  // namespace optcc

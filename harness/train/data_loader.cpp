#include "harness/train/data_loader.h"

namespace optcc {

BatchLoader::BatchLoader(std::shared_ptr<const data::GptDataset> dataset, int64_t seq_len,
                         int64_t micro_batch_size, int64_t dp_rank, int64_t dp_size,
                         int64_t consumed_samples, torch::Device device)
    : dataset_(std::move(dataset)),
      seq_len_(seq_len),
      micro_batch_(micro_batch_size),
      dp_rank_(dp_rank),
      dp_size_(dp_size),
      consumed_(consumed_samples),
      device_(device) {
  TORCH_CHECK(dataset_ && dataset_->size() > 0, "BatchLoader: empty dataset");
}

torch::Tensor BatchLoader::next() {
  auto batch = torch::empty({micro_batch_, seq_len_ + 1}, torch::kLong);
  int64_t* out = batch.data_ptr<int64_t>();
  const int64_t first = consumed_ + dp_rank_ * micro_batch_;
  for (int64_t i = 0; i < micro_batch_; ++i) {
    dataset_->sample((first + i) % dataset_->size(), out + i * (seq_len_ + 1));
  }
  consumed_ += micro_batch_ * dp_size_;
  return device_.is_cpu() ? batch : batch.to(device_);
}

}  // namespace optcc

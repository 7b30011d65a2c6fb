// `randomk`: k entries chosen the same on every rank (elementwise_reducer.h: the shared contract).
#pragma once

#include "compression/elementwise_reducer.h"

namespace optcc {

/// `randomk` (Stich et al. 2018): k entries chosen uniformly without replacement (Floyd's
/// algorithm), the SAME on every rank: tensor i at step t uses a CPU generator seeded with
/// mix(seed, t, i), so the choice needs no communication and a resumed run draws what the
/// uninterrupted one would (no generator state to save). Only values travel:
///   Message per tensor: k values fp32 = 4k bytes (raw when k ≥ N). All tensors' values in ONE
///   fp32 buffer [Σk], one all-reduce (sum, wire 2(n−1)/n·4Σk), ÷ n, scattered into zeros.
/// k as topk.
struct RandomKOptions {
  double fraction = 0.01;
  int64_t count = 0;
  bool error_feedback = true;
  int64_t min_numel = 0;
  int64_t seed = 0;  // same on every DP rank
  static RandomKOptions from_yaml(const YAML::Node& options);
};

class RandomKReducer : public ElementwiseReducer {
 public:
  /// Its tensor form: the indices are drawn on the host as always (they depend on (seed, step, tensor)
  /// only, never on the gradient: k int64 copied to the device), the values, EF and sum stay there.
  bool has_tensor_form() const override { return true; }
  explicit RandomKReducer(RandomKOptions options);
  std::string name() const override;
  int64_t compressed_bytes(int64_t numel) const override { return 4 * k_for(numel); }
  CollectiveKind exchange_kind() const override { return CollectiveKind::kAllReduce; }
  int64_t k_for(int64_t numel) const;
  /// The sorted indices [k] int64 (CPU) that tensor `tensor` of `numel` elements uses at `step`.
  torch::Tensor indices(int64_t step, size_t tensor, int64_t numel) const;

 private:
  void exchange(std::vector<Item>& items, Communicator& dp, int64_t step) override;
  void exchange_tensors(std::vector<Item>& items, Communicator& dp, int64_t step);
  std::vector<int64_t> draw(int64_t step, size_t tensor, int64_t numel) const;  // indices(), as a vector
  RandomKOptions opt_;
};

}  // namespace optcc

// `topk`: the k largest entries per tensor (elementwise_reducer.h: the shared contract).
#pragma once

#include "compression/elementwise_reducer.h"

namespace optcc {

/// `topk` (Aji & Heafield 2017; with error feedback: Stich et al. 2018, "Sparsified SGD with
/// memory"): each rank keeps the k entries of c with the largest |c| (ties at the k-th magnitude:
/// the smallest indices), found by selection (a threshold pass and nth_element, raw_loops.h), not
/// by sorting.
///   k = count if count > 0, else clamp(round(fraction·N), 1, N).
///   Message per tensor: k values fp32 + k indices int32 = 8k bytes (raw when 8k ≥ 4N, i.e.
///   2k ≥ N). All tensors' values (float bits) and indices (increasing per tensor) packed into ONE int32 buffer [2·Σk],
///   one all-gather (wire (n−1)·8Σk). out = Σ_r scatter_add(values_r at indices_r) ÷ n.
struct TopKOptions {
  double fraction = 0.01;       // share of entries kept per tensor, in (0, 1]
  int64_t count = 0;            // > 0: keep exactly min(count, N) entries (YAML: not with fraction)
  bool error_feedback = true;   // keep the unsent remainder c − own for the next call
  int64_t min_numel = 0;        // tensors with fewer elements go raw
  static TopKOptions from_yaml(const YAML::Node& options);
};

class TopKReducer : public ElementwiseReducer {
 public:
  explicit TopKReducer(TopKOptions options);
  std::string name() const override;
  int64_t compressed_bytes(int64_t numel) const override { return 8 * k_for(numel); }
  /// Entries kept of a tensor of `numel` elements.
  int64_t k_for(int64_t numel) const;
  bool has_tensor_form() const override { return true; }

 private:
  void exchange(std::vector<Item>& items, Communicator& dp, int64_t step) override;
  void exchange_tensors(std::vector<Item>& items, Communicator& dp);  // the same, as tensor operations
  void check_compressible(size_t index, int64_t numel) const override;  // N < 2³¹ (int32 indices)
  TopKOptions opt_;
};

}  // namespace optcc

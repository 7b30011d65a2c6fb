// `signsgd`: scaled sign with error feedback (elementwise_reducer.h: the shared contract).
#pragma once

#include "compression/elementwise_reducer.h"

namespace optcc {

/// `signsgd`: scaled sign with error feedback (EF-SignSGD, Karimireddy et al. 2019; the
/// compressor of 1-bit Adam, Tang et al. 2021, here applied to gradients): scale = ‖c‖₁ / N,
/// own = scale·sign(c) with sign(0) = +1 (one bit per entry has no room for 0).
///   Message per tensor: ⌈N/8⌉ bytes of sign bits (bit j%8 of byte j/8 set = non-negative) +
///   scale fp32 = ⌈N/8⌉ + 4 bytes (raw when that is ≥ 4N, i.e. N = 1). All tensors' scales and
///   bits in ONE uint8 buffer, one all-gather (wire (n−1)·Σ bytes). out = Σ_r scale_r·sign_r ÷ n.
struct SignSgdOptions {
  bool error_feedback = true;  // without it, sign compression is biased and may not converge
  int64_t min_numel = 0;
  static SignSgdOptions from_yaml(const YAML::Node& options);
};

class SignSgdReducer : public ElementwiseReducer {
 public:
  explicit SignSgdReducer(SignSgdOptions options);
  std::string name() const override;
  int64_t compressed_bytes(int64_t numel) const override { return (numel + 7) / 8 + 4; }
  /// Its tensor form: the same sign bits, messages and EF update; the scale ‖c‖₁/N is summed in double
  /// in the library's order (the raw loops: blocks of fp32 lanes), so it may differ in its last bit.
  bool has_tensor_form() const override { return true; }

 private:
  void exchange(std::vector<Item>& items, Communicator& dp, int64_t step) override;
  void exchange_tensors(std::vector<Item>& items, Communicator& dp);
  SignSgdOptions opt_;
};

}  // namespace optcc

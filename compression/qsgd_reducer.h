// `qsgd`: stochastic quantisation per bucket (elementwise_reducer.h: the shared contract).
#pragma once

#include "compression/elementwise_reducer.h"

namespace optcc {

/// `qsgd` (Alistarh et al. 2017): c is cut into buckets of bucket_size elements (the last may be
/// shorter); bucket b with L2 norm ‖c_b‖ sends each element as sign·ℓ, ℓ ∈ {0..s}, drawn so that
/// E[ℓ] = |c_j|·s/‖c_b‖ (ℓ = ⌊r⌋ + [u < r − ⌊r⌋], u ~ U[0,1)); decoded ‖c_b‖·sign·ℓ/s (unbiased).
/// A zero bucket sends zeros. u is drawn per rank from a counter-based stream: element j of
/// tensor i at step t on DP rank r uses u(key, j), key = mix(seed + r, t, i) (raw_loops.h:
/// counter_uniform, 24 random bits; different ranks, different streams; resumable with no
/// generator state; computed in the quantisation loop itself, so it vectorises). Per bucket,
/// r = |c_j|·(s/‖c_b‖) with ‖c_b‖ summed in 16 fp32 lanes.
///   Message per tensor: N codes int8 + ⌈N/bucket_size⌉ norms fp32 = N + 4⌈N/bucket_size⌉ bytes
///   (raw when that is ≥ 4N). bits: 4 (levels ≤ 7) packs the codes: each code + 8 in [1, 15], two
///   per byte (raw_loops.h pack_bits, least significant first): ⌈N/2⌉ + 4⌈N/bucket_size⌉ bytes, the
///   same values as bits 8 (a 4-bit outer gradient for DiLoCo, harness/train/outer_sync.h). All tensors' norms and codes in ONE uint8 buffer, one all-gather
///   (wire (n−1)·Σ bytes). out = Σ_r decode_r ÷ n.
/// Its error is variance, not bounded by ‖c‖: a bucket of k entries of equal magnitude with √k > s
/// has E‖decode − c_b‖² = (√k/s − 1)·‖c_b‖² (the worst case for entries below one level), so the
/// expected error stays below the input's norm only while levels ≥ √bucket_size / 2 (defaults:
/// 0.41·‖c_b‖²). With fewer levels (e.g. 4 at bucket_size 512: 4.7·‖c_b‖²) a constant gradient is
/// reconstructed worse than sending nothing would be. Allowed (an unbiased compressor), but error
/// feedback assumes ‖C(x) − x‖ < ‖x‖: with such settings keep error_feedback off.
struct QsgdOptions {
  int64_t levels = 16;        // s, in [1, 127] (codes are int8)
  int64_t bucket_size = 512;  // elements per norm, ≥ 1: smaller = less variance, more bytes
  bool error_feedback = false;  // QSGD is unbiased; EF optional
  int64_t min_numel = 0;
  int64_t seed = 0;  // rank r draws from seed + r
  int64_t bits = 8;  // bits per code on the wire: 8, or 4 (needs levels <= 7)
  static QsgdOptions from_yaml(const YAML::Node& options);
};

class QsgdReducer : public ElementwiseReducer {
 public:
  explicit QsgdReducer(QsgdOptions options);
  std::string name() const override;
  int64_t compressed_bytes(int64_t numel) const override;
  /// Its tensor form: the same codes, norms, message and EF as the raw loops, bit for bit (the
  /// bucket's sum of squares in qsgd_encode_bucket's order, the counter-based uniforms in 32-bit
  /// arithmetic), as tensor operations on the gradients' device.
  bool has_tensor_form() const override { return true; }

 private:
  void exchange(std::vector<Item>& items, Communicator& dp, int64_t step) override;
  void exchange_tensors(std::vector<Item>& items, Communicator& dp, int64_t step);
  std::pair<torch::Tensor, torch::Tensor> encode_tensor(Item& it, uint64_t key) const;  // {norms, code bytes}
  torch::Tensor decode_tensor(const torch::Tensor& packed, const torch::Tensor& norms, int64_t n) const;
  QsgdOptions opt_;
};

}  // namespace optcc

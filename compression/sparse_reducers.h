// Element-wise DP gradient compressors: `topk`, `randomk` (sparsification), `qsgd` (stochastic
// quantisation) and `signsgd` (scaled sign). Same contract as every GradReducer (grad_reducer.h):
// called by every rank of `dp` with the same gradient list; in place; identical results (0 ULP)
// on all DP ranks; a group of one rank compresses with the same numerics and no communication.
//
// Per call, in order (collectives on `dp`, Traffic::kDataParallel unless stated):
//   1. non-finite flag: one 1-float max all-reduce (Traffic::kControl) over isfinite of all grads;
//      set on any rank -> NonFiniteGradients on every rank, grads and EF untouched.
//   2. classify: tensor i (numel N) is sent raw when N < min_numel or when its compressed payload
//      (bytes formula below) is ≥ 4·N, the payload of a raw fp32 all-reduce. The rule depends on
//      N only (not on dp.size()), so the numerics do not depend on the group size. 1-D tensors get
//      no special case; set min_numel to keep biases and norms raw.
//   3. c_i := fp32(grad_i) flattened [N] + EF_i [N] (EF on). All internals fp32 whatever the grad
//      dtype; the result is cast out into grad_i.
//   4. compress every c_i, exchange the messages of all compressed tensors in ONE collective,
//      decode every rank's message and sum them in group-rank order (so every rank computes the
//      same bits), ÷ dp.
//   5. raw tensors: ONE flat fp32 all-reduce [Σ N] (sum), ÷ dp (exact mean, as `none` in fp32).
//   6. EF (on): EF_i := c_i − own_i, own_i = this rank's decoded message (local residual, the
//      standard EF-SGD for compressors that are not linear: Stich et al. 2018; Karimireddy et al.
//      2019). Raw tensors keep no EF.
// records(): compressed = true for compressed tensors (rank field 0), sent_bytes = payload below,
// whatever dp.size() (as PowerSGD). Wire bytes counted by the Communicator: (n−1)·X for an
// all-gather of X bytes per rank, 2(n−1)/n·X for an all-reduce. The raw/compressed rule of step 2
// compares payloads; on the wire an all-gather grows with n, so against a raw fp32 all-reduce
// (8(n−1)/n·N) topk saves wire bytes only while n < 1/fraction, qsgd (default bucket) while n < 8,
// signsgd while n < 64; randomk (an all-reduce) always does.
//
// Options (YAML map, all optional; unknown keys, wrong types and out-of-range values throw
// std::invalid_argument naming the compressor, the key, the value and the rule):
//   topk     fraction 0.01, count 0, error_feedback true, min_numel 0
//   randomk  fraction 0.01, count 0, error_feedback true, min_numel 0, seed 0
//   qsgd     levels 16, bucket_size 512, error_feedback false, min_numel 0, seed 0
//   signsgd  error_feedback true, min_numel 0
// reduce() throws NonFiniteGradients (step 1) and std::invalid_argument when the gradients differ
// in count or shape from the list the state belongs to (GradReducer::set_tensors) or, for topk, a
// tensor has N ≥ 2³¹ (int32 indices).
#pragma once

#include "compression/grad_reducer.h"

namespace optcc {

/// Shared skeleton (the sequence above), EF storage and save/load. Subclasses say how many bytes
/// a compressed tensor costs and how the messages of all compressed tensors are exchanged.
class ElementwiseReducer : public GradReducer {
 public:
  void reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) final;
  /// Keys: "<kind>.state" (tensor {number of EF slots}), "<kind>.tensors.*" (the (name, shape)
  /// list the state belongs to, state_manifest.h), "<kind>.ef.<i>" [N_i] fp32 (tensors that were
  /// compressed with EF). load() throws std::invalid_argument when "<kind>.state" is missing and
  /// StateMismatch when the list is not this reducer's (GradReducer::save), before any change.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Residual of tensor i, flat [N] fp32; undefined if it never was compressed with EF.
  torch::Tensor error(size_t i) const { return i < ef_.size() ? ef_[i] : torch::Tensor(); }

  int64_t error_feedback_bytes() const override {
    int64_t n = 0;
    for (const auto& e : ef_) n += e.defined() ? e.numel() * static_cast<int64_t>(e.element_size()) : 0;
    return n;
  }

  /// Payload bytes of one compressed tensor of `numel` elements (the per-tensor formula).
  virtual int64_t compressed_bytes(int64_t numel) const = 0;

 protected:
  ElementwiseReducer(std::string kind, bool error_feedback, int64_t min_numel);

  /// One compressed tensor of a call: index in grads, compensated input, own decoded message.
  struct Item {
    size_t index = 0;
    torch::Tensor c;    // [N] fp32, grad + EF (read only)
    torch::Tensor own;  // [N] fp32, this rank's decoded message (set by exchange)
    torch::Tensor out;  // [N] fp32, Σ over ranks (rank order) of decoded messages ÷ dp (set by exchange)
  };
  /// Compresses every item's c, runs the ONE collective on `dp` for all of them, fills own and out.
  virtual void exchange(std::vector<Item>& items, Communicator& dp, int64_t step) = 0;

  const std::string kind_;  // registry name, prefix of errors and archive keys
  const bool error_feedback_;
  const int64_t min_numel_;

 private:
  std::vector<torch::Tensor> ef_;  // per tensor index: [N] fp32 (compressed tensors with EF only)
};

/// `topk` (Aji & Heafield 2017; with error feedback: Stich et al. 2018, "Sparsified SGD with
/// memory"): each rank keeps the k entries of c with the largest |c| (ties: torch::topk's choice).
///   k = count if count > 0, else clamp(round(fraction·N), 1, N).
///   Message per tensor: k values fp32 + k indices int32 = 8k bytes (raw when 8k ≥ 4N, i.e.
///   2k ≥ N). All tensors' values (float bits) and indices packed into ONE int32 buffer [2·Σk],
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

 private:
  void exchange(std::vector<Item>& items, Communicator& dp, int64_t step) override;
  TopKOptions opt_;
};

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
  explicit RandomKReducer(RandomKOptions options);
  std::string name() const override;
  int64_t compressed_bytes(int64_t numel) const override { return 4 * k_for(numel); }
  int64_t k_for(int64_t numel) const;
  /// The sorted indices [k] int64 (CPU) that tensor `tensor` of `numel` elements uses at `step`.
  torch::Tensor indices(int64_t step, size_t tensor, int64_t numel) const;

 private:
  void exchange(std::vector<Item>& items, Communicator& dp, int64_t step) override;
  RandomKOptions opt_;
};

/// `qsgd` (Alistarh et al. 2017): c is cut into buckets of bucket_size elements (the last may be
/// shorter); bucket b with L2 norm ‖c_b‖ sends each element as sign·ℓ, ℓ ∈ {0..s}, drawn so that
/// E[ℓ] = |c_j|·s/‖c_b‖ (ℓ = ⌊r⌋ + [u < r − ⌊r⌋], u ~ U[0,1)); decoded ‖c_b‖·sign·ℓ/s (unbiased).
/// A zero bucket sends zeros. u is drawn per rank: tensor i at step t on DP rank r uses a CPU
/// generator seeded with mix(seed + r, t, i) (different ranks, different streams; resumable with
/// no generator state). On CUDA the uniforms are drawn on the CPU and copied.
///   Message per tensor: N codes int8 + ⌈N/bucket_size⌉ norms fp32 = N + 4⌈N/bucket_size⌉ bytes
///   (raw when that is ≥ 4N). All tensors' norms and codes in ONE uint8 buffer, one all-gather
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
  static QsgdOptions from_yaml(const YAML::Node& options);
};

class QsgdReducer : public ElementwiseReducer {
 public:
  explicit QsgdReducer(QsgdOptions options);
  std::string name() const override;
  int64_t compressed_bytes(int64_t numel) const override;

 private:
  void exchange(std::vector<Item>& items, Communicator& dp, int64_t step) override;
  QsgdOptions opt_;
};

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

 private:
  void exchange(std::vector<Item>& items, Communicator& dp, int64_t step) override;
  SignSgdOptions opt_;
};

}  // namespace optcc

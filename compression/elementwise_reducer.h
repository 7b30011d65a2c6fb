// Element-wise DP gradient compressors: `topk`, `randomk` (sparsification), `qsgd` (stochastic
// quantisation) and `signsgd` (scaled sign), one file each (topk_reducer.h, randomk_reducer.h,
// qsgd_reducer.h, signsgd_reducer.h) on the shared ElementwiseReducer below. Same contract as every GradReducer (grad_reducer.h):
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
//   3. c_i := fp32(grad_i) flattened [N] + EF_i [N] (EF on; computed in EF's storage). All
//      internals fp32 whatever the grad dtype: on the CPU (raw loops, raw_loops.h), or for a
//      gradient on another device, where the reducer has a tensor form (has_tensor_form), on that
//      device with the same results bit for bit; the result is cast out into grad_i (written
//      straight into it when it is contiguous fp32 CPU).
//   4. compress every c_i, exchange the messages of all compressed tensors in ONE collective,
//      decode every rank's message and sum them in group-rank order (so every rank computes the
//      same bits), ÷ dp.
//   5. raw tensors: ONE flat fp32 all-reduce [Σ N] (sum), ÷ dp (exact mean, as `none` in fp32).
//   6. EF (on): EF_i := c_i − own_i in place, own_i = this rank's decoded message (local residual, the
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
//   qsgd     levels 16, bucket_size 512, error_feedback false, min_numel 0, seed 0, bits 8 (or 4)
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
  /// Residual of tensor i, flat [N] fp32 (on the CPU, or on the gradient's device for a reducer with
  /// a tensor form); undefined if it never was compressed with EF. The reducer's own storage: the
  /// next reduce() updates it in place (clone() to keep a copy).
  torch::Tensor error(size_t i) const { return i < ef_.size() ? ef_[i] : torch::Tensor(); }
  /// Whether this reducer compresses gradients that are not on the CPU where they are (its tensor
  /// form: tensor operations, EF kept on that device, no host copy); the others' messages and EF go
  /// through the host. All four have one (topk, randomk and qsgd equal to their raw loops bit for
  /// bit, signsgd to fp32 rounding of its scale).
  virtual bool has_tensor_form() const { return false; }
  /// Test hook: run the tensor form for CPU gradients too (a CPU test holds it to the raw loops).
  void use_tensor_form_on_cpu(bool on) { tensor_form_on_cpu_ = on; }

  int64_t error_feedback_bytes() const override {
    int64_t n = 0;
    for (const auto& e : ef_) n += e.defined() ? e.numel() * static_cast<int64_t>(e.element_size()) : 0;
    return n;
  }

  /// Payload bytes of one compressed tensor of `numel` elements (the per-tensor formula).
  virtual int64_t compressed_bytes(int64_t numel) const = 0;
  /// Step 2's rule: a tensor of `numel` elements goes raw (numel 0, below min_numel, or a
  /// compressed payload of at least 4·numel bytes). reduce() and plan() both ask here.
  bool sends_raw(int64_t numel) const { return numel == 0 || numel < min_numel_ || compressed_bytes(numel) >= 4 * numel; }
  /// The one collective of step 4 (randomk: an all-reduce of the values; the others all-gather).
  virtual CollectiveKind exchange_kind() const { return CollectiveKind::kAllGather; }
  /// Encode (read the gradient, write the message: 8 bytes per compressed element), the compressed
  /// collective (Σ compressed_bytes), the raw fp32 all-reduce (Σ numel · 4, or ctx.element_bytes),
  /// decode; the compressed collective only when some tensor is compressed, the raw one only when
  /// some tensor is raw (as reduce() issues them). State: EF Σ numel · 4 of the
  /// compressed tensors (error_feedback).
  ReducerPlan plan(const std::vector<std::vector<int64_t>>& shapes, const PlanContext& ctx) const final;

 protected:
  ElementwiseReducer(std::string kind, bool error_feedback, int64_t min_numel);

  /// One compressed tensor of a call. Both tensors are flat [N] fp32, contiguous, on the CPU; or, with
  /// `tensors` set (has_tensor_form()), on the gradient's device, for exchange's tensor form.
  struct Item {
    bool tensors = false;
    size_t index = 0;  // in grads
    /// grad + EF. With error feedback on, this IS the EF storage: exchange must leave the
    /// residual c − own in it (own: this rank's decoded message). With it off, c may be the same
    /// memory as out: exchange reads c only before its collective.
    torch::Tensor c;
    /// Where exchange writes Σ over ranks (rank order) of the decoded messages ÷ dp: the
    /// gradient's own memory when it is a contiguous fp32 CPU tensor, else a buffer copied back.
    torch::Tensor out;
    torch::Device device = torch::kCPU;  // the gradient's: where the collective runs
  };
  /// Compresses every item's c (and, with EF, turns it into the residual), runs the ONE collective
  /// on `dp` for all of them (messages moved to the gradients' device and back), fills out.
  virtual void exchange(std::vector<Item>& items, Communicator& dp, int64_t step) = 0;
  /// Throws std::invalid_argument when tensor `index` of `numel` elements cannot be compressed;
  /// called for every compressed tensor before anything changes. Default: every size can.
  virtual void check_compressible(size_t index, int64_t numel) const {}

  const std::string kind_;  // registry name, prefix of errors and archive keys
  const bool error_feedback_;
  const int64_t min_numel_;

 private:
  /// Item of tensor i: out, and c = grad + EF computed into ef_[i] (EF on) or aliasing out / a copy.
  Item compensate(size_t i, const torch::Tensor& grad);

  std::vector<torch::Tensor> ef_;  // per tensor index: [N] fp32 (compressed tensors with EF only)
  bool tensor_form_on_cpu_ = false;
};

}  // namespace optcc

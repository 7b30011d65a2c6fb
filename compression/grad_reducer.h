// GradReducer: the data-parallel gradient reduction of one stage (docs/design.md §1.2 step 1, §6.2), as an
// object with explicit state. Replaces reduce_data_parallel_grads when compression is on.
//
// Contract of reduce(grads, dp, step):
//   - Called by every rank of the DP group `dp`, once per optimizer step, after the schedule,
//     with the same list of gradients (same count, shapes and dtypes, same order) on every rank.
//   - grads: this stage's parameter gradients, any shapes, fp32/fp16/bf16, contiguous, CPU or CUDA.
//     Modified in place to the DP average (or its compressed approximation); on return all DP
//     ranks hold identical values (0 ULP).
//   - step: the global optimizer step (0-based) being reduced; stateful reducers derive their
//     warm-up from it, so a resumed run continues where it stopped (BR-03).
//   - All its collectives are issued on `dp` with traffic_class() (Traffic::kDataParallel unless
//     set otherwise, e.g. kEmbedding for the embedding synchronisation), except the one-float
//     non-finite flag of compressing reducers (Traffic::kControl, so DP bytes match the formulas).
//   - A group of one rank: the identity reducers return at once; PowerSGD still compresses (the
//     same numerics as on many ranks, with no communication).
// After a call, records() lists each tensor: raw bytes (numel · input element size) and the
// bytes this rank handed to collectives for it (payload; the wire bytes the Communicator counts
// are 2(n−1)/n of that for an all-reduce).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "compression/comm_plan.h"
#include "compression/registry.h"
#include "compression/state_manifest.h"
#include "harness/parallel/communicator.h"

namespace optcc {

/// One gradient tensor in the last reduce() call (BR-04 per-step record).
struct TensorRecord {
  std::string name;            // set_tensor_names() entry, else "grad[i]"
  std::vector<int64_t> shape;  // original shape
  int64_t raw_bytes = 0;       // numel · element size of the input gradient
  int64_t sent_bytes = 0;      // payload handed to collectives for this tensor
  bool compressed = false;     // low-rank (P, Q) instead of raw
  int64_t rank = 0;            // effective PowerSGD rank (0 when raw)
};

/// Thrown (on every DP rank alike: the flag is all-reduced) when a gradient holds NaN/Inf on any
/// rank before compression. Gradients and reducer state are left untouched; skip the step.
class NonFiniteGradients : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class GradReducer {
 public:
  virtual ~GradReducer() = default;
  /// Registry name plus the options that matter, e.g. "powersgd(rank=4)".
  virtual std::string name() const = 0;
  /// See the contract above.
  virtual void reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) = 0;
  /// What reduce() does for gradients of `shapes` (in the order reduce() gets them) at ctx.step:
  /// its DP-class collectives in issue order (kind and tensor bytes; the Traffic::kControl
  /// non-finite flag is left out), the arithmetic of its encode and decode, and the persistent
  /// state it holds after the call (for a reducer whose earlier calls saw the same tensors; after
  /// a warm-up call: none). Computed by the rules reduce() follows (the same raw-or-compressed
  /// decision, the same packing), so the traffic model and the simulator never restate a
  /// reducer. Every reducer has one: tests/unit/compressor_plans_test.cpp runs every registered reducer
  /// through reduce() and plan() and compares metered bytes, calls and state bytes.
  virtual ReducerPlan plan(const std::vector<std::vector<int64_t>>& shapes, const PlanContext& ctx) const = 0;
  /// State for checkpoints (per rank). Stateless reducers write/read nothing. Stateful ones
  /// (powersgd, topk, randomk, qsgd, signsgd) also write the (name, shape) list their per-tensor
  /// state belongs to, and load() throws StateMismatch (a std::invalid_argument) naming the first
  /// difference when that list is not this reducer's (set_tensors(), else the list of its last
  /// reduce()), before changing any state. No remapping: a changed list is refused.
  virtual void save(torch::serialize::OutputArchive& archive) const {}
  virtual void load(torch::serialize::InputArchive& archive) {}

  /// Bytes of persistent state (Fig. 12 components): error-feedback buffers, and low-rank factors
  /// kept across calls (PowerSGD's warm-start Q). 0 for stateless reducers.
  virtual int64_t error_feedback_bytes() const { return 0; }
  virtual int64_t factor_bytes() const { return 0; }
  /// Which reconstruction its error-feedback residual subtracts (docs/faults.md BR-05): "averaged"
  /// (the all-reduced approximation) or "local" (this rank's own); "n/a" for a reducer without that
  /// choice. Recorded as the results attribute dp_ef_residual.
  virtual std::string ef_residual() const { return "n/a"; }

  /// The traffic class of its collectives: kDataParallel unless set (kEmbedding when the reducer
  /// compresses the tied-embedding synchronisation). Set before the first reduce().
  void set_traffic_class(Traffic cls) { traffic_ = cls; }
  Traffic traffic_class() const { return traffic_; }

  /// Names for records() (optional; same order as grads).
  void set_tensor_names(std::vector<std::string> names) { names_ = std::move(names); }
  /// Declares the tensors every reduce() will get, in order: names (as set_tensor_names) and
  /// shapes. Optional; GradientSync declares them before load(), so a checkpoint's state is
  /// checked against the run's own list. Stateful reducers refuse a reduce() whose gradients
  /// differ in count or shape from the declared (or first seen, or loaded) list:
  /// std::invalid_argument naming the first difference, state untouched.
  void set_tensors(std::vector<TensorSpec> tensors);
  const std::vector<TensorRecord>& records() const { return records_; }
  int64_t raw_bytes() const;      // Σ records().raw_bytes of the last call
  int64_t payload_bytes() const;  // Σ records().sent_bytes of the last call

 protected:
  /// Starts records() for a call: one raw, uncompressed entry per tensor with sent_bytes 0.
  void begin_records(const std::vector<torch::Tensor>& grads);

  /// For stateful reducers, first thing in reduce(): binds the state to this call's tensors (the
  /// first call, when nothing was declared or loaded) or checks them against the bound list
  /// (count and shapes; std::invalid_argument naming the first difference).
  void bind_tensors(const std::vector<torch::Tensor>& grads);
  /// Writes the bound list under `key` (nothing when none is bound yet).
  void save_tensors(torch::serialize::OutputArchive& archive, const std::string& key) const;
  /// Reads the list under `key` and compares it with the bound one (names too when declared by
  /// set_tensors()); binds it when none is. StateMismatch on a difference; a list missing from
  /// the archive is accepted only when `has_state` is false (nothing to attach).
  void load_tensors(torch::serialize::InputArchive& archive, const std::string& key, bool has_state);

  std::vector<TensorRecord> records_;
  std::vector<std::string> names_;
  std::vector<TensorSpec> tensors_;  // the list per-tensor state belongs to (when bound)
  bool tensors_bound_ = false;       // by set_tensors(), the first reduce() or load()
  bool tensors_declared_ = false;    // by set_tensors(): names are known too
  Traffic traffic_ = Traffic::kDataParallel;
};

/// `none`: the baseline (bit-identical to reduce_data_parallel_grads): all gradients flattened
/// into one buffer (torch::cat, promoting to a common dtype), ÷ dp, one all-reduce (sum), copied back.
///
/// With a 16-bit `wire` (parallel.grad_reduce_dtype: compute on a bf16 or fp16 run; harness/train/
/// grad_sync.h builds it, the registry's `none` is always fp32): the fp32 buffer is multiplied by
/// wire_scale / dp, rounded to the wire dtype, summed in fp32 over the group
/// (Communicator::all_reduce_summing_in_fp32: one rounding of the sum) and cast back to fp32 ÷
/// wire_scale. wire_scale is the loss scale of an fp16 run (set_wire_scale before each reduce():
/// gradients that were scaled up against fp16's underflow travel scaled, as Megatron-LM's fp16
/// gradients do), 1 otherwise. Range: the caller's overflow check keeps every |gradient ·
/// wire_scale| ≤ wire_overflow_limit(dp) = 65504·dp for fp16, so each addend fits, and their sum is
/// a mean of such values, which fits too. Bytes per element on the wire: 2.
class NoneReducer : public GradReducer {
 public:
  explicit NoneReducer(torch::ScalarType wire = torch::kFloat);
  std::string name() const override { return "none"; }
  void reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) override;
  /// One all-reduce of Σ numel · 4 bytes (ctx.element_bytes when set); with a 16-bit wire (and
  /// ctx.element_bytes 0), of the buffer padded to group_size equal chunks at 2 bytes per element
  /// (Communicator::all_reduce_summing_in_fp32). No state.
  ReducerPlan plan(const std::vector<std::vector<int64_t>>& shapes, const PlanContext& ctx) const override;
  torch::ScalarType wire_dtype() const { return wire_; }
  /// The factor gradients are multiplied by before the 16-bit cast and divided by after (> 0).
  void set_wire_scale(double scale);
  /// The largest |gradient · wire_scale| a rank may hand in without the wire overflowing: 65504·dp
  /// for an fp16 wire, infinity otherwise (bf16 has fp32's range).
  double wire_overflow_limit(int64_t dp) const;

 private:
  torch::ScalarType wire_;
  double wire_scale_ = 1.0;
};

/// Σ over `shapes` of the product of each shape (1 for a 0-d shape).
int64_t total_numel(const std::vector<std::vector<int64_t>>& shapes);

/// Flattens `grads` into one fp32 buffer [Σ numel] (cast in) and back (cast out, copy_).
torch::Tensor flatten_fp32(const std::vector<torch::Tensor>& grads);
void unflatten_into(const torch::Tensor& flat, std::vector<torch::Tensor>& grads);

/// Adds none, fp16, bf16, powersgd (powersgd.h), topk, randomk, qsgd and signsgd
/// ({topk,randomk,qsgd,signsgd}_reducer.h) to `registry`; option keys: see each header.
void register_builtin_grad_reducers(Registry<GradReducer>& registry);

}  // namespace optcc

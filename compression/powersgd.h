// `powersgd`: the DP PowerSGD reducer of docs/design.md §6.2 (Vogels et al.; epfml semantics: P summed,
// Q averaged), one call per optimizer step per stage.
//
// Per call, in order (collectives on `dp`, Traffic::kDataParallel unless stated):
//   0. step < warmup_steps: the `none` path (÷ dp, one all-reduce in the gradient dtype); state
//      untouched. Warm-up is derived from the global step, so it survives a resume (BR-03 in docs/faults.md; docs/design.md §10.11).
//   1. non-finite flag: one 1-float max all-reduce (Traffic::kControl) over isfinite of all grads;
//      set on any rank -> NonFiniteGradients on every rank, grads/EF/Q untouched (BR-01).
//   2. classify: 1-D tensors, and matrices M [shape[0], numel/shape[0]] with r_eff = min(r, rows,
//      cols) and rows·cols / ((rows+cols)·r_eff) < min_compression_rate, go raw (BR-04).
//   3. M_i := fp32(grad_i) + EF_i (EF on). All internals fp32 whatever the grad dtype (BR-01).
//   4. Q_i: warm_start: the previous call's (DP-averaged) Q_i, re-orthonormalised with the chosen
//      method before use (the paper-era code and the CB compressor do this; HEAD's DP reducer does
//      not, docs/design.md §10.10: same span, so numerically close; we re-orthonormalise so Q stays well
//      conditioned). First use, or warm_start off: randn [cols, r_eff] from a dedicated CPU
//      generator seeded with `seed` on every rank (so all ranks draw the same Q; docs/design.md §10.7). A zero
//      column of Q (the tensor was zero or of rank < r_eff last time) is refilled from that
//      generator (identical Q on every rank, so identical draws) and Q orthonormalised again.
//   5. P_i := M_i Q_i, all packed in ONE buffer [Σ rows_i·r_i] -> all-reduce (sum).
//   6. raw tensors: ONE flat fp32 all-reduce [Σ numel] (sum), ÷ dp.
//   7. P̂_i := orthogonalise(P_i);  Q_i := M_iᵀ P̂_i packed in ONE buffer [Σ cols_i·r_i]
//      -> all-reduce (sum), ÷ dp.  out_i := P̂_i Q_iᵀ (≈ DP mean), cast out into grad_i.
//      P̂_i has orthonormal or zero columns (orthogonalize.h), so with one rank (or identical
//      inputs) out = P̂P̂ᵀM is a projection of M: ‖M − out‖ ≤ ‖M‖, exact for rank(M) ≤ r_eff.
//   8. EF (on): averaged (default, paper/Optimus-CC/PyTorch hook): EF_i := M_i − out_i;
//      local (epfml pip package, BR-05): EF_i := M_i − P̂_i Q_i,localᵀ (Q before its all-reduce).
//      Raw tensors keep no EF (they are exact).
// Payload per call: P Σ rows·r_eff·4, Q Σ cols·r_eff·4, raw Σ numel·4 bytes.
//
// Two paths, chosen by the gradients' device (same steps, same wire, same state keys):
//   CPU tensors: per matrix, steps 3-8 one matrix at a time with the CPU kernels (orthogonalize.h
//     with the chosen `orthogonalize`, kernels/thin_gemm.h; faster on CPU than the batched path,
//     bench_compression reducer/powersgd/.../{per_matrix,batched}); Q draws from a CPU generator.
//   Other devices (CUDA): batched (lowrank_batch.h). The compressed matrices are grouped by shape,
//     and each group is one tensor [B, rows, cols]; each step is one batched operation per group,
//     so the encode issues the same number of operations whatever r and B, with no host sync.
//     EF of a group is one [B, rows, cols] buffer (the per-tensor residuals are views of it), so
//     M = grad + EF needs no copy. Orthogonalisation is batched Householder QR with the same
//     dependence rule whatever `orthogonalize` says (mgs and qr span the same space; on the batched
//     path both are computed as QR). Q's first draws and zero-column refills come from a
//     CounterNormal (lowrank_batch.h) seeded with `seed`, computed on the device, checkpointed.
//   The two paths agree to fp32 rounding on full-rank inputs (both are projections onto the span
//   of M·Q); a test holds them together on CPU.
#pragma once

#include "compression/grad_reducer.h"
#include "compression/lowrank_batch.h"

namespace optcc {

struct PowerSgdOptions {
  int64_t rank = 4;                   // r: target rank of each compressed matrix
  double min_compression_rate = 2.0;  // compress iff rows·cols / ((rows+cols)·r_eff) ≥ this
  int64_t warmup_steps = 0;           // global steps (step < this) reduced uncompressed
  bool error_feedback = true;         // keep and add the residual (docs/design.md §6.3)
  std::string ef_residual = "averaged";   // "averaged" | "local" (BR-05)
  std::string orthogonalize = "mgs";  // "mgs" | "qr"
  bool warm_start = true;             // reuse Q across calls (re-orthonormalised, see step 4)
  int64_t seed = 714;                 // generator seed for the initial Q, same on all DP ranks

  /// From a YAML map; unknown keys, bad types or values throw std::invalid_argument naming the key.
  static PowerSgdOptions from_yaml(const YAML::Node& options);
};

class PowerSgdReducer : public GradReducer {
 public:
  explicit PowerSgdReducer(PowerSgdOptions options);
  std::string name() const override;
  void reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) override;
  /// Before warmup_steps: NoneReducer's (fp32). Then steps 2-8: P = MQ (2·rows·cols·r FLOPs per
  /// compressed matrix; with M = grad + EF and the EF update reading and writing 12 bytes per
  /// element), the P all-reduce (Σ rows·r), the raw all-reduce (Σ numel of raw tensors), the
  /// orthogonalisation (2·rows·r²) and Q = MᵀP̂, the Q all-reduce (Σ cols·r), P̂Qᵀ; a collective
  /// with nothing to carry is not issued. State: EF Σ rows·cols·4 (error_feedback), Q Σ cols·r·4
  /// (warm_start). ctx.compress_every_matrix reads min_compression_rate as 0.
  ReducerPlan plan(const std::vector<std::vector<int64_t>>& shapes, const PlanContext& ctx) const override;
  /// Keys: "powersgd.rank", "powersgd.generator", "powersgd.draws.seed_counter" (the batched path's
  /// CounterNormal; a checkpoint without it restarts that generator from `seed`), "powersgd.tensors.*" (the (name, shape) list
  /// the state belongs to, state_manifest.h), "powersgd.ef.<i>", "powersgd.q.<i>" (i = index in
  /// that list; absent when never compressed). load() checks the rank (std::invalid_argument) and
  /// the list (StateMismatch, see GradReducer::save) before changing any state.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  const PowerSgdOptions& options() const { return opt_; }
  /// Residual of tensor i [rows, cols] fp32, undefined if it never was compressed with EF.
  torch::Tensor error(size_t i) const { return i < ef_.size() ? ef_[i] : torch::Tensor(); }
  /// Q of tensor i [cols, r_eff] fp32 as left by the last call (DP-averaged, not orthonormal).
  torch::Tensor q(size_t i) const { return i < q_.size() ? q_[i] : torch::Tensor(); }
  int64_t error_feedback_bytes() const override { return state_bytes(ef_); }
  int64_t factor_bytes() const override { return state_bytes(q_); }
  std::string ef_residual() const override { return opt_.ef_residual; }
  /// Test hook: use `q` [cols, r_eff] as tensor i's Q on its next compressed call (before the
  /// re-orthonormalisation of step 4).
  void set_q(size_t i, torch::Tensor q);
  /// Test and benchmark hook: CPU tensors take the batched path too (default: the per-matrix one).
  void use_batched_on_cpu(bool on) { batched_on_cpu_ = on; }

 private:
  struct Split;  // per-call classification (powersgd.cpp)
  /// Step 2 for tensors of `shapes`, with `min_rate` as min_compression_rate: reduce() and plan()
  /// both classify through here.
  Split split(const std::vector<std::vector<int64_t>>& shapes, double min_rate) const;
  void ensure_state(size_t n);
  torch::Tensor prepare_q(size_t i, int64_t cols, int64_t r);
  void check_q_shapes(const Split& p) const;  // warm-start Q of every compressed tensor fits
  void orthogonalize(torch::Tensor& m) const;
  struct Factors;  // one call's packed P and Q buffers and per-tensor views (powersgd.cpp)
  void compute_p(const Split& p, std::vector<torch::Tensor>& grads, Factors& f);               // steps 2-4
  void reduce_raw(const Split& p, std::vector<torch::Tensor>& grads, Communicator& dp);       // step 6
  void finish_low_rank(const Split& p, std::vector<torch::Tensor>& grads, Communicator& dp, Factors& f);  // step 7
  struct Group;  // the batched path: compressed tensors of one shape (powersgd.cpp)
  std::vector<Group> groups(const Split& p) const;
  torch::Tensor batch_m(const Split& p, const Group& g, std::vector<torch::Tensor>& grads);  // M [B, rows, cols], EF folded in
  void reduce_batched(const Split& p, std::vector<torch::Tensor>& grads, Communicator& dp);  // steps 2-8
  static int64_t state_bytes(const std::vector<torch::Tensor>& ts) {
    int64_t n = 0;
    for (const auto& t : ts) n += t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
    return n;
  }

  PowerSgdOptions opt_;
  std::vector<torch::Tensor> ef_;  // per tensor [rows, cols] fp32 (compressed ones only)
  std::vector<torch::Tensor> q_;   // per tensor [cols, r_eff] fp32 (compressed ones only)
  mutable at::Generator gen_;      // CPU; Q init draws (mutable: save() locks it)
  CounterNormal draws_;            // the batched path's Q draws, on the gradients' device
  bool batched_on_cpu_ = false;
};

}  // namespace optcc

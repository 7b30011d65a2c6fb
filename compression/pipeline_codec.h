// PipelineCodec: the MessageCodec (stage_link.h) that puts ActCodecs (compression/act_codec.h) on
// the pipeline's point-to-point messages, with Optimus-CC's policies:
//   - Compressed backpropagation (CB, docs/design.md §2): activation gradients sent from stage k to k−1 go
//     through the backward codec (`lowrank` rank 16 in the paper) on each TP rank's own flat slice;
//     the receiver decodes and StageLink all-gathers the slices over TP as usual.
// The policy's settings and rules (which sends are compressed, how many LEP buffers) are
// compression/pipeline_policy.h's; this class applies them to the messages.
//   - Epilogue-only (docs/design.md §4): with BackwardPhases::kEpilogue only gradients in the
//     epilogue (in 1F1B the last steady-state send and the cool-down) are compressed. Sender and
//     receiver take the decision from the message's epilogue flag, which the schedule sets
//     identically on both ends (schedule.h: backward_send_is_epilogue == backward_recv_is_epilogue
//     of the peer).
//   - Lazy error propagation (LEP, docs/design.md §3.1): LepMode::kLazy keeps ONE buffer per rank, the size
//     of one outgoing slice, added to the next compressed send (whatever its micro-batch or
//     iteration) and replaced by that send's error: sent + new error = slice + old error.
//     kPerMicrobatch keeps one buffer per micro-batch slot (classic error feedback, the alternative
//     the paper argues against; m buffers); kOff drops the error (the NON-LEP ablation).
//     Two variants keep LEP's one-buffer memory (the study of paper/lep-study.md): kLazyIteration drops the
//     buffer at the end of every iteration (end_step), so no error is carried across an optimizer
//     step into other weights and other tokens; kLazyDecay carries β·error (β = `decay` in (0, 1];
//     β = 1 is kLazy bit for bit): sent + new error = slice + β·old error.
//     Memory per rank (one backward slice = S bytes in fp32): off 0, lazy / lazy_iteration /
//     lazy_decay S, per_microbatch m·S.
//     Interleaved 1F1B: a stage sends gradients from each of its model chunks across a boundary
//     of its own (chunk c of stage k to the virtual stage before it), so every buffer above exists
//     once per sending chunk (key (chunk, micro-batch)): LEP memory grows with the chunks, c·S for
//     lazy with c sending chunks (v, or v−1 on stage 0, whose chunk 0 sends none).
//   - Forward activations go through the forward codec when one is given (an ablation baseline;
//     the paper never compresses them). No error feedback on forward messages.
// A codec named `none` (or null) leaves its direction uncompressed: the slice itself travels in
// the link's dtype, bit-identical to StageLink's IdentityCodec.
//
// Who calls what: one PipelineCodec per rank, handed to that rank's StageLink; all ranks of a
// pipeline must be built from the same options (the receiver derives shapes and dtypes from them).
// Encoding runs in fp32 (the slice is cast when the link's dtype differs); compressed parts travel
// in the codec's wire dtypes (lowrank: fp32 P̂ and Q whatever the training dtype, docs/design.md §10.5).
//
// LEP diagnostics (for paper/lep-study.md), off unless enabled: one LepSendRecord per compressed backward send,
// cheap enough to leave on (a few dot products over the slice, one copy of each received forward
// activation slice until its backward send): the relative compression error ‖e_new‖/‖slice‖, the
// cosine of the carried error with the slice it is added to, and Fig. 11's cosine of the carried
// error with the activation change X_src − X_now between the micro-batch that left the error and
// the one it is added to (on this TP rank's slice; across iterations when the error was carried over).
//
// Fig. 11 check (docs/design.md §3.3), off unless enabled: on each rank, per step, the received
// forward activation slice of every micro-batch (before the TP all-gather, so it is this TP rank's
// slice) and the LEP error left by each compressed backward send; orthogonality() then gives, for
// successive micro-batches j, j+1 with both recorded, cos(e_j, X_j − X_{j+1}), mean(e_j) and
// mean(X_j − X_{j+1}), on the same TP slice (fixing the reference's size mismatch with TP > 1).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compression/act_codec.h"
#include "compression/pipeline_policy.h"
#include "harness/parallel/stage_link.h"

namespace optcc {

/// Message counts and bytes since the last reset_stats() (this rank's sends only).
struct PipelineCodecStats {
  int64_t backward_sends = 0;             // activation-gradient messages sent
  int64_t backward_compressed = 0;        // of those, compressed
  int64_t backward_raw_bytes = 0;         // slice bytes in the link's dtype, all sends
  int64_t backward_wire_bytes = 0;        // bytes actually handed to the pipeline link
  int64_t forward_sends = 0;
  int64_t forward_raw_bytes = 0;
  int64_t forward_wire_bytes = 0;
  double encode_seconds = 0;              // wall time in encode() (compression compute), s
  double decode_seconds = 0;              // wall time in decode() of compressed messages, s
};

/// One compressed backward send's LEP diagnostics (paper/lep-study.md). Norms are L2 over this rank's fp32
/// slice; cosines are NaN where undefined (no carried error, a zero vector, no activation known).
struct LepSendRecord {
  int microbatch = 0;
  double slice_norm = 0;           // ‖slice‖ (the activation gradient before compensation)
  double carried_norm = 0;         // ‖carried error‖ as added (β·e for lazy_decay); 0 when none
  double error_norm = 0;           // ‖new error‖ = ‖(slice + carried) − decode(payload)‖
  double relative_error = 0;       // error_norm / slice_norm (NaN when the slice is zero)
  double cos_carried_slice = 0;    // cos(carried, slice)
  double cos_carried_delta = 0;    // cos(carried, X_src − X_now), Fig. 11's quantity
  int carried_age = -1;            // iterations since the carried error was made: 0 same, 1 the previous; -1 none
};

/// Fig. 11 series for one step (docs/design.md §3.3), one entry per successive pair (j, j+1).
struct OrthogonalityRecord {
  std::vector<int> microbatch;     // j
  std::vector<double> cosine;      // cos(e_j, X_j − X_{j+1})
  std::vector<double> error_mean;  // mean(e_j)
  std::vector<double> delta_mean;  // mean(X_j − X_{j+1})
};

/// PipelineCodec::snapshot()'s contents (deep copies).
struct PipelineCodecSnapshot {
  std::unique_ptr<ActCodec> forward, backward;
  std::map<int, torch::Tensor> lep_buffers;
  std::map<int, int64_t> lep_made_at;
  int64_t iteration = 0;
};

class PipelineCodec : public MessageCodec {
 public:
  /// `forward` / `backward`: codecs of the two directions; null or `none` = uncompressed.
  /// `decay`: β of kLazyDecay, in (0, 1] (std::invalid_argument otherwise, or when β ≠ 1 with
  /// another mode: a setting that would be ignored).
  PipelineCodec(std::unique_ptr<ActCodec> forward, std::unique_ptr<ActCodec> backward,
                BackwardPhases phases, LepMode lep, double decay = 1.0);
  /// The same, from the config's policy (CompressionConfig::pipeline_policy()).
  PipelineCodec(std::unique_ptr<ActCodec> forward, std::unique_ptr<ActCodec> backward, const PipelinePolicy& policy)
      : PipelineCodec(std::move(forward), std::move(backward), policy.phases, policy.lep, policy.lep_decay) {}

  /// Whether this message is compressed (both ends of a message give the same answer).
  bool compresses(const P2PMessage& msg, const P2PCall& call) const;
  bool compresses_backward() const { return backward_ != nullptr; }
  bool compresses_forward() const { return forward_ != nullptr; }

  std::vector<std::vector<int64_t>> wire_shapes(const P2PMessage& msg, const P2PCall& call,
                                                int64_t slice_numel) const override;
  std::vector<torch::ScalarType> wire_dtypes(const P2PMessage& msg, const P2PCall& call,
                                             int64_t slice_numel) const override;
  std::vector<torch::Tensor> encode(const P2PMessage& msg, const P2PCall& call,
                                    const torch::Tensor& slice) override;
  torch::Tensor decode(const P2PMessage& msg, const P2PCall& call,
                       const std::vector<torch::Tensor>& wire, int64_t slice_numel) override;

  /// The LEP buffer of model chunk `chunk`: the one buffer (micro-batch ignored) or, for
  /// kPerMicrobatch, slot `mb`. Undefined before the first compressed send, after end_step() for
  /// kLazyIteration, and for kOff. [slice_numel] fp32.
  torch::Tensor lep_error(int mb = 0, int chunk = 0) const;
  /// Bytes held by LEP buffers now.
  int64_t lep_bytes() const;
  /// The most bytes LEP buffers held at once since begin_step() (the Fig. 12 component: for
  /// kLazyIteration the buffer is gone after end_step() but was held during the step).
  int64_t lep_peak_bytes() const { return std::max(lep_peak_bytes_, lep_bytes()); }
  /// Bytes of codec state (lowrank's warm-start Q of both directions; Fig. 12 "P/Q buffers").
  int64_t codec_state_bytes() const;

  const PipelineCodecStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  /// Call begin_step() before each iteration's pipeline schedule and end_step() after it (every
  /// rank of the pipeline; evaluation between steps uses a fork()). end_step() drops the buffer of
  /// kLazyIteration; begin_step() clears the per-step diagnostics.
  void begin_step();
  void end_step();

  /// Fig. 11 diagnostic; orthogonality() after a step gives its series.
  void enable_orthogonality_check(bool on) { check_orth_ = on; }
  OrthogonalityRecord orthogonality() const;

  /// LEP diagnostics (see the top of this file); lep_diagnostics() after a step gives one record per
  /// compressed backward send of the step, in send order.
  void enable_lep_diagnostics(bool on) { lep_diag_ = on; }
  const std::vector<LepSendRecord>& lep_diagnostics() const { return lep_records_; }

  /// Sender state: codec states (lowrank Q, generator) and LEP buffers, for checkpoints (BR-03).
  /// After expect_messages(), load() checks every saved state tensor against expected_state() and
  /// throws StateMismatch (a std::invalid_argument) naming the first one that this run would not
  /// keep, or keep with another shape (the codec is then unusable: do not start the run).
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

  /// The messages this rank will encode: the flat slice length of its forward and of its backward
  /// sends (N/t with TP scatter-gather, else N; 0 when the stage sends none that way) and the
  /// micro-batches per step. Declared by the owner before load().
  /// `backward_chunks`: the model chunks that send backward (interleaved: all but stage 0's chunk 0).
  void expect_messages(int64_t forward_slice, int64_t backward_slice, int64_t microbatches,
                       std::vector<int> backward_chunks = {0});
  /// The state this codec keeps for those messages, by name: "forward.q" / "backward.q" (the
  /// codec's ActCodec::state_for, e.g. lowrank's Q [cols, r]), "lep" (lazy, lazy_decay) or "lep.<mb>"
  /// (kPerMicrobatch, mb < microbatches), each [backward_slice]; a chunk c > 0's buffers are
  /// "lep.chunk<c>" and "lep.chunk<c>.<mb>". Empty before expect_messages().
  std::vector<TensorSpec> expected_state() const;

  /// A copy for messages that must not touch this codec (evaluation): the same options and
  /// expected messages, its own copies of the codec states and LEP buffers, zero stats, no
  /// diagnostics. Encoding with the copy leaves this codec bit-identical.
  std::shared_ptr<PipelineCodec> fork() const;

  /// This codec's sender state as it is now: the codecs' own state (CB's warm-start Q and its
  /// generator), the LEP buffers with their ages, and the iteration count (deep copies).
  /// restore() puts it back, so a step skipped on inf/NaN gradients changes none of it
  /// (harness/train/loss_scaler.h). Statistics and diagnostics are not part of it.
  using Snapshot = PipelineCodecSnapshot;
  Snapshot snapshot() const;
  void restore(Snapshot snapshot);

  BackwardPhases phases() const { return policy_.phases; }
  LepMode lep() const { return policy_.lep; }
  double lep_decay() const { return policy_.lep_decay; }
  const PipelinePolicy& policy() const { return policy_; }

 private:
  // LEP buffers' keys: chunk * kChunkKeys + (kPerMicrobatch ? mb : 0), so chunk 0's are the micro-batch
  // slots (or 0) as checkpoints written before interleaving hold them.
  static constexpr int kChunkKeys = 1 << 16;
  int lep_key(int mb, int chunk) const { return chunk * kChunkKeys + (policy_.lep == LepMode::kPerMicrobatch ? mb : 0); }
  std::string lep_state_name(int key) const;  // "lep", "lep.<mb>", "lep.chunk<c>", "lep.chunk<c>.<mb>"
  void record_lep_send(int mb, int chunk, const torch::Tensor& slice, const torch::Tensor& carried, int carried_age,
                       const torch::Tensor& new_error);
  const ActCodec* codec_for(const P2PMessage& msg, const P2PCall& call) const;
  std::vector<TensorSpec> held_state() const;  // named as in expected_state()
  void check_loaded_state() const;             // held vs expected; StateMismatch
  struct Messages {
    int64_t forward_slice = 0, backward_slice = 0, microbatches = 0;
    std::vector<int> backward_chunks;
  };

  std::unique_ptr<ActCodec> forward_;   // null = identity
  std::unique_ptr<ActCodec> backward_;  // null = identity
  PipelinePolicy policy_;  // phases, LEP mode and its β (compression/pipeline_policy.h)
  std::map<int, torch::Tensor> lep_buffers_;  // key lep_key(mb, chunk): per chunk 0 only, or per mb (kPerMicrobatch)
  std::map<int, int64_t> lep_made_at_;        // key -> iteration (begin_step count) that left its error
  int64_t iteration_ = 0;                     // begin_step() calls
  int64_t lep_peak_bytes_ = 0;
  bool lep_diag_ = false;
  std::vector<LepSendRecord> lep_records_;    // this step's
  std::map<int, torch::Tensor> diag_acts_;    // mb -> received forward activation slice (this step)
  std::map<int, torch::Tensor> lep_src_acts_; // key -> activation slice of the send that left the error
  PipelineCodecStats stats_;
  bool check_orth_ = false;
  std::map<int, torch::Tensor> orth_acts_;    // mb -> received activation slice (copy)
  std::map<int, torch::Tensor> orth_errors_;  // mb -> LEP error after its compressed send (copy)
  std::optional<Messages> expected_;          // expect_messages()
};

}  // namespace optcc

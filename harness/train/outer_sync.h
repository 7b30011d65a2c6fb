// DiLoCo and Streaming DiLoCo across the data-parallel replicas of a 3D-parallel model
// (compression.dp_strategy: diloco; the `diloco:` section, harness/config/config.h).
//
// Inside a replica nothing changes: tensor and pipeline parallelism stay synchronous, the tied
// embedding's two copies are summed over their 2-rank pair every step, the global gradient norm
// and AdamW (the inner optimizer) run as under allreduce. What changes is data parallelism: the
// per-step gradient reduction is gone (GradientSync leaves the DP list alone) and each replica
// trains on its own shard. Every H = inner_steps steps each fragment of the model is synced:
//
//   start (after step t, when t mod H = floor((f+1)H/F) mod H for fragment f):
//     Δ_i      = θ_backup,i − θ_i                 (fp32, per parameter i of the fragment)
//     Δ̄_i      = outer reducer's mean of Δ_i over the DP group (Traffic::kOuter)
//     m_i      = μ m_i + Δ̄_i                       (μ = outer_momentum; no buffer when μ = 0)
//     u_i      = Δ̄_i + μ m_i  (nesterov)  |  m_i  |  Δ̄_i (μ = 0)
//     g_i      = θ_backup,i − outer_lr · u_i       (the fragment's new global value)
//   apply (after step t + τ, τ = sync_delay; at once when τ = 0):
//     θ_backup,i = g_i;   θ_i = α θ_i + (1 − α) g_i    (α = mix; α = 0 copies g_i)
//
// F = 1 is DiLoCo (Douillard et al. 2023): the whole model every H steps. F > 1 is Streaming DiLoCo
// (Douillard et al. 2025): the layers cut into F contiguous fragments, one fragment every H/F steps
// on average, τ and α its overlap and mixing. The outer reducer is any registered GradReducer (its
// collectives carry kOuter: e.g. {name: qsgd, levels: 7} for 4-bit codes). The outer exchange is
// issued when the sync starts, as every collective here is (blocking; communicator.h); τ delays
// only where its result lands, which is the algorithm's semantics. Exactness, by construction: on
// one replica with outer_lr 1 and no momentum g_i = θ_i up to fp32 rounding (plain training);
// τ = 0, α = 0 is the non-overlapped form.
//
// Fragments are by global layer: layer l belongs to fragment floor(l F / L); the word and position
// embeddings to fragment 0, the final LayerNorm to fragment F − 1. Every rank of a DP group holds
// the same parameters, so the group agrees on each fragment's list. The tied word embedding's copy
// on the last stage (pp > 1) takes no part in the outer step: when fragment 0 is applied, stage 0
// broadcasts the new global value over the 2-rank embedding pair (Traffic::kEmbedding) and the last
// stage mixes it in the same way, so the two copies stay bit-identical.
//
// State (checkpoint part "outer_sync"; /memory_components' outer_state): the backup weights of every
// parameter, the momentum buffers, the global values of fragments whose update is still delayed
// (with the step they started at), and each fragment's outer reducer state (error feedback, ...).
// The schedule position is the step itself, so a resume continues mid-period or mid-sync bit-exact.
//
// Evaluation measures the global model: the backup weights (each fragment's last landed global
// value) are swapped into the parameters for the validation pass and the replica's own weights put
// back after it, bit for bit (global_weights()). Every replica then evaluates the same model, the one
// DiLoCo would hand over, and the loss does not depend on where in a period the evaluation falls.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "compression/grad_reducer.h"
#include "harness/config/config.h"
#include "harness/parallel/communicator.h"
#include "harness/records/checkpoint.h"
#include "models/gpt.h"

namespace optcc {

/// The step of a period (1..H) after which fragment f's sync starts: floor((f+1) H / F). Distinct for
/// the F fragments when F <= H; fragment F-1 syncs at the end of the period (t mod H = 0).
int64_t outer_sync_point(int64_t fragment, int64_t inner_steps, int64_t fragments);
/// The step whose sync of fragment f had landed by the end of step `step` (the sync started after
/// step s, s mod H = outer_sync_point(f) mod H, applied after s + τ <= step): the latest such s, or 0
/// when none has landed (the fragment's global value is still the initial weights). Evaluation
/// measures these global values: the steps after s are each replica's own and are not in them.
int64_t outer_last_landed_sync(int64_t fragment, int64_t step, int64_t inner_steps, int64_t fragments,
                               int64_t sync_delay);
/// The fragment of global layer `layer` of `num_layers`: floor(layer F / L).
int64_t outer_fragment_of_layer(int64_t layer, int64_t num_layers, int64_t fragments);

/// The fragment of a stage's parameter `name` (a named_parameters() key; blocks.<i> is the stage's
/// i-th layer, global layer stage.layer_of(i)): its layer's fragment; the embeddings 0; final_ln F - 1.
/// OuterSync and the traffic model (harness/perfmodel/traffic_estimate.h) both assign by it.
int64_t outer_fragment_of(const std::string& name, const StageRange& stage, int64_t num_layers, int64_t fragments);

class OuterSync {
 public:
  /// `dp`: this rank's data-parallel group (size 1: no communication, the same arithmetic);
  /// `embedding`: the tied-embedding pair (null or size 1 when pp == 1 or a middle stage).
  /// Takes the current parameters as the first backup: construct before any step (a resume's
  /// load() replaces them). std::invalid_argument from the registry for a bad diloco.outer.
  OuterSync(const Config& cfg, GptModel& model, Communicator* dp, Communicator* embedding);

  /// After optimizer step `step` (1-based count of completed steps; skipped steps count) on every
  /// rank of the world alike: applies the fragments started at step - τ, then starts the fragments
  /// whose sync point `step` is. Collective over `dp` (and the embedding pair for fragment 0).
  void after_step(int64_t step);

  /// Fragment of the parameter `name` (the model's named_parameters() key) on this stage.
  int64_t fragment_of(const std::string& name) const;
  /// Parameters of fragment f on this rank that take part in the outer step (names).
  std::vector<std::string> fragment_names(int64_t f) const;
  /// Bytes of the state (backup weights + momentum + delayed global values + reducer state).
  int64_t state_bytes() const;
  /// The outer reducer of fragment f (records, plans).
  const GradReducer& reducer(int64_t f) const { return *fragments_.at(f).reducer; }
  int64_t fragments() const { return static_cast<int64_t>(fragments_.size()); }
  /// While the returned guard lives, every parameter holds its backup (the global value its fragment
  /// last landed, cast to the parameter's dtype; a sync still in flight, τ > 0, has not landed yet);
  /// its destruction copies the replica's own weights back, bit for bit. Local: no communication.
  /// Used around the validation pass (harness/train/trainer.cpp). Costs one copy of the parameters.
  class GlobalWeights {
   public:
    GlobalWeights(GlobalWeights&& other) noexcept : params_(std::move(other.params_)), local_(std::move(other.local_)) {
      other.params_.clear();
    }
    GlobalWeights(const GlobalWeights&) = delete;
    GlobalWeights& operator=(const GlobalWeights&) = delete;
    GlobalWeights& operator=(GlobalWeights&&) = delete;
    ~GlobalWeights();

   private:
    friend class OuterSync;
    GlobalWeights(std::vector<torch::Tensor> params, std::vector<torch::Tensor> local)
        : params_(std::move(params)), local_(std::move(local)) {}
    std::vector<torch::Tensor> params_, local_;  // the live parameters; the replica's weights to restore
  };
  GlobalWeights global_weights();

  /// Checkpoint part "outer_sync" (see the top of this file). Loading checks every tensor's shape
  /// against this rank's parameters: std::invalid_argument naming the first difference.
  std::vector<CheckpointPart> checkpoint_parts();

 private:
  struct Fragment {
    std::vector<size_t> params;  // indices into params_ that take part in the outer step
    std::unique_ptr<GradReducer> reducer;
    int64_t started_at = -1;     // the step of a delayed sync in flight (τ > 0), else -1
  };
  void start(Fragment& f, int64_t index, int64_t step);
  void apply(Fragment& f, int64_t index);
  void sync_tied_copy();
  void save_state(torch::serialize::OutputArchive& a) const;  // checkpoint part "outer_sync"
  void load_state(torch::serialize::InputArchive& a);         // checks shapes, then replaces the state

  DilocoConfig opt_;
  GptModel& model_;
  Communicator* dp_;
  Communicator* embedding_;
  bool first_stage_ = true, tied_copy_ = false;  // tied_copy_: last stage (pp > 1) holding the word embedding's copy
  int64_t num_layers_ = 1;
  StageRange stage_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> backup_, momentum_, pending_;  // per parameter; momentum/pending undefined until used
  int64_t word_embedding_ = -1;  // index of the word embedding in params_, -1 when not on this stage
  std::vector<Fragment> fragments_;
};

}  // namespace optcc

// Dynamic loss scaling for fp16 training (train.precision: fp16), as Megatron-LM and DeepSpeed do
// it: the loss is multiplied by a scale S before the backward pass, so fp16 gradients of small
// magnitude do not flush to zero; the fp32 master gradients are divided by S before anything else
// reads them. An overflow (an inf or NaN in any rank's local gradients) skips the step and backs S
// off; `growth_interval` steps without one grow it.
//
// The trainer's order for every precision (harness/train/trainer.cpp Trainer::update):
//   1. each rank checks its own, uncompressed gradients for inf/NaN (before any reduction or
//      compression could spread or hide them);
//   2. the flags are agreed over the whole world (an all-reduce MAX of one scalar, control class),
//      so every rank takes the same branch;
//   3. overflow: the step is skipped on every rank: no DP or embedding reduction, no optimizer step;
//      the pipeline codec's state (CB's Q and generator, LEP buffers, its iteration count) is put
//      back as it was before the step, so no compressor state, optimizer state or weight changes.
//      The step counter and the data position still advance (the batch is consumed, as in
//      Megatron-LM), and /train records the step with skipped = 1;
//   4. otherwise the gradients are unscaled (fp16) and the step goes on as without scaling.
// Only fp16 scales (S = 1 otherwise: steps 1-3 still guard fp32 and bf16 runs).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace optcc {

struct LossScaleOptions {
  double initial = 65536.0;        // S at step 0 (2^16)
  int64_t growth_interval = 1000;  // steps without overflow before S doubles
  double backoff = 0.5;            // S *= backoff on overflow, in (0, 1)
  double min_scale = 1.0;          // floor of S
  double max_scale = 16777216.0;   // ceiling of S (2^24): fp32 can still unscale it exactly
};

/// Step 1 for one rank: true when any of `grads` holds an inf or NaN, or, with a finite
/// `wire_limit` (an fp16 DP wire: harness/train/grad_sync.h wire_overflow_limit), a value whose
/// magnitude exceeds it.
bool has_local_overflow(const std::vector<torch::Tensor>& grads, double wire_limit);

class DynamicLossScaler {
 public:
  /// `enabled` false: scale() is 1 forever and update() only counts skips.
  DynamicLossScaler(bool enabled, LossScaleOptions options);

  double scale() const { return scale_; }
  bool enabled() const { return enabled_; }
  /// After the world agreed on the step: `overflow` backs off (not below min_scale) and resets the
  /// growth count; a clean step counts towards growth_interval, then S doubles (not above
  /// max_scale). Also counts consecutive skips.
  void update(bool overflow);
  int64_t skipped_in_a_row() const { return skipped_in_a_row_; }
  int64_t clean_steps() const { return clean_steps_; }

  /// The checkpoint part's tensors (scale, clean steps, consecutive skips), so a resumed run
  /// continues the same schedule.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  bool enabled_;
  LossScaleOptions o_;
  double scale_ = 1.0;
  int64_t clean_steps_ = 0;
  int64_t skipped_in_a_row_ = 0;
};

}  // namespace optcc

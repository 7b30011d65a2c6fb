// One training step's pipeline schedule on one rank: walks communication_plan() (schedule.h),
// running the model's forward and the autograd backward of each micro-batch and the StageLink calls
// around them. The model makes no communication calls; it only provides StageFunctions.
//
// Who calls what: every rank of every stage calls run_pipeline_step once per step with the same
// schedule and micro-batch count (and its own StageFunctions / StageLink); the step returns when
// this rank's plan is done. The caller zeroes parameter gradients before and reduces them (DP, TP,
// embedding) after, as without a pipeline; stages == 1 runs the plain forward/backward loop.
//
// Per (chunk c, micro-batch mb), stage k of p (one chunk, c = 0, unless the schedule interleaves v):
//   forward:  x = received activation (undefined on the first virtual stage: stage 0's chunk 0);
//             y = fn.forward(mb, c, x); y is sent to the next virtual stage, or on the last one
//             (stage p-1's chunk v-1) is this micro-batch's loss / m.
//   backward: in the schedule's order. Autograd from y with the gradient received from the next
//             virtual stage (last: from the loss, gradient 1); parameter gradients accumulate in
//             .grad; x's gradient (dL/dx, zeros if the stage ignored x) is sent to the previous one.
//   Afterwards x, y and their graph are released: at most the schedule's in-flight (chunk,
//   micro-batch) pairs (1F1B: min(p-k, m); GPipe: m; interleaved: schedule.h) hold activations at
//   any time. The output's storage is not replaced by a placeholder after its send (Megatron's
//   optional output deallocation, docs/design.md §1.3).
// m < p works for 1F1B and GPipe (BR-12 in docs/faults.md): the plan then has no steady state.
//
// Schedules that split the backward (zb_h1): kBackward is B, autograd with each forward's linear
// layers deferring their weight-gradient GEMMs (kernels/gemm.h, WeightGradDeferral), and kWeight is
// W, those GEMMs accumulated into .grad; between the two only each layer's input and output gradient
// are held. Calls the plan does not wait on (P2PCall::wait false: B's sends) are posted and finished
// at the end of the step, so the step returns with every gradient of the stage in .grad.
//
// Errors: std::invalid_argument for a schedule whose model chunks differ from the link's; when
// forward returns the wrong thing (not a scalar loss on the last virtual
// stage; not the link's output shape elsewhere, reported by StageLink; no autograd graph);
// CommError when a peer fails or hangs (StageLink, within the communicators' timeout); whatever
// fn.forward throws. After an exception the step is abandoned: zero the gradients before retrying.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "harness/parallel/schedule.h"
#include "harness/parallel/stage_link.h"

namespace optcc {

/// What the model provides on this rank: the forward of its stage, one micro-batch at a time.
class StageFunctions {
 public:
  virtual ~StageFunctions() = default;
  /// Forward of micro-batch `mb` (0..m-1, called in schedule order) through this stage's model
  /// chunk `chunk` (0..v-1; always 0 unless the schedule interleaves). `input` is the received
  /// activation, StageLinkShapes::input, a leaf with requires_grad (undefined on stage 0's chunk 0,
  /// which reads its own micro-batch). Returns the output activation (StageLinkShapes::output),
  /// or on the last stage's last chunk the scalar loss of that micro-batch ALREADY divided by
  /// the number of micro-batches, so that backward accumulates the mean. The result must carry an
  /// autograd graph (depend on a parameter or on `input`).
  virtual torch::Tensor forward(int mb, int chunk, const torch::Tensor& input) = 0;
};

struct PipelineStepResult {
  double loss = 0;                        // last stage: sum of its micro-batch losses (each
                                          // already / m, so the mean loss); 0 on other stages
  std::vector<double> microbatch_losses;  // last stage: [m], as returned by forward; else empty
  double seconds = 0;                     // wall time of the whole step on this rank, s
  double compute_seconds = 0;             // of it, the time inside the compute actions (F, B, W); the
                                          // rest is calls: transfers and waiting for peers (the bubble)
  // Split backwards (zb_h1): the weight-gradient GEMMs B deferred to W (one per linear layer and
  // micro-batch), and the most bytes their held inputs and output gradients took at once. 0 otherwise.
  int64_t deferred_weight_grads = 0;
  int64_t deferred_peak_bytes = 0;
};

/// Runs `schedule` for `microbatches` micro-batches on this rank: stage = link.stage(),
/// stages = link.stages(). REQUIRES microbatches >= 1 (else std::invalid_argument).
PipelineStepResult run_pipeline_step(const PipelineSchedule& schedule, StageFunctions& fn,
                                     StageLink& link, int microbatches);

}  // namespace optcc

// One training step's pipeline schedule on one rank: walks communication_plan() (schedule.h),
// running the model's forward and the autograd backward of each micro-batch and the StageLink calls
// around them. The model makes no communication calls; it only provides StageFunctions.
//
// Who calls what: every rank of every stage calls run_pipeline_step once per step with the same
// schedule and micro-batch count (and its own StageFunctions / StageLink); the step returns when
// this rank's plan is done. The caller zeroes parameter gradients before and reduces them (DP, TP,
// embedding) after, as without a pipeline; stages == 1 runs the plain forward/backward loop.
//
// Per micro-batch mb, stage k of p:
//   forward:  x = received activation (undefined on stage 0); y = fn.forward(mb, x); y is sent to
//             stage k+1, or on the last stage is this micro-batch's loss / m.
//   backward: FIFO over the forwards. Autograd from y with the gradient received from stage k+1
//             (last stage: from the loss, gradient 1); parameter gradients accumulate in .grad;
//             x's gradient (dL/dx, zeros if the stage ignored x) is sent to stage k-1.
//   Afterwards x, y and their graph are released: at most the schedule's in-flight micro-batches
//   (1F1B: min(p-k, m); GPipe: m) hold activations at any time. The output's storage is not
//   replaced by a placeholder after its send (Megatron's optional output deallocation, docs/design.md §1.3).
// m < p works (BR-12): the plan then has no steady state.
//
// Errors: std::invalid_argument for a schedule this runner does not run (interleaved_1f1b, zb_h1:
// plans only so far); when forward returns the wrong thing (not a scalar loss on the last
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
  /// Forward of micro-batch `mb` (0..m-1, called in schedule order). `input` is the received
  /// activation, StageLinkShapes::input, a leaf with requires_grad (undefined on stage 0, which
  /// reads its own micro-batch). Returns the output activation (StageLinkShapes::output) on
  /// non-last stages, or on the last stage the scalar loss of that micro-batch ALREADY divided by
  /// the number of micro-batches, so that backward accumulates the mean. The result must carry an
  /// autograd graph (depend on a parameter or on `input`).
  virtual torch::Tensor forward(int mb, const torch::Tensor& input) = 0;
};

struct PipelineStepResult {
  double loss = 0;                        // last stage: sum of its micro-batch losses (each
                                          // already / m, so the mean loss); 0 on other stages
  std::vector<double> microbatch_losses;  // last stage: [m], as returned by forward; else empty
  double seconds = 0;                     // wall time of the whole step on this rank, s
};

/// Runs `schedule` for `microbatches` micro-batches on this rank: stage = link.stage(),
/// stages = link.stages(). REQUIRES microbatches >= 1 (else std::invalid_argument).
PipelineStepResult run_pipeline_step(const PipelineSchedule& schedule, StageFunctions& fn,
                                     StageLink& link, int microbatches);

}  // namespace optcc

// One step of a pipeline schedule on one rank (see pipeline_runner.h).
#include "harness/parallel/pipeline_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <deque>
#include <map>
#include <stdexcept>

#include "harness/parallel/timeline.h"

namespace optcc {
namespace {

struct InFlight {  // one micro-batch between its forward and its backward
  int mb;
  torch::Tensor input;   // [s, b, h_in] leaf, requires_grad (undefined on stage 0)
  torch::Tensor output;  // [s, b, h_out], or the scalar loss / m on the last stage
};

class StepRunner {
 public:
  StepRunner(StageFunctions& fn, StageLink& link) : fn_(fn), link_(link) {}

  // Runs the calls in order; each posts its messages together and waits on all of them.
  void run_calls(const std::vector<P2PCall>& calls) {
    for (const P2PCall& call : calls) {
      std::vector<torch::Tensor> sends(call.messages.size());
      for (size_t i = 0; i < sends.size(); ++i) {
        const P2PMessage& msg = call.messages[i];
        if (msg.dir == P2PDir::kSendForward) sends[i] = take(outputs_, msg.microbatch, "output");
        if (msg.dir == P2PDir::kSendBackward)
          sends[i] = take(input_grads_, msg.microbatch, "input gradient");
      }
      const std::vector<torch::Tensor> got = link_.execute(call, sends);
      for (size_t i = 0; i < got.size(); ++i) {
        const P2PMessage& msg = call.messages[i];
        if (msg.dir == P2PDir::kRecvForward) inputs_[msg.microbatch] = got[i];
        if (msg.dir == P2PDir::kRecvBackward) output_grads_[msg.microbatch] = got[i];
      }
    }
  }

  void forward(int mb) {
    MicrobatchContext mb_context(mb);  // timeline hooks (timeline.h): free when not recording
    TimelineScope event(EventKind::kForward, Stream::kCompute, mb);
    torch::Tensor x;
    if (!link_.is_first_stage()) x = take(inputs_, mb, "input activation");
    torch::Tensor y = fn_.forward(mb, x);
    if (!y.defined() || !y.requires_grad()) {
      throw std::invalid_argument(fmt::format(
          "pipeline stage {}: forward of micro-batch {} returned {}; it must depend on a "
          "parameter or on its input so that backward can run",
          link_.stage(), mb, y.defined() ? "a tensor without autograd graph" : "nothing"));
    }
    if (link_.is_last_stage()) {
      if (y.numel() != 1) {
        throw std::invalid_argument(fmt::format(
            "pipeline stage {} (last): forward of micro-batch {} must return the scalar loss / m, "
            "got shape [{}]",
            link_.stage(), mb, fmt::join(y.sizes(), ", ")));
      }
      result_.microbatch_losses.push_back(y.item<double>());
      result_.loss += result_.microbatch_losses.back();
    } else {
      outputs_[mb] = y.detach();  // what send_forward ships; y keeps the graph
    }
    in_flight_.push_back({mb, std::move(x), std::move(y)});
  }

  void backward(int mb) {
    if (in_flight_.empty() || in_flight_.front().mb != mb) {
      throw std::logic_error(
          fmt::format("pipeline stage {}: backward of micro-batch {} but the "
                      "oldest forward in flight is {}",
                      link_.stage(), mb, in_flight_.empty() ? -1 : in_flight_.front().mb));
    }
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    MicrobatchContext mb_context(mb);
    TimelineScope event(EventKind::kBackward, Stream::kCompute, mb);
    if (link_.is_last_stage()) {
      torch::autograd::backward({f.output});  // d(loss/m)/d(loss/m) = 1
    } else {
      torch::autograd::backward({f.output}, {take(output_grads_, mb, "output gradient")});
    }
    if (!link_.is_first_stage()) {
      torch::Tensor g = f.input.grad();
      input_grads_[mb] = g.defined() ? g : torch::zeros_like(f.input);
    }
  }  // f (input, output and the graph between them) is released here

  PipelineStepResult finish() {
    const size_t left = in_flight_.size() + inputs_.size() + output_grads_.size() +
                        outputs_.size() + input_grads_.size();
    if (left != 0) {
      throw std::logic_error(
          fmt::format("pipeline stage {}: {} activations or gradients left over "
                      "after the step; the plan is inconsistent",
                      link_.stage(), left));
    }
    return std::move(result_);
  }

 private:
  torch::Tensor take(std::map<int, torch::Tensor>& from, int mb, const char* what) {
    auto it = from.find(mb);
    if (it == from.end()) {
      throw std::logic_error(
          fmt::format("pipeline stage {}: the {} of micro-batch {} is not "
                      "there when needed; the plan is inconsistent",
                      link_.stage(), what, mb));
    }
    torch::Tensor t = std::move(it->second);
    from.erase(it);
    return t;
  }

  StageFunctions& fn_;
  StageLink& link_;
  std::deque<InFlight> in_flight_;                      // FIFO: forwards awaiting their backward
  std::map<int, torch::Tensor> inputs_, output_grads_;  // received, not used yet
  std::map<int, torch::Tensor> outputs_, input_grads_;  // computed, not sent yet
  PipelineStepResult result_;
};

}  // namespace

PipelineStepResult run_pipeline_step(const PipelineSchedule& schedule, StageFunctions& fn,
                                     StageLink& link, int microbatches) {
  const auto t0 = std::chrono::steady_clock::now();
  if (schedule.chunks() != 1 || schedule.splits_backward()) {
    throw std::invalid_argument(fmt::format(
        "pipeline schedule '{}': this runner runs one model chunk per stage and whole backwards "
        "(1f1b, gpipe); {} exists as a plan only (schedule.h)",
        schedule.name(), schedule.name()));
  }
  // communication_plan checks stage/stages/microbatches and throws std::invalid_argument.
  const std::vector<StageStep> plan =
      communication_plan(schedule, link.stage(), link.stages(), microbatches);
  StepRunner runner(fn, link);
  for (const StageStep& step : plan) {
    runner.run_calls(step.before);
    if (step.action.op == PipeOp::kForward) {
      runner.forward(step.action.microbatch);
    } else {
      runner.backward(step.action.microbatch);
    }
    runner.run_calls(step.after);
  }
  PipelineStepResult result = runner.finish();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace optcc

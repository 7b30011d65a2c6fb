// One step of a pipeline schedule on one rank (see pipeline_runner.h).
#include "harness/parallel/pipeline_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "harness/parallel/timeline.h"
#include "kernels/gemm.h"

namespace optcc {
namespace {

struct InFlight {  // one (chunk, micro-batch) between its forward and its backward
  torch::Tensor input;   // [s, b, h_in] leaf, requires_grad (undefined on the first virtual stage)
  torch::Tensor output;  // [s, b, h_out], or the scalar loss / m on the last virtual stage
};

using Key = std::pair<int, int>;  // (chunk, micro-batch)

class StepRunner {
 public:
  StepRunner(StageFunctions& fn, StageLink& link, int chunks, bool split)
      : fn_(fn), link_(link), chunks_(chunks), split_(split) {}

  // Runs the calls in order; each posts its messages together and waits on all of them, except a
  // call the plan does not wait on (sends only), which is finished at the end of the step.
  void run_calls(const std::vector<P2PCall>& calls) {
    for (const P2PCall& call : calls) {
      std::vector<torch::Tensor> sends(call.messages.size());
      for (size_t i = 0; i < sends.size(); ++i) {
        const P2PMessage& msg = call.messages[i];
        const Key key{msg.chunk, msg.microbatch};
        if (msg.dir == P2PDir::kSendForward) sends[i] = take(outputs_, key, "output");
        if (msg.dir == P2PDir::kSendBackward) sends[i] = take(input_grads_, key, "input gradient");
      }
      if (!call.wait) {
        unwaited_.push_back(link_.start(call, sends));
        continue;
      }
      const std::vector<torch::Tensor> got = link_.execute(call, sends);
      for (size_t i = 0; i < got.size(); ++i) {
        const P2PMessage& msg = call.messages[i];
        const Key key{msg.chunk, msg.microbatch};
        if (msg.dir == P2PDir::kRecvForward) inputs_[key] = got[i];
        if (msg.dir == P2PDir::kRecvBackward) output_grads_[key] = got[i];
      }
    }
  }

  bool first_virtual(int chunk) const { return link_.is_first_stage() && chunk == 0; }
  bool last_virtual(int chunk) const { return link_.is_last_stage() && chunk == chunks_ - 1; }

  void forward(int chunk, int mb) {
    MicrobatchContext mb_context(mb);  // timeline hooks (timeline.h): free when not recording
    TimelineScope event(EventKind::kForward, Stream::kCompute, mb);
    const Key key{chunk, mb};
    torch::Tensor x;
    if (!first_virtual(chunk)) x = take(inputs_, key, "input activation");
    std::optional<WeightGradDeferral> defer;  // split backward: its GEMMs' weight gradients wait for W
    if (split_) defer.emplace(deferred_);
    torch::Tensor y = fn_.forward(mb, chunk, x);
    defer.reset();
    if (!y.defined() || !y.requires_grad()) {
      throw std::invalid_argument(fmt::format(
          "pipeline stage {}{}: forward of micro-batch {} returned {}; it must depend on a "
          "parameter or on its input so that backward can run",
          link_.stage(), chunk_str(chunk), mb, y.defined() ? "a tensor without autograd graph" : "nothing"));
    }
    if (last_virtual(chunk)) {
      if (y.numel() != 1) {
        throw std::invalid_argument(fmt::format(
            "pipeline stage {}{} (last): forward of micro-batch {} must return the scalar loss / m, "
            "got shape [{}]",
            link_.stage(), chunk_str(chunk), mb, fmt::join(y.sizes(), ", ")));
      }
      result_.microbatch_losses.push_back(y.item<double>());
      result_.loss += result_.microbatch_losses.back();
    } else {
      outputs_[key] = y.detach();  // what send_forward ships; y keeps the graph
    }
    in_flight_[key] = {std::move(x), std::move(y)};
  }

  void backward(int chunk, int mb) {
    auto it = in_flight_.find({chunk, mb});
    if (it == in_flight_.end()) {
      throw std::logic_error(fmt::format("pipeline stage {}{}: backward of micro-batch {} before its forward",
                                         link_.stage(), chunk_str(chunk), mb));
    }
    InFlight f = std::move(it->second);
    in_flight_.erase(it);
    MicrobatchContext mb_context(mb);
    TimelineScope event(EventKind::kBackward, Stream::kCompute, mb);
    if (last_virtual(chunk)) {
      torch::autograd::backward({f.output});  // d(loss/m)/d(loss/m) = 1
    } else {
      torch::autograd::backward({f.output}, {take(output_grads_, {chunk, mb}, "output gradient")});
    }
    if (!first_virtual(chunk)) {
      torch::Tensor g = f.input.grad();
      input_grads_[{chunk, mb}] = g.defined() ? g : torch::zeros_like(f.input);
    }
    if (split_) {  // what W computes
      auto& items = weight_grads_[{chunk, mb}] = deferred_.take();
      result_.deferred_weight_grads += static_cast<int64_t>(items.size());
      for (const auto& i : items) held_bytes_ += i.x.nbytes() + i.dy.nbytes();
      result_.deferred_peak_bytes = std::max(result_.deferred_peak_bytes, held_bytes_);
    }
  }  // f (input, output and the graph between them) is released here

  // W: the weight-gradient GEMMs B deferred (their inputs and output gradients).
  void weight(int chunk, int mb) {
    auto it = weight_grads_.find({chunk, mb});
    if (it == weight_grads_.end()) {
      throw std::logic_error(fmt::format("pipeline stage {}{}: W of micro-batch {} before its B",
                                         link_.stage(), chunk_str(chunk), mb));
    }
    const std::vector<DeferredWeightGrads::Item> items = std::move(it->second);
    weight_grads_.erase(it);
    for (const auto& i : items) held_bytes_ -= i.x.nbytes() + i.dy.nbytes();
    MicrobatchContext mb_context(mb);
    TimelineScope event(EventKind::kBackward, Stream::kCompute, mb);
    DeferredWeightGrads::run(items);
  }

  void finish_unwaited() {
    for (StageLink::Posted& posted : unwaited_) link_.finish(posted);
    unwaited_.clear();
  }

  PipelineStepResult finish() {
    finish_unwaited();
    const size_t left = in_flight_.size() + inputs_.size() + output_grads_.size() +
                        outputs_.size() + input_grads_.size() + weight_grads_.size();
    if (left != 0) {
      throw std::logic_error(
          fmt::format("pipeline stage {}: {} activations or gradients left over "
                      "after the step; the plan is inconsistent",
                      link_.stage(), left));
    }
    return std::move(result_);
  }

 private:
  std::string chunk_str(int chunk) const { return chunks_ > 1 ? fmt::format(" chunk {}", chunk) : ""; }

  torch::Tensor take(std::map<Key, torch::Tensor>& from, Key key, const char* what) {
    auto it = from.find(key);
    if (it == from.end()) {
      throw std::logic_error(
          fmt::format("pipeline stage {}{}: the {} of micro-batch {} is not "
                      "there when needed; the plan is inconsistent",
                      link_.stage(), chunk_str(key.first), what, key.second));
    }
    torch::Tensor t = std::move(it->second);
    from.erase(it);
    return t;
  }

  StageFunctions& fn_;
  StageLink& link_;
  int chunks_;
  bool split_;                                          // B and W (the schedule splits the backward)
  DeferredWeightGrads deferred_;                        // what the running B records
  std::map<Key, std::vector<DeferredWeightGrads::Item>> weight_grads_;  // after B, awaiting W
  int64_t held_bytes_ = 0;                              // their x and dy
  std::vector<StageLink::Posted> unwaited_;             // posted sends not waited on yet
  std::map<Key, InFlight> in_flight_;                   // forwards awaiting their backward
  std::map<Key, torch::Tensor> inputs_, output_grads_;  // received, not used yet
  std::map<Key, torch::Tensor> outputs_, input_grads_;  // computed, not sent yet
  PipelineStepResult result_;
};

}  // namespace

PipelineStepResult run_pipeline_step(const PipelineSchedule& schedule, StageFunctions& fn,
                                     StageLink& link, int microbatches) {
  const auto t0 = std::chrono::steady_clock::now();
  if (schedule.chunks() != link.chunks()) {
    throw std::invalid_argument(fmt::format("pipeline schedule '{}' has {} model chunks per stage, the StageLink {}",
                                            schedule.name(), schedule.chunks(), link.chunks()));
  }
  // communication_plan checks stage/stages/microbatches and throws std::invalid_argument.
  const std::vector<StageStep> plan =
      communication_plan(schedule, link.stage(), link.stages(), microbatches);
  StepRunner runner(fn, link, schedule.chunks(), schedule.splits_backward());
  double compute = 0;
  for (const StageStep& step : plan) {
    runner.run_calls(step.before);
    const auto a0 = std::chrono::steady_clock::now();
    switch (step.action.op) {
      case PipeOp::kForward:
        runner.forward(step.action.chunk, step.action.microbatch);
        break;
      case PipeOp::kBackward:
        runner.backward(step.action.chunk, step.action.microbatch);
        break;
      case PipeOp::kWeight:
        runner.weight(step.action.chunk, step.action.microbatch);
        break;
    }
    compute += std::chrono::duration<double>(std::chrono::steady_clock::now() - a0).count();
    runner.run_calls(step.after);
  }
  PipelineStepResult result = runner.finish();
  result.compute_seconds = compute;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace optcc

// Pipeline schedules as data: each stage's compute order, the p2p calls around it, and a
// simulation of all stages together. Pure C++ (no LibTorch, no communication), so every schedule
// is tested without a process group.
//
// Who calls what: every rank of pipeline stage `stage` (all its tp and dp ranks alike) builds
// communication_plan(schedule, stage, stages, m) once per iteration and runs its steps in order:
// for each StageStep, run the `before` calls, compute the action, run the `after` calls. One call
// posts all of its messages as one batched isend/irecv group and waits on every one of them
// (BR-13) before the next call starts. Messages name their micro-batch, so a receiver knows which
// activation or gradient it got; within a call the message order is fixed (the order listed).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace optcc {

enum class PipeOp { kForward, kBackward };

// Phases, as in Megatron's non-interleaved 1F1B (docs/design.md §1.3), stage k of p, m micro-batches:
//   kWarmup   the w_k = min(p - k - 1, m) forwards that run ahead of the steady state;
//   kSteady   the r_k = m - w_k pairs "forward of micro-batch w_k + j, then backward of j";
//   kCooldown the last w_k backwards (Megatron's "flush", the paper's "epilogue").
// GPipe (all forwards, then all backwards) is 1F1B with the steady state removed: its forwards are
// kWarmup and its backwards kCooldown. Where 1F1B has no steady state either (m <= p - k - 1,
// BR-12) the two schedules give the same actions, phases and plan.
enum class PipePhase { kWarmup, kSteady, kCooldown };

struct PipeAction {
  PipeOp op;
  int microbatch;  // 0..m-1
  PipePhase phase;
  bool operator==(const PipeAction& o) const {
    return op == o.op && microbatch == o.microbatch && phase == o.phase;
  }
};

class PipelineSchedule {
 public:
  virtual ~PipelineSchedule() = default;
  virtual std::string name() const = 0;
  // Compute actions of `stage` (0-based) of `stages`, for `microbatches` micro-batches, in order.
  // Each micro-batch appears once as forward and once as backward, forward first.
  // REQUIRES 0 <= stage < stages, microbatches >= 1 (else std::invalid_argument).
  virtual std::vector<PipeAction> actions(int stage, int stages, int microbatches) const = 0;
};

// Non-interleaved 1F1B as Megatron: warm-up, steady 1F1B pairs, cool-down; micro-batches FIFO.
// Peak in-flight micro-batches on stage k: min(p - k, m).
class OneFOneBSchedule : public PipelineSchedule {
 public:
  std::string name() const override { return "1f1b"; }
  std::vector<PipeAction> actions(int stage, int stages, int microbatches) const override;
};

// GPipe: m forwards (kWarmup), then m backwards (kCooldown), both FIFO. Peak in flight: m.
class GPipeSchedule : public PipelineSchedule {
 public:
  std::string name() const override { return "gpipe"; }
  std::vector<PipeAction> actions(int stage, int stages, int microbatches) const override;
};

// "1f1b" | "gpipe"; an unknown name throws std::invalid_argument listing the known names.
std::unique_ptr<PipelineSchedule> make_schedule(const std::string& name);

// ---- Communication plan (Megatron's p2p vocabulary) ----

enum class P2PDir { kSendForward, kRecvForward, kSendBackward, kRecvBackward };

struct P2PMessage {
  P2PDir dir;      // send/recv forward: activation to k+1 / from k-1;
                   // send/recv backward: input gradient to k-1 / from k+1
  int microbatch;  // whose activation or gradient this is
  int peer_stage;  // k+1 for kSendForward and kRecvBackward, k-1 for the other two
};

// One call: its messages are posted together and all waited on. `flush` marks a call that moves
// backward gradients only (no forward message fused into it): in 1F1B the last steady-state
// SEND_BWD and every cool-down RECV_BWD / SEND_BWD, in GPipe every backward call. Epilogue-only
// CB (docs/design.md §4) compresses a gradient iff its call is flush; the flags of the two ends of every
// message agree (checked by simulate()).
struct P2PCall {
  std::vector<P2PMessage> messages;  // never empty
  PipePhase phase;                   // the phase of the step's action
  bool flush;
};

// One compute action and the calls around it: `before` delivers the action's input (a standalone
// receive), `after` ships its output, possibly fused with the receive the next action needs
// (SEND_FWD_RECV_BWD, SEND_BWD_RECV_FWD; only between two steady-state actions, as Megatron).
struct StageStep {
  std::vector<P2PCall> before;
  PipeAction action;
  std::vector<P2PCall> after;
};

// The plan of one stage, derived from schedule.actions(). Directions to a neighbour that does not
// exist (stage 0 has no previous, the last stage no next) are omitted, and so are calls left empty.
// For 1F1B this is exactly docs/design.md §1.3's call sequence.
std::vector<StageStep> communication_plan(const PipelineSchedule& schedule, int stage, int stages,
                                          int microbatches);

// Epilogue-only CB, sender side: whether `stage` sends the gradient of `microbatch` to stage-1 in a
// flush call (and so compressed). False on stage 0, which sends no gradient. Builds the plan, O(m):
// a runner that executes the plan reads P2PCall::flush instead; both give the same answer.
bool backward_send_is_epilogue(const PipelineSchedule& schedule, int stage, int stages,
                               int microbatches, int microbatch);
// Receiver side: whether `stage` receives the gradient of `microbatch` from stage+1 in a flush
// call. Equals backward_send_is_epilogue(stage + 1, ...). False on the last stage.
bool backward_recv_is_epilogue(const PipelineSchedule& schedule, int stage, int stages,
                               int microbatches, int microbatch);

// ---- Simulation of all stages together ----

// Rendezvous semantics: a call completes once each of its messages is matched by the peer's
// opposite message; matching is FIFO per (sender, receiver, forward|backward) channel.
struct SimulationResult {
  bool deadlock = false;            // some stage unfinished and no stage can progress
  std::vector<std::string> blocked;  // at deadlock: one line per unfinished stage, its blocked call
  std::vector<std::string> errors;   // matched messages disagreeing on micro-batch or flush, wrong
                                     // peers, data sent before computed or used before received
  std::vector<int> peak_in_flight;   // [stages] max of (forwards done - backwards done)
  bool ok() const { return !deadlock && errors.empty(); }
  std::string summary() const;  // all of the above, for logs and test failures
};

SimulationResult simulate(const PipelineSchedule& schedule, int stages, int microbatches);
// The same for hand-made plans, one per stage (index = stage); tests break plans on purpose.
SimulationResult simulate(const std::vector<std::vector<StageStep>>& plans);

// ---- Compact text, for tests and logs ----
std::string to_string(PipePhase phase);  // "warmup" | "steady" | "cooldown"
std::string to_string(P2PDir dir);       // "send_forward" | ... | "recv_backward"
// "warmup: F0 F1 | steady: F2 B0 | cooldown: B1": a label whenever the phase changes.
std::string to_string(const std::vector<PipeAction>& actions);
// "{sf2 rb0}" (send_forward mb 2, recv_backward mb 0); "{sb0}!" when flush.
std::string to_string(const P2PCall& call);
// Steps joined by " | ", each "<before calls> F3 <after calls>".
std::string to_string(const std::vector<StageStep>& plan);

}  // namespace optcc

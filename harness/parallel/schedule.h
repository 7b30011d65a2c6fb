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

// kBackward is the whole backward in 1F1B, GPipe and interleaved 1F1B. Schedules that split it
// (PipelineSchedule::splits_backward(), ZB-H1) run kBackward as B, the input gradient only (what the
// previous stage waits for), and kWeight as W, the weight gradients of the same (chunk, micro-batch),
// which need nothing from other stages and may run later.
enum class PipeOp { kForward, kBackward, kWeight };

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
  int chunk = 0;   // the stage's model chunk (0..v-1; always 0 without interleaving): stage k's chunk c
                   // is virtual stage c*p + k of the v*p, and holds that slice of the layers
  bool operator==(const PipeAction& o) const {
    return op == o.op && microbatch == o.microbatch && phase == o.phase && chunk == o.chunk;
  }
};

// The calls of a plan (communication_plan()), as Megatron makes them:
//   kOneFOneB     each action's output in a call after it, fused with the next action's receive
//                 only between two steady-state actions of opposite kinds (SEND_FWD_RECV_BWD,
//                 SEND_BWD_RECV_FWD); other receives stand alone before their action.
//   kInterleaved  every output fused with the next action's input (SEND_FWD_RECV_FWD in warm-up,
//                 SEND_BWD_RECV_BWD in cool-down); in the steady state a forward's output waits
//                 for its pair's backward, whose call sends both and receives the next pair's two
//                 inputs. Stages of the ring would otherwise each block in a send to the other.
enum class PlanCallStyle { kOneFOneB, kInterleaved };

class PipelineSchedule {
 public:
  virtual ~PipelineSchedule() = default;
  virtual std::string name() const = 0;
  // Model chunks per stage (v): 1, except for the interleaved schedule.
  virtual int chunks() const { return 1; }
  // Whether the actions hold kWeight (W) actions, the backward being split into B and W.
  virtual bool splits_backward() const { return false; }
  // Which calls communication_plan() makes around the actions (PlanCallStyle).
  virtual PlanCallStyle call_style() const { return PlanCallStyle::kOneFOneB; }
  // Compute actions of `stage` (0-based) of `stages`, for `microbatches` micro-batches, in order.
  // Each (chunk, micro-batch) appears once as forward and once as backward, forward first.
  // REQUIRES 0 <= stage < stages, microbatches >= 1 (else std::invalid_argument); a schedule may
  // refuse more (the interleaved one: its rule on m), naming the rule and the fix.
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

// Interleaved 1F1B (Megatron's virtual pipeline stages), v = chunks() >= 2 model chunks per stage.
// Virtual micro-batch j (0..m*v-1) runs on chunk (j mod p*v) / p for a forward, reversed
// (v - 1 - that) for a backward, with micro-batch (j / (p*v)) * p + j mod p: chunk-major groups of p
// micro-batches. Stage k warms up with w_k = min((p - k - 1) * 2 + (v - 1) * p, m*v) forwards, then
// alternates forward j + w_k with backward j, then cools down; when m == p every forward is warm-up
// (Megatron's rule). Forward messages leave chunk c of stage p-1 for chunk c+1 of stage 0, backward
// ones the other way round: the stages form a ring. Peak in-flight (chunk, micro-batch) activations
// on stage k: w_k + 1 (each holds 1/v of the stage's layers), or m*v when m == p.
// Megatron's rule on m: m >= p and m a multiple of p (groups of p per chunk); stages >= 2.
class InterleavedOneFOneBSchedule : public PipelineSchedule {
 public:
  // REQUIRES chunks >= 2 (else std::invalid_argument naming parallel.virtual_stages).
  explicit InterleavedOneFOneBSchedule(int chunks);
  std::string name() const override { return "interleaved_1f1b"; }
  int chunks() const override { return chunks_; }
  PlanCallStyle call_style() const override { return PlanCallStyle::kInterleaved; }
  std::vector<PipeAction> actions(int stage, int stages, int microbatches) const override;

 private:
  int chunks_;
};

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", handcrafted schedule 1): 1F1B's forwards and
// input-gradient backwards (B), with each weight-gradient pass (W) deferred. Stage k warms up with
// w_k = min(p - k - 1, m) forwards like 1F1B, then runs "F (if any left), B j, W j - k (if j >= k)"
// for j = 0..m-1, then the W's left. Delaying W by k keeps every stage at p (chunk, micro-batch)
// activations until their W, 1F1B's peak on stage 0; the W's fill the cool-down's waits. Any m >= 1.
// Phases: the w_k forwards warm-up; then steady while forwards remain, cool-down after.
class ZeroBubbleH1Schedule : public PipelineSchedule {
 public:
  std::string name() const override { return "zb_h1"; }
  bool splits_backward() const override { return true; }
  std::vector<PipeAction> actions(int stage, int stages, int microbatches) const override;
};

// "1f1b" | "gpipe" | "zb_h1"; an unknown name throws std::invalid_argument listing the known names.
std::unique_ptr<PipelineSchedule> make_schedule(const std::string& name);
// The same, and "interleaved_1f1b" with `chunks` (>= 2) model chunks per stage; 1f1b and gpipe
// need chunks == 1.
std::unique_ptr<PipelineSchedule> make_schedule(const std::string& name, int chunks);

// ---- Communication plan (Megatron's p2p vocabulary) ----

enum class P2PDir { kSendForward, kRecvForward, kSendBackward, kRecvBackward };

struct P2PMessage {
  P2PDir dir;      // send/recv forward: activation to the next virtual stage / from the previous;
                   // send/recv backward: input gradient to the previous / from the next
  int microbatch;  // whose activation or gradient this is
  int peer_stage;  // k+1 for kSendForward and kRecvBackward, k-1 for the other two (interleaved:
                   // stage 0 after stage p-1 and the other way round, between chunks)
  int chunk = 0;       // this stage's model chunk the message leaves or reaches
  int peer_chunk = 0;  // the peer's model chunk at the other end (chunk, or chunk +- 1 across the ring)
  // Backward messages: the epilogue (docs/design.md §4), which epilogue-only CB compresses. A gradient
  // is in the epilogue iff its sender posts it after the sender's last forward, so no forward of
  // the sender waits behind it. Both ends carry the sender's value (the receiver derives it from
  // the sender's plan); always false for forward messages. In 1F1B and GPipe it equals the flag
  // `flush` of the calls on both ends (schedule_test checks it).
  bool epilogue = false;
};

// One call: its messages are posted together and all waited on. `flush` marks a call that moves
// backward gradients only (no forward message fused into it): in 1F1B the last steady-state
// SEND_BWD and every cool-down RECV_BWD / SEND_BWD, in GPipe every backward call. It describes the
// call (logs); what is compressed is decided per message by P2PMessage::epilogue, whose two ends
// agree (checked by simulate()).
struct P2PCall {
  std::vector<P2PMessage> messages;  // never empty
  PipePhase phase;                   // the phase of the step's action
  bool flush;
  // false: sends only, posted without waiting; the stage goes on computing and the sends complete
  // when their peers post (a runner waits for them before the step ends). ZB-H1's B sends, so a
  // stage runs its W while the previous stage is still busy; every other call waits.
  bool wait = true;
};

// One compute action and the calls around it: `before` delivers the action's input (a standalone
// receive), `after` ships outputs, possibly fused with receives of the next actions
// (PlanCallStyle says which).
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

// Epilogue-only CB, sender side: whether `stage` sends the gradient of (`chunk`, `microbatch`) to
// the previous virtual stage in the epilogue (and so compressed). False on the first virtual stage
// (stage 0, chunk 0), which sends no gradient. Builds the plan, O(m*v): a runner that executes the
// plan reads P2PMessage::epilogue instead; both give the same answer.
bool backward_send_is_epilogue(const PipelineSchedule& schedule, int stage, int stages,
                               int microbatches, int microbatch, int chunk = 0);
// Receiver side: whether `stage` receives the gradient of (`chunk`, `microbatch`) from the next
// virtual stage in the epilogue: the sender's answer. False on the last virtual stage.
bool backward_recv_is_epilogue(const PipelineSchedule& schedule, int stage, int stages,
                               int microbatches, int microbatch, int chunk = 0);

// The (virtual) stage after / before (stage, chunk) in a pipeline of `stages` stages with `chunks`
// model chunks each: {stage + 1, chunk}, or {0, chunk + 1} after the last stage; {-1, -1} when
// there is none (after stage p-1's last chunk, before stage 0's chunk 0).
struct VirtualStage {
  int stage;
  int chunk;
  bool exists() const { return stage >= 0; }
};
VirtualStage next_virtual_stage(int stage, int chunk, int stages, int chunks);
VirtualStage previous_virtual_stage(int stage, int chunk, int stages, int chunks);

// ---- Simulation of all stages together ----

// Rendezvous semantics: a call completes once each of its messages is matched by the peer's
// opposite message; matching is FIFO per (sender, receiver, forward|backward) channel.
// Time: each action takes its cost (time units; a model chunk's action 1/v of it, v = the plans'
// chunks) and a call ends when the last of its messages' peers has posted (transfers take no
// time), so the makespan and the bubble are the schedule's own, as its analysis assumes.
struct ActionCosts {
  double forward = 1;   // F
  double backward = 1;  // B: the input gradient (a whole backward without W actions costs B + W)
  double weight = 1;    // W: the weight gradients
};
struct SimulationResult {
  bool deadlock = false;            // some stage unfinished and no stage can progress
  std::vector<std::string> blocked;  // at deadlock: one line per unfinished stage, its blocked call
  std::vector<std::string> errors;   // matched messages disagreeing on micro-batch, chunk or
                                     // epilogue, wrong peers, data sent before computed or used
                                     // before received
  std::vector<int> peak_in_flight;   // [stages] max of (forwards done - backwards done; W's done
                                     // where the backward is split), counted in (chunk,
                                     // micro-batch) pairs
  std::vector<double> finish, busy;  // [stages] when each ends, and its compute time (time units)
  double makespan = 0;               // the last stage's end
  // Idle share of all stages' time until the makespan: 1 - sum(busy) / (stages * makespan).
  double bubble_fraction() const;
  bool ok() const { return !deadlock && errors.empty(); }
  std::string summary() const;  // all of the above, for logs and test failures
};

SimulationResult simulate(const PipelineSchedule& schedule, int stages, int microbatches,
                          const ActionCosts& costs = {});
// The same for hand-made plans, one per stage (index = stage); tests break plans on purpose.
SimulationResult simulate(const std::vector<std::vector<StageStep>>& plans, const ActionCosts& costs = {});

// ---- Compact text, for tests and logs ----
std::string to_string(PipePhase phase);  // "warmup" | "steady" | "cooldown"
std::string to_string(P2PDir dir);       // "send_forward" | ... | "recv_backward"
// "warmup: F0 F1 | steady: F2 B0 | cooldown: B1": a label whenever the phase changes; a chunk
// other than 0 follows the micro-batch ("F2@1"); W actions are "W0".
std::string to_string(const std::vector<PipeAction>& actions);
// "{sf2 rb0}" (send_forward mb 2, recv_backward mb 0); a gradient in the epilogue is marked "sb0!";
// a chunk other than 0 follows its micro-batch: "sf2@1"; a call without wait ends in "~".
std::string to_string(const P2PCall& call);
// Steps joined by " | ", each "<before calls> F3 <after calls>".
std::string to_string(const std::vector<StageStep>& plan);

}  // namespace optcc

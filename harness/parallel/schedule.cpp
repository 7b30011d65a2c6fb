// Pipeline schedules, their p2p plans and the all-stage simulation (see schedule.h).
#include "harness/parallel/schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

namespace optcc {
namespace {

void check_args(int stage, int stages, int microbatches) {
  if (stages < 1 || stage < 0 || stage >= stages || microbatches < 1) {
    throw std::invalid_argument(fmt::format(
        "pipeline schedule: stage={} stages={} microbatches={}: need stages >= 1, "
        "0 <= stage < stages and microbatches >= 1",
        stage, stages, microbatches));
  }
}

bool is_forward(P2PDir d) { return d == P2PDir::kSendForward || d == P2PDir::kRecvForward; }
bool is_send(P2PDir d) { return d == P2PDir::kSendForward || d == P2PDir::kSendBackward; }
bool toward_next(P2PDir d) { return d == P2PDir::kSendForward || d == P2PDir::kRecvBackward; }
VirtualStage expected_peer(P2PDir d, int stage, int chunk, int stages, int chunks) {
  return toward_next(d) ? next_virtual_stage(stage, chunk, stages, chunks)
                        : previous_virtual_stage(stage, chunk, stages, chunks);
}

std::string chunk_suffix(int chunk) { return chunk == 0 ? "" : fmt::format("@{}", chunk); }

std::string to_string(const PipeAction& a) {
  static const char kLetter[] = {'F', 'B', 'W'};
  return fmt::format("{}{}{}", kLetter[static_cast<int>(a.op)], a.microbatch, chunk_suffix(a.chunk));
}

// Flags, indexed chunk * m + micro-batch, of the backwards `acts` computes after its last forward:
// the gradients this stage sends in the epilogue (P2PMessage::epilogue).
std::vector<char> epilogue_backwards(const std::vector<PipeAction>& acts, int m, int chunks) {
  std::vector<char> out(static_cast<size_t>(m) * chunks, 0);
  size_t after_last_forward = 0;
  for (size_t i = 0; i < acts.size(); ++i) {
    if (acts[i].op == PipeOp::kForward) after_last_forward = i + 1;
  }
  for (size_t i = after_last_forward; i < acts.size(); ++i) {
    if (acts[i].op == PipeOp::kBackward) out[static_cast<size_t>(acts[i].chunk) * m + acts[i].microbatch] = 1;
  }
  return out;
}

// The epilogue flag `stage`'s plan gives its message (dir, chunk, microbatch); false if it has none.
bool message_epilogue(const PipelineSchedule& s, int stage, int stages, int m, int mb, int chunk,
                      P2PDir dir) {
  if (mb < 0 || mb >= m || chunk < 0 || chunk >= s.chunks()) {
    throw std::invalid_argument(fmt::format("micro-batch {} of chunk {} out of range 0..{} of 0..{}", mb,
                                            chunk, m - 1, s.chunks() - 1));
  }
  for (const StageStep& step : communication_plan(s, stage, stages, m)) {
    for (const auto* calls : {&step.before, &step.after}) {
      for (const P2PCall& call : *calls) {
        for (const P2PMessage& msg : call.messages) {
          if (msg.dir == dir && msg.microbatch == mb && msg.chunk == chunk) return msg.epilogue;
        }
      }
    }
  }
  return false;
}

}  // namespace

VirtualStage next_virtual_stage(int stage, int chunk, int stages, int chunks) {
  if (stage + 1 < stages) return {stage + 1, chunk};
  if (chunk + 1 < chunks) return {0, chunk + 1};
  return {-1, -1};
}

VirtualStage previous_virtual_stage(int stage, int chunk, int stages, int chunks) {
  if (stage > 0) return {stage - 1, chunk};
  if (chunk > 0) return {stages - 1, chunk - 1};
  return {-1, -1};
}

std::vector<PipeAction> OneFOneBSchedule::actions(int stage, int stages, int m) const {
  check_args(stage, stages, m);
  const int warmup = std::min(stages - stage - 1, m);  // Megatron; min(...) covers m < p (BR-12)
  std::vector<PipeAction> out;
  for (int i = 0; i < warmup; ++i) out.push_back({PipeOp::kForward, i, PipePhase::kWarmup});
  for (int j = 0; j < m - warmup; ++j) {
    out.push_back({PipeOp::kForward, warmup + j, PipePhase::kSteady});
    out.push_back({PipeOp::kBackward, j, PipePhase::kSteady});
  }
  for (int i = m - warmup; i < m; ++i) out.push_back({PipeOp::kBackward, i, PipePhase::kCooldown});
  return out;
}

std::vector<PipeAction> GPipeSchedule::actions(int stage, int stages, int m) const {
  check_args(stage, stages, m);
  std::vector<PipeAction> out;
  for (int i = 0; i < m; ++i) out.push_back({PipeOp::kForward, i, PipePhase::kWarmup});
  for (int i = 0; i < m; ++i) out.push_back({PipeOp::kBackward, i, PipePhase::kCooldown});
  return out;
}

InterleavedOneFOneBSchedule::InterleavedOneFOneBSchedule(int chunks) : chunks_(chunks) {
  if (chunks < 2) {
    throw std::invalid_argument(fmt::format(
        "interleaved 1F1B with parallel.virtual_stages = {}: it needs at least 2 model chunks per stage. "
        "Fix: parallel.virtual_stages >= 2, or parallel.schedule: 1f1b",
        chunks));
  }
}

std::vector<PipeAction> InterleavedOneFOneBSchedule::actions(int stage, int p, int m) const {
  check_args(stage, p, m);
  if (p < 2) {
    throw std::invalid_argument(fmt::format(
        "interleaved 1F1B with {} pipeline stage: it needs at least 2. Fix: parallel.schedule: 1f1b "
        "(the same as no pipeline at pp = 1), or parallel.pp >= 2",
        p));
  }
  if (m % p != 0) {
    const int below = m / p * p;
    throw std::invalid_argument(fmt::format(
        "interleaved 1F1B with {} micro-batches per step on {} pipeline stages: the micro-batches must "
        "be a multiple of the stages (each chunk runs them in groups of p, as Megatron). Fix: a "
        "train.global_batch_size that gives {}{} micro-batches, or parallel.schedule: 1f1b",
        m, p, below >= p ? fmt::format("{} or ", below) : "", below + p));
  }
  const int v = chunks_;
  const int total = m * v;  // virtual micro-batches: (chunk, micro-batch) pairs
  auto chunk_of = [&](int j, bool forward) {
    const int c = (j % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int j) { return j / (p * v) * p + j % p; };
  const int warmup = m == p ? total : std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  std::vector<PipeAction> out;
  auto add = [&](PipeOp op, int j, PipePhase phase) {
    out.push_back({op, microbatch_of(j), phase, chunk_of(j, op == PipeOp::kForward)});
  };
  for (int j = 0; j < warmup; ++j) add(PipeOp::kForward, j, PipePhase::kWarmup);
  for (int j = 0; j < total - warmup; ++j) {
    add(PipeOp::kForward, warmup + j, PipePhase::kSteady);
    add(PipeOp::kBackward, j, PipePhase::kSteady);
  }
  for (int j = total - warmup; j < total; ++j) add(PipeOp::kBackward, j, PipePhase::kCooldown);
  return out;
}

std::vector<PipeAction> ZeroBubbleH1Schedule::actions(int stage, int stages, int m) const {
  check_args(stage, stages, m);
  const int warmup = std::min(stages - stage - 1, m);
  const int delay = stage;  // W of micro-batch j runs after B of j + stage
  std::vector<PipeAction> out;
  for (int i = 0; i < warmup; ++i) out.push_back({PipeOp::kForward, i, PipePhase::kWarmup});
  int weights = 0;  // W's done: 0..weights-1
  for (int j = 0; j < m; ++j) {
    const bool forward_left = warmup + j < m;
    const PipePhase phase = forward_left ? PipePhase::kSteady : PipePhase::kCooldown;
    if (forward_left) out.push_back({PipeOp::kForward, warmup + j, phase});
    out.push_back({PipeOp::kBackward, j, phase});
    if (j >= delay) out.push_back({PipeOp::kWeight, weights++, phase});
  }
  while (weights < m) out.push_back({PipeOp::kWeight, weights++, PipePhase::kCooldown});
  return out;
}

std::unique_ptr<PipelineSchedule> make_schedule(const std::string& name) {
  if (name == "1f1b") return std::make_unique<OneFOneBSchedule>();
  if (name == "gpipe") return std::make_unique<GPipeSchedule>();
  if (name == "zb_h1") return std::make_unique<ZeroBubbleH1Schedule>();
  throw std::invalid_argument(fmt::format(
      "unknown pipeline schedule '{}'; known schedules: 1f1b, gpipe, zb_h1, interleaved_1f1b (with chunks)", name));
}

std::unique_ptr<PipelineSchedule> make_schedule(const std::string& name, int chunks) {
  if (name == "interleaved_1f1b") return std::make_unique<InterleavedOneFOneBSchedule>(chunks);
  if (chunks != 1) {
    throw std::invalid_argument(fmt::format(
        "pipeline schedule '{}' runs one model chunk per stage, not {}; only interleaved_1f1b runs more",
        name, chunks));
  }
  return make_schedule(name);
}

namespace {

// Builds one stage's plan (communication_plan): the messages of each action, with their peers and
// epilogue flags, grouped into calls as the schedule's PlanCallStyle says.
class PlanBuilder {
 public:
  PlanBuilder(const PipelineSchedule& schedule, int stage, int stages, int m)
      : schedule_(schedule),
        stage_(stage),
        stages_(stages),
        m_(m),
        v_(schedule.chunks()),
        acts_(schedule.actions(stage, stages, m)),
        have_input_(index(v_, 0), false),
        have_grad_(index(v_, 0), false),
        send_epilogue_(epilogue_backwards(acts_, m, v_)) {}

  std::vector<StageStep> build() {
    std::vector<StageStep> plan;
    for (size_t n = 0; n < acts_.size(); ++n) {
      const PipeAction& a = acts_[n];
      StageStep step{{}, a, {}};
      if (a.op != PipeOp::kWeight) {  // W: local, no message (its B received the gradient it needs)
        std::vector<P2PMessage> in;
        recv_input_of(a, in);  // a standalone receive, when no earlier call brought the input
        add_call(step.before, std::move(in), a.phase);
        after(n, step.after);
      }
      plan.push_back(std::move(step));
    }
    return plan;
  }

 private:
  size_t index(int chunk, int mb) const { return static_cast<size_t>(chunk) * m_ + mb; }

  // The epilogue flag of a gradient this stage receives: its sender's (the next virtual stage,
  // stage + 1 or stage 0 across the ring), from the sender's own actions.
  bool recv_epilogue(VirtualStage from, int mb) {
    auto it = sender_epilogue_.find(from.stage);
    if (it == sender_epilogue_.end()) {
      it = sender_epilogue_.emplace(from.stage, epilogue_backwards(schedule_.actions(from.stage, stages_, m_), m_, v_))
               .first;
    }
    return it->second[index(from.chunk, mb)] != 0;
  }

  // Appends this stage's message (d, chunk, mb); false when its virtual stage has no such peer.
  bool message(P2PDir d, int chunk, int mb, std::vector<P2PMessage>& out) {
    const VirtualStage peer = expected_peer(d, stage_, chunk, stages_, v_);
    if (!peer.exists()) return false;
    const bool epilogue = d == P2PDir::kSendBackward   ? send_epilogue_[index(chunk, mb)] != 0
                          : d == P2PDir::kRecvBackward ? recv_epilogue(peer, mb)
                                                       : false;
    out.push_back(P2PMessage{d, mb, peer.stage, chunk, peer.chunk, epilogue});
    return true;
  }

  void send_output_of(const PipeAction& a, std::vector<P2PMessage>& out) {
    message(a.op == PipeOp::kForward ? P2PDir::kSendForward : P2PDir::kSendBackward, a.chunk, a.microbatch, out);
  }

  // Appends the receive of action b's input unless an earlier call brought it.
  void recv_input_of(const PipeAction& b, std::vector<P2PMessage>& out) {
    const bool forward = b.op == PipeOp::kForward;
    std::vector<bool>& have = forward ? have_input_ : have_grad_;
    if (have[index(b.chunk, b.microbatch)]) return;
    if (message(forward ? P2PDir::kRecvForward : P2PDir::kRecvBackward, b.chunk, b.microbatch, out)) {
      have[index(b.chunk, b.microbatch)] = true;
    }
  }

  static void add_call(std::vector<P2PCall>& calls, std::vector<P2PMessage> msgs, PipePhase phase,
                       bool wait = true) {
    if (msgs.empty()) return;
    const bool flush = std::none_of(msgs.begin(), msgs.end(), [](const P2PMessage& x) { return is_forward(x.dir); });
    calls.push_back({std::move(msgs), phase, flush, wait});
  }

  // The calls after action n (not a W).
  void after(size_t n, std::vector<P2PCall>& calls) {
    const PipeAction& a = acts_[n];
    const PipeAction* next = n + 1 < acts_.size() ? &acts_[n + 1] : nullptr;
    const bool forward = a.op == PipeOp::kForward;
    const bool steady = a.phase == PipePhase::kSteady;
    std::vector<P2PMessage> out;
    if (!forward && schedule_.splits_backward()) {
      // ZB-H1's B: its gradient leaves at once, without waiting, so the W's fill the time until
      // the previous stage takes it.
      send_output_of(a, out);
      add_call(calls, std::move(out), a.phase, /*wait=*/false);
      return;
    }
    if (schedule_.call_style() == PlanCallStyle::kOneFOneB) {
      // Megatron's 1F1B: the output, fused with the next action's receive only between two
      // steady-state actions of opposite kinds.
      send_output_of(a, out);
      if (next && steady && next->phase == PipePhase::kSteady && next->op != a.op && next->op != PipeOp::kWeight) {
        recv_input_of(*next, out);
      }
    } else if (!(forward && steady)) {
      // Megatron's interleaved calls: a steady forward's output waits for its pair's backward, which
      // then sends both and receives the next pair's two inputs (send_forward_backward_recv_
      // forward_backward); elsewhere the output goes with the next action's input, and the last
      // warm-up forward also receives the first steady backward's gradient.
      if (!forward && steady) send_output_of(acts_[n - 1], out);  // the pair's forward
      send_output_of(a, out);
      if (next) recv_input_of(*next, out);
      if (next && next->op == PipeOp::kForward && next->phase == PipePhase::kSteady) recv_input_of(acts_[n + 2], out);
    }
    add_call(calls, std::move(out), a.phase);
  }

  const PipelineSchedule& schedule_;
  const int stage_, stages_, m_, v_;
  const std::vector<PipeAction> acts_;
  std::vector<bool> have_input_, have_grad_;  // received by an earlier fused call, by index()
  const std::vector<char> send_epilogue_;     // this stage's epilogue sends, by index()
  std::map<int, std::vector<char>> sender_epilogue_;  // by sender stage
};

}  // namespace

std::vector<StageStep> communication_plan(const PipelineSchedule& schedule, int stage, int stages,
                                          int m) {
  return PlanBuilder(schedule, stage, stages, m).build();
}

bool backward_send_is_epilogue(const PipelineSchedule& s, int stage, int stages, int m, int mb, int chunk) {
  return message_epilogue(s, stage, stages, m, mb, chunk, P2PDir::kSendBackward);
}

bool backward_recv_is_epilogue(const PipelineSchedule& s, int stage, int stages, int m, int mb, int chunk) {
  return message_epilogue(s, stage, stages, m, mb, chunk, P2PDir::kRecvBackward);
}

// ---- Simulation ----
namespace {

struct Posted {  // a message as posted
  int stage, microbatch, chunk, peer_chunk;
  bool epilogue;
  double time;  // the poster's clock when it posted the message
};
struct Channel { std::vector<Posted> sends, recvs; };   // n-th send matches n-th recv (FIFO)
using ChannelKey = std::tuple<int, int, bool>;  // (sender, receiver, forward?)

struct Item {  // one entry of a stage's flattened plan: a call, or (call == nullptr) a compute
  const P2PCall* call;
  const PipeAction* action;  // the step's action: computed, or the one the call sits around
  bool before;
};

struct StageState {
  std::vector<Item> items;
  size_t pos = 0;
  bool posted = false;
  std::vector<size_t> seq;  // index of each message of the current call in its channel list
  std::set<std::pair<int, int>> fwd_done, bwd_done, w_done, have_input, have_grad;  // (chunk, micro-batch)
  bool split = false;  // the plan has W actions: activations are held until W, not B
  int peak = 0;
  double clock = 0, busy = 0;  // time units: the stage's time and its compute time so far
};

class Simulator {
 public:
  Simulator(const std::vector<std::vector<StageStep>>& plans, const ActionCosts& costs)
      : stages_(plans.size()), costs_(costs) {
    states_.resize(stages_);
    for (int s = 0; s < stages_; ++s) {
      for (const StageStep& step : plans[s]) {
        std::vector<Item>& items = states_[s].items;
        for (const P2PCall& c : step.before) items.push_back({&c, &step.action, true});
        items.push_back({nullptr, &step.action, false});
        for (const P2PCall& c : step.after) items.push_back({&c, &step.action, false});
        chunks_ = std::max(chunks_, step.action.chunk + 1);  // the plans' chunks: v
        if (step.action.op == PipeOp::kWeight) states_[s].split = true;
      }
    }
  }

  SimulationResult run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int s = 0; s < stages_; ++s) {
        while (advance(s)) progress = true;
      }
    }
    for (const auto& [key, ch] : channels_) {  // sends nobody received (a call without wait)
      for (size_t i = ch.recvs.size(); i < ch.sends.size(); ++i) {
        error("stage {}: a {} message (mb {}) to stage {} was never received", std::get<0>(key),
              std::get<2>(key) ? "forward" : "backward", ch.sends[i].microbatch, std::get<1>(key));
      }
    }
    for (int s = 0; s < stages_; ++s) {
      const StageState& st = states_[s];
      result_.peak_in_flight.push_back(st.peak);
      result_.finish.push_back(st.clock);
      result_.busy.push_back(st.busy);
      result_.makespan = std::max(result_.makespan, st.clock);
      if (st.pos < st.items.size()) {
        result_.deadlock = true;
        result_.blocked.push_back(describe_blocked(s));
      }
    }
    return std::move(result_);
  }

 private:
  Channel& channel(int s, const P2PMessage& m) {
    const int from = is_send(m.dir) ? s : m.peer_stage;
    const int to = is_send(m.dir) ? m.peer_stage : s;
    return channels_[ChannelKey{from, to, is_forward(m.dir)}];
  }
  // Whether the peer has posted the counterpart of stage s's message number `seq` on its channel.
  bool matched(int s, const P2PMessage& m, size_t seq) {
    Channel& ch = channel(s, m);
    return (is_send(m.dir) ? ch.recvs : ch.sends).size() > seq;
  }

  void post(int s, const P2PCall& call) {
    StageState& st = states_[s];
    st.seq.clear();
    for (const P2PMessage& m : call.messages) {
      const VirtualStage want = expected_peer(m.dir, s, m.chunk, stages_, chunks_);
      if (m.peer_stage != want.stage || m.peer_chunk != want.chunk) {
        error("stage {}: {} mb {}{} addressed to stage {} chunk {}, expected stage {} chunk {}", s,
              to_string(m.dir), m.microbatch, chunk_suffix(m.chunk), m.peer_stage, m.peer_chunk,
              want.stage, want.chunk);
      }
      const std::pair<int, int> key{m.chunk, m.microbatch};
      if (m.dir == P2PDir::kSendForward && !st.fwd_done.count(key)) {
        error("stage {}: send_forward mb {}{} before its forward", s, m.microbatch, chunk_suffix(m.chunk));
      }
      if (m.dir == P2PDir::kSendBackward && !st.bwd_done.count(key)) {
        error("stage {}: send_backward mb {}{} before its backward", s, m.microbatch, chunk_suffix(m.chunk));
      }
      Channel& ch = channel(s, m);
      std::vector<Posted>& mine = is_send(m.dir) ? ch.sends : ch.recvs;
      const std::vector<Posted>& theirs = is_send(m.dir) ? ch.recvs : ch.sends;
      st.seq.push_back(mine.size());
      mine.push_back({s, m.microbatch, m.chunk, m.peer_chunk, m.epilogue, st.clock});
      if (theirs.size() < mine.size()) continue;  // the peer's side is not posted yet
      const Posted& peer = theirs[mine.size() - 1];
      if (m.microbatch != peer.microbatch || m.epilogue != peer.epilogue || m.peer_chunk != peer.chunk ||
          m.chunk != peer.peer_chunk) {
        error("stage {} {} (mb {}, chunk {} to {}, epilogue {}) matched stage {}'s message (mb {}, chunk {} "
              "to {}, epilogue {})",
              s, to_string(m.dir), m.microbatch, m.chunk, m.peer_chunk, m.epilogue, peer.stage,
              peer.microbatch, peer.chunk, peer.peer_chunk, peer.epilogue);
      }
    }
  }

  void compute(int s, const PipeAction& a) {
    StageState& st = states_[s];
    const std::pair<int, int> key{a.chunk, a.microbatch};
    const std::string name = to_string(a);
    if (a.op == PipeOp::kForward) {
      if (previous_virtual_stage(s, a.chunk, stages_, chunks_).exists() && !st.have_input.count(key)) {
        error("stage {}: {} before its input arrived", s, name);
      }
      st.fwd_done.insert(key);
    } else if (a.op == PipeOp::kWeight) {
      if (!st.bwd_done.count(key)) error("stage {}: {} before its B", s, name);
      if (!st.w_done.insert(key).second) error("stage {}: {} twice", s, name);
    } else {
      if (!st.fwd_done.count(key)) error("stage {}: {} before its forward", s, name);
      if (next_virtual_stage(s, a.chunk, stages_, chunks_).exists() && !st.have_grad.count(key)) {
        error("stage {}: {} before its output gradient arrived", s, name);
      }
      st.bwd_done.insert(key);
    }
    // A chunk is 1/v of the stage's layers; a whole backward (no W of its own) costs B + W.
    const double cost = a.op == PipeOp::kForward    ? costs_.forward
                        : a.op == PipeOp::kWeight   ? costs_.weight
                        : st.split                  ? costs_.backward
                                                    : costs_.backward + costs_.weight;
    st.clock += cost / chunks_;
    st.busy += cost / chunks_;
    const size_t released = st.split ? st.w_done.size() : st.bwd_done.size();
    st.peak = std::max(st.peak, static_cast<int>(st.fwd_done.size() - released));
  }

  // Runs stage s's next item if it can; true if anything changed.
  bool advance(int s) {
    StageState& st = states_[s];
    if (st.pos >= st.items.size()) return false;
    const Item& item = st.items[st.pos];
    if (!item.call) {
      compute(s, *item.action);
      ++st.pos;
      return true;
    }
    const bool newly_posted = !st.posted;
    if (newly_posted) post(s, *item.call);
    st.posted = true;
    if (!item.call->wait) {  // posted; its sends complete when the peers post
      st.posted = false;
      ++st.pos;
      return true;
    }
    for (size_t i = 0; i < item.call->messages.size(); ++i) {
      if (!matched(s, item.call->messages[i], st.seq[i])) return newly_posted;
    }
    // Done when the last of its messages' peers posted (transfers take no time here).
    for (size_t i = 0; i < item.call->messages.size(); ++i) {
      const P2PMessage& m = item.call->messages[i];
      Channel& ch = channel(s, m);
      st.clock = std::max(st.clock, (is_send(m.dir) ? ch.recvs : ch.sends)[st.seq[i]].time);
    }
    for (const P2PMessage& m : item.call->messages) {
      if (m.dir == P2PDir::kRecvForward) st.have_input.insert({m.chunk, m.microbatch});
      if (m.dir == P2PDir::kRecvBackward) st.have_grad.insert({m.chunk, m.microbatch});
    }
    st.posted = false;
    ++st.pos;
    return true;
  }

  std::string describe_blocked(int s) {  // only calls block: a compute always runs
    const StageState& st = states_[s];
    const Item& item = st.items[st.pos];
    std::string waiting;
    for (size_t i = 0; i < item.call->messages.size(); ++i) {
      const P2PMessage& m = item.call->messages[i];
      if (st.posted && matched(s, m, st.seq[i])) continue;
      waiting += fmt::format("{}{} mb {}{} {} stage {}", waiting.empty() ? "" : ", ", to_string(m.dir),
                             m.microbatch, chunk_suffix(m.chunk), is_send(m.dir) ? "to" : "from",
                             m.peer_stage);
    }
    return fmt::format("stage {}: blocked in call {} ({}) {} {}; unmatched: {}", s,
                       to_string(*item.call), to_string(item.call->phase),
                       item.before ? "before" : "after", to_string(*item.action), waiting);
  }

  template <typename... Args>
  void error(const char* format, const Args&... args) {
    result_.errors.push_back(fmt::vformat(format, fmt::make_format_args(args...)));
  }

  int stages_;
  ActionCosts costs_;
  int chunks_ = 1;
  std::vector<StageState> states_;
  std::map<ChannelKey, Channel> channels_;
  SimulationResult result_;
};

}  // namespace

SimulationResult simulate(const std::vector<std::vector<StageStep>>& plans, const ActionCosts& costs) {
  return Simulator(plans, costs).run();
}

SimulationResult simulate(const PipelineSchedule& schedule, int stages, int microbatches,
                          const ActionCosts& costs) {
  std::vector<std::vector<StageStep>> plans;
  for (int s = 0; s < stages; ++s) {
    plans.push_back(communication_plan(schedule, s, stages, microbatches));
  }
  return simulate(plans, costs);
}

double SimulationResult::bubble_fraction() const {
  if (makespan <= 0 || busy.empty()) return 0;
  double total = 0;
  for (double b : busy) total += b;
  return 1.0 - total / (makespan * static_cast<double>(busy.size()));
}

std::string SimulationResult::summary() const {
  std::string out = fmt::format("deadlock: {}; peak in flight per stage: [{}]; makespan {:.4g}, bubble {:.4g}",
                                deadlock, fmt::join(peak_in_flight, ", "), makespan, bubble_fraction());
  for (const std::string& b : blocked) out += "\n  " + b;
  for (const std::string& e : errors) out += "\n  error: " + e;
  return out;
}

// ---- Text ----

std::string to_string(PipePhase phase) {
  static const char* kNames[] = {"warmup", "steady", "cooldown"};
  return kNames[static_cast<int>(phase)];
}

std::string to_string(P2PDir dir) {
  static const char* kNames[] = {"send_forward", "recv_forward", "send_backward", "recv_backward"};
  return kNames[static_cast<int>(dir)];
}

std::string to_string(const std::vector<PipeAction>& actions) {
  std::string out;
  for (size_t i = 0; i < actions.size(); ++i) {
    if (i == 0 || actions[i].phase != actions[i - 1].phase) {
      out += fmt::format("{}{}:", i == 0 ? "" : " | ", to_string(actions[i].phase));
    }
    out += " " + to_string(actions[i]);
  }
  return out;
}

std::string to_string(const P2PCall& call) {
  static const char* kShort[] = {"sf", "rf", "sb", "rb"};
  std::vector<std::string> parts;
  for (const P2PMessage& m : call.messages) {
    parts.push_back(fmt::format("{}{}{}{}", kShort[static_cast<int>(m.dir)], m.microbatch, chunk_suffix(m.chunk),
                                m.epilogue ? "!" : ""));
  }
  return fmt::format("{{{}}}{}", fmt::join(parts, " "), call.wait ? "" : "~");
}

std::string to_string(const std::vector<StageStep>& plan) {
  std::vector<std::string> steps;
  for (const StageStep& step : plan) {
    std::vector<std::string> parts;
    for (const P2PCall& c : step.before) parts.push_back(to_string(c));
    parts.push_back(to_string(step.action));
    for (const P2PCall& c : step.after) parts.push_back(to_string(c));
    steps.push_back(fmt::format("{}", fmt::join(parts, " ")));
  }
  return fmt::format("{}", fmt::join(steps, " | "));
}

}  // namespace optcc

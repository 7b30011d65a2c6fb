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
int expected_peer(P2PDir d, int stage) {
  return d == P2PDir::kSendForward || d == P2PDir::kRecvBackward ? stage + 1 : stage - 1;
}

std::string to_string(const PipeAction& a) {
  return fmt::format("{}{}", a.op == PipeOp::kForward ? 'F' : 'B', a.microbatch);
}

// Whether `stage`'s message (dir, microbatch) travels in a flush call; false if it has none.
bool message_is_flush(const PipelineSchedule& s, int stage, int stages, int m, int mb, P2PDir dir) {
  if (mb < 0 || mb >= m) {
    throw std::invalid_argument(fmt::format("micro-batch {} out of range 0..{}", mb, m - 1));
  }
  for (const StageStep& step : communication_plan(s, stage, stages, m)) {
    for (const auto* calls : {&step.before, &step.after}) {
      for (const P2PCall& call : *calls) {
        for (const P2PMessage& msg : call.messages) {
          if (msg.dir == dir && msg.microbatch == mb) return call.flush;
        }
      }
    }
  }
  return false;
}

}  // namespace

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

std::unique_ptr<PipelineSchedule> make_schedule(const std::string& name) {
  if (name == "1f1b") return std::make_unique<OneFOneBSchedule>();
  if (name == "gpipe") return std::make_unique<GPipeSchedule>();
  throw std::invalid_argument(
      fmt::format("unknown pipeline schedule '{}'; known schedules: 1f1b, gpipe", name));
}

std::vector<StageStep> communication_plan(const PipelineSchedule& schedule, int stage, int stages,
                                          int m) {
  const std::vector<PipeAction> acts = schedule.actions(stage, stages, m);
  const bool has_prev = stage > 0;
  const bool has_next = stage + 1 < stages;
  std::vector<bool> have_input(m, false), have_grad(m, false);  // received by an earlier fused call
  auto msg = [&](P2PDir d, int mb) { return P2PMessage{d, mb, expected_peer(d, stage)}; };
  auto add_call = [](std::vector<P2PCall>& calls, std::vector<P2PMessage> msgs, PipePhase phase) {
    if (msgs.empty()) return;
    const bool flush = std::none_of(msgs.begin(), msgs.end(),
                                    [](const P2PMessage& x) { return is_forward(x.dir); });
    calls.push_back({std::move(msgs), phase, flush});
  };

  std::vector<StageStep> plan;
  for (size_t n = 0; n < acts.size(); ++n) {
    const PipeAction& a = acts[n];
    const PipeAction* next = n + 1 < acts.size() ? &acts[n + 1] : nullptr;
    // Megatron fuses a send with the next action's receive only inside the steady state.
    const bool fuse = next && a.phase == PipePhase::kSteady && next->phase == PipePhase::kSteady &&
                      next->op != a.op;
    StageStep step{{}, a, {}};
    std::vector<P2PMessage> out;
    if (a.op == PipeOp::kForward) {
      if (has_prev && !have_input[a.microbatch]) {
        add_call(step.before, {msg(P2PDir::kRecvForward, a.microbatch)}, a.phase);
      }
      if (has_next) {
        out.push_back(msg(P2PDir::kSendForward, a.microbatch));
        if (fuse) {
          out.push_back(msg(P2PDir::kRecvBackward, next->microbatch));
          have_grad[next->microbatch] = true;
        }
      }
    } else {
      if (has_next && !have_grad[a.microbatch]) {
        add_call(step.before, {msg(P2PDir::kRecvBackward, a.microbatch)}, a.phase);
      }
      if (has_prev) {
        out.push_back(msg(P2PDir::kSendBackward, a.microbatch));
        if (fuse) {
          out.push_back(msg(P2PDir::kRecvForward, next->microbatch));
          have_input[next->microbatch] = true;
        }
      }
    }
    add_call(step.after, std::move(out), a.phase);
    plan.push_back(std::move(step));
  }
  return plan;
}

bool backward_send_is_epilogue(const PipelineSchedule& s, int stage, int stages, int m, int mb) {
  return message_is_flush(s, stage, stages, m, mb, P2PDir::kSendBackward);
}

bool backward_recv_is_epilogue(const PipelineSchedule& s, int stage, int stages, int m, int mb) {
  return message_is_flush(s, stage, stages, m, mb, P2PDir::kRecvBackward);
}

// ---- Simulation ----
namespace {

struct Posted { int stage, microbatch; bool flush; };  // one message, as its stage posted it
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
  std::set<int> fwd_done, bwd_done, have_input, have_grad;
  int peak = 0;
};

class Simulator {
 public:
  explicit Simulator(const std::vector<std::vector<StageStep>>& plans) : stages_(plans.size()) {
    states_.resize(stages_);
    for (int s = 0; s < stages_; ++s) {
      for (const StageStep& step : plans[s]) {
        std::vector<Item>& items = states_[s].items;
        for (const P2PCall& c : step.before) items.push_back({&c, &step.action, true});
        items.push_back({nullptr, &step.action, false});
        for (const P2PCall& c : step.after) items.push_back({&c, &step.action, false});
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
    for (int s = 0; s < stages_; ++s) {
      const StageState& st = states_[s];
      result_.peak_in_flight.push_back(st.peak);
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
      if (m.peer_stage != expected_peer(m.dir, s)) {
        error("stage {}: {} mb {} addressed to stage {}, expected {}", s, to_string(m.dir),
              m.microbatch, m.peer_stage, expected_peer(m.dir, s));
      }
      if (m.dir == P2PDir::kSendForward && !st.fwd_done.count(m.microbatch)) {
        error("stage {}: send_forward mb {} before its forward", s, m.microbatch);
      }
      if (m.dir == P2PDir::kSendBackward && !st.bwd_done.count(m.microbatch)) {
        error("stage {}: send_backward mb {} before its backward", s, m.microbatch);
      }
      Channel& ch = channel(s, m);
      std::vector<Posted>& mine = is_send(m.dir) ? ch.sends : ch.recvs;
      const std::vector<Posted>& theirs = is_send(m.dir) ? ch.recvs : ch.sends;
      st.seq.push_back(mine.size());
      mine.push_back({s, m.microbatch, call.flush});
      if (theirs.size() < mine.size()) continue;  // the peer's side is not posted yet
      const Posted& peer = theirs[mine.size() - 1];
      if (m.microbatch != peer.microbatch || call.flush != peer.flush) {
        error("stage {} {} (mb {}, flush {}) matched stage {}'s message (mb {}, flush {})", s,
              to_string(m.dir), m.microbatch, call.flush, peer.stage, peer.microbatch, peer.flush);
      }
    }
  }

  void compute(int s, const PipeAction& a) {
    StageState& st = states_[s];
    const int mb = a.microbatch;
    if (a.op == PipeOp::kForward) {
      if (s > 0 && !st.have_input.count(mb)) error("stage {}: F{} before its input arrived", s, mb);
      st.fwd_done.insert(mb);
    } else {
      if (!st.fwd_done.count(mb)) error("stage {}: B{} before F{}", s, mb, mb);
      if (s + 1 < stages_ && !st.have_grad.count(mb)) {
        error("stage {}: B{} before its output gradient arrived", s, mb);
      }
      st.bwd_done.insert(mb);
    }
    st.peak = std::max(st.peak, static_cast<int>(st.fwd_done.size() - st.bwd_done.size()));
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
    for (size_t i = 0; i < item.call->messages.size(); ++i) {
      if (!matched(s, item.call->messages[i], st.seq[i])) return newly_posted;
    }
    for (const P2PMessage& m : item.call->messages) {
      if (m.dir == P2PDir::kRecvForward) st.have_input.insert(m.microbatch);
      if (m.dir == P2PDir::kRecvBackward) st.have_grad.insert(m.microbatch);
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
      waiting += fmt::format("{}{} mb {} {} stage {}", waiting.empty() ? "" : ", ",
                             to_string(m.dir), m.microbatch, is_send(m.dir) ? "to" : "from",
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
  std::vector<StageState> states_;
  std::map<ChannelKey, Channel> channels_;
  SimulationResult result_;
};

}  // namespace

SimulationResult simulate(const std::vector<std::vector<StageStep>>& plans) {
  return Simulator(plans).run();
}

SimulationResult simulate(const PipelineSchedule& schedule, int stages, int microbatches) {
  std::vector<std::vector<StageStep>> plans;
  for (int s = 0; s < stages; ++s) {
    plans.push_back(communication_plan(schedule, s, stages, microbatches));
  }
  return simulate(plans);
}

std::string SimulationResult::summary() const {
  std::string out = fmt::format("deadlock: {}; peak in flight per stage: [{}]", deadlock,
                                fmt::join(peak_in_flight, ", "));
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
    parts.push_back(fmt::format("{}{}", kShort[static_cast<int>(m.dir)], m.microbatch));
  }
  return fmt::format("{{{}}}{}", fmt::join(parts, " "), call.flush ? "!" : "");
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

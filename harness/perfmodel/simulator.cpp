// Scale simulator: plans per rank and their discrete-event replay (simulator.h).
#include "harness/perfmodel/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <queue>
#include <stdexcept>
#include <tuple>

#include "harness/parallel/nic_table.h"
#include "harness/parallel/schedule.h"
#include "models/flops.h"

namespace optcc {
namespace {

int64_t to_ns(double seconds) { return static_cast<int64_t>(std::llround(seconds * 1e9)); }
double to_s(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

enum class OpKind { kCompute, kP2P, kCollective };

struct Message {
  int peer = 0;
  bool send = false;
  int channel = 0;  // 0: forward (activations), 1: backward (gradients)
  int64_t bytes = 0;
};

// One operation of a rank's plan.
struct Op {
  OpKind kind = OpKind::kCompute;
  Category category = Category::kCompute;
  std::string label;
  int64_t duration_ns = 0;        // compute
  std::vector<Message> messages;  // p2p call
  int group = -1;                 // collective: index into Plans::groups
  CollectiveKind collective = CollectiveKind::kAllReduce;
  int64_t bytes = 0;              // collective: tensor bytes
  bool detached = false;          // p2p sends the plan does not wait on (P2PCall::wait false):
                                  // posted, and the rank goes on at once
};

struct Plans {
  std::vector<std::vector<Op>> ranks;
  std::vector<std::vector<int>> groups;  // collective groups, ring order
  std::map<std::vector<int>, int> group_index;
  int group_of(const std::vector<int>& members) {
    auto it = group_index.find(members);
    if (it != group_index.end()) return it->second;
    groups.push_back(members);
    return group_index[members] = static_cast<int>(groups.size()) - 1;
  }
};

// ---- plan building ----

struct PlanBuilder {
  const SimInputs& in;
  const RankLayout& layout;
  Plans& plans;
  std::unique_ptr<PipelineSchedule> schedule;

  void compute(std::vector<Op>& ops, double seconds, Category cat, std::string label) {
    if (seconds <= 0) return;
    Op op;
    op.category = cat;
    op.duration_ns = to_ns(seconds);
    op.label = std::move(label);
    ops.push_back(std::move(op));
  }

  void coll(std::vector<Op>& ops, const std::vector<int>& group, CollectiveKind kind, int64_t bytes, Category cat,
            std::string label) {
    if (group.size() < 2) return;
    Op op;
    op.kind = OpKind::kCollective;
    op.category = cat;
    op.group = plans.group_of(group);
    op.collective = kind;
    op.bytes = bytes;
    op.label = std::move(label);
    ops.push_back(std::move(op));
  }

  // Steps of a reducer or a codec: compute at the profile's codec rate, collectives on `group`.
  void steps(std::vector<Op>& ops, const std::vector<CommStep>& list, const std::vector<int>& group, Category cat,
             const std::string& prefix) {
    for (const auto& st : list) {
      if (st.compute) {
        compute(ops, in.hw.codec_seconds(st.codec, st.flops, st.memory_bytes), Category::kCompression,
                prefix + st.what);
      } else {
        coll(ops, group, st.kind, st.bytes, cat, prefix + st.what);
      }
    }
  }

  // Compute split into `pieces` equal parts, each followed by a TP all-reduce of the stage's message.
  void compute_with_tp(std::vector<Op>& ops, int r, double seconds, int64_t pieces, const std::string& label) {
    const auto& g = in.traffic.stages[layout.coord(r).pp];
    const auto tp = layout.tp_group(r);
    if (tp.size() < 2 || pieces < 1) return compute(ops, seconds, Category::kCompute, label);
    for (int64_t i = 0; i < pieces; ++i) {
      compute(ops, seconds / double(pieces), Category::kCompute, label);
      coll(ops, tp, CollectiveKind::kAllReduce, g.tp_message_bytes, Category::kTensorParallel, label + " tp");
    }
  }

  // One action of model chunk `chunk` (of v = schedule->chunks()) runs 1/v of the stage's layers;
  // the embedding belongs to chunk 0, the head and loss to the last chunk.
  void forward(std::vector<Op>& ops, int r, int mb, int chunk) {
    const int k = layout.coord(r).pp, v = schedule->chunks();
    const auto& c = in.stages[k];
    const auto& g = in.traffic.stages[k];
    const auto tp = layout.tp_group(r);
    const std::string label = v > 1 ? fmt::format("F{}@{}", mb, chunk) : fmt::format("F{}", mb);
    // tp_forward_extra: [embedding (first stage)] [cross-entropy x3 (last stage)]
    const auto& extra = g.tp_forward_extra;
    const auto split = extra.begin() + (k == 0 && !extra.empty() ? 1 : 0);
    if (chunk == 0) steps(ops, std::vector<CommStep>(extra.begin(), split), tp, Category::kTensorParallel, label + " ");
    const int64_t layers = c.layers / v;
    if (tp.size() < 2) {
      compute(ops, double(layers) * c.layer_forward_s, Category::kCompute, label);
    } else {
      for (int64_t l = 0; l < layers; ++l) compute_with_tp(ops, r, c.layer_forward_s, g.tp_per_layer_forward, label);
    }
    if (chunk != v - 1) return;
    compute(ops, c.head_forward_s, Category::kCompute, label + " head");
    steps(ops, std::vector<CommStep>(split, extra.end()), tp, Category::kTensorParallel, label + " ");
  }

  // The whole backward, or B alone when the schedule splits it (its weight gradients are W's).
  void backward(std::vector<Op>& ops, int r, int mb, int chunk) {
    const int k = layout.coord(r).pp, v = schedule->chunks();
    const auto& c = in.stages[k];
    const auto& g = in.traffic.stages[k];
    const auto tp = layout.tp_group(r);
    const bool split = schedule->splits_backward();
    const std::string label = v > 1 ? fmt::format("B{}@{}", mb, chunk) : fmt::format("B{}", mb);
    if (chunk == v - 1) {
      compute(ops, c.head_backward_s, Category::kCompute, label + " head");
      steps(ops, g.tp_backward_extra, tp, Category::kTensorParallel, label + " ");
    }
    const int64_t layers = c.layers / v;
    const double layer_s = c.layer_backward_s - (split ? c.layer_weight_s : 0.0);
    if (tp.size() < 2) {
      compute(ops, double(layers) * layer_s, Category::kCompute, label);
    } else {
      for (int64_t l = 0; l < layers; ++l) compute_with_tp(ops, r, layer_s, g.tp_per_layer_backward, label);
    }
  }

  // W: the weight-gradient GEMMs of the layers B left (no communication).
  void weight(std::vector<Op>& ops, int r, int mb, int chunk) {
    const int k = layout.coord(r).pp, v = schedule->chunks();
    const auto& c = in.stages[k];
    compute(ops, double(c.layers / v) * c.layer_weight_s, Category::kCompute, fmt::format("W{}", mb));
  }

  // One P2P call with the codec work around it and the receiver's all-gathers.
  void call(std::vector<Op>& ops, int r, const P2PCall& c) {
    const int k = layout.coord(r).pp;
    const int mbs = static_cast<int>(in.traffic.micro_batches);
    const auto& mine = in.traffic.stages[k];
    Op op;
    op.kind = OpKind::kP2P;
    op.category = Category::kPipelineForward;
    op.detached = !c.wait;
    std::vector<Op> after;
    std::string label;
    for (const auto& m : c.messages) {
      const bool fwd = m.dir == P2PDir::kSendForward || m.dir == P2PDir::kRecvForward;
      const bool send = m.dir == P2PDir::kSendForward || m.dir == P2PDir::kSendBackward;
      if (!fwd) op.category = Category::kPipelineBackward;
      RankCoord peer_coord = layout.coord(r);  // the peer's stage: k +- 1, around the ring when interleaved
      peer_coord.pp = m.peer_stage;
      const int peer = layout.rank(peer_coord);
      Message msg{peer, send, fwd ? 0 : 1, 0};
      label += fmt::format("{}{}{} ", send ? "s" : "r", fwd ? "f" : "b", m.microbatch);
      if (m.dir == P2PDir::kSendForward) msg.bytes = mine.pp_fwd_message;
      if (m.dir == P2PDir::kSendBackward) {
        const size_t at = static_cast<size_t>(m.chunk * mbs + m.microbatch);
        msg.bytes = mine.pp_bwd_messages.at(at);
        if (mine.pp_bwd_compressed.at(at)) steps(ops, mine.cb_encode, {}, Category::kCompression, "CB ");
      }
      const auto& sender = in.traffic.stages[m.peer_stage];
      if (m.dir == P2PDir::kRecvBackward && sender.pp_bwd_compressed.at(static_cast<size_t>(m.peer_chunk * mbs + m.microbatch))) {
        steps(after, sender.cb_decode, {}, Category::kCompression, "CB ");
      }
      if (!send && mine.pp_gather_bytes > 0) {
        coll(after, layout.tp_group(r), CollectiveKind::kAllGather, mine.pp_gather_bytes,
             fwd ? Category::kPipelineForward : Category::kPipelineBackward, "gather");
      }
      op.messages.push_back(msg);
    }
    op.label = "{" + label.substr(0, label.size() - 1) + "}";
    ops.push_back(std::move(op));
    for (auto& a : after) ops.push_back(std::move(a));
  }

  std::vector<Op> rank_plan(int r) {
    const auto co = layout.coord(r);
    const int p = layout.dims().pp, m = static_cast<int>(in.traffic.micro_batches);
    std::vector<Op> ops;
    for (const auto& step : communication_plan(*schedule, co.pp, p, m)) {
      for (const auto& c : step.before) call(ops, r, c);
      if (step.action.op == PipeOp::kForward) forward(ops, r, step.action.microbatch, step.action.chunk);
      if (step.action.op == PipeOp::kBackward) backward(ops, r, step.action.microbatch, step.action.chunk);
      if (step.action.op == PipeOp::kWeight) weight(ops, r, step.action.microbatch, step.action.chunk);
      for (const auto& c : step.after) call(ops, r, c);
    }
    Op mark;  // a zero-length marker: the end of the schedule
    mark.label = "schedule end";
    mark.category = Category::kIdle;
    ops.push_back(mark);
    const auto& g = in.traffic.stages[co.pp];
    steps(ops, g.dp_steps, layout.dp_group(r), Category::kDataParallel, "dp: ");
    if (g.holds_word_embedding && g.embedding_group > 1) {
      const auto group = in.fused_embedding ? layout.fused_embedding_group(r) : layout.embedding_group(r);
      steps(ops, g.embedding_steps, group, Category::kEmbedding, "embedding: ");
    }
    compute(ops, in.stages[co.pp].optimizer_s, Category::kOther, "optimizer");
    if (in.outer_fragment >= 0) {  // after the optimizer step, as OuterSync::after_step
      steps(ops, g.outer_steps.at(in.outer_fragment), layout.dp_group(r), Category::kDataParallel, "outer: ");
      if (in.outer_fragment == 0 && !g.tied_copy_steps.empty()) {
        steps(ops, g.tied_copy_steps, layout.embedding_group(r), Category::kEmbedding, "outer: ");
      }
    }
    return ops;
  }
};

// ---- replay ----

struct OpRecord {
  int64_t post = 0, from = 0, end = 0;  // from: when what released it happened (>= post)
  int by_rank = -1, by_op = -1;         // the operation whose end is `from` (-1: none, time 0)
};

struct PendingSend {
  int rank, op;
  int64_t post, data_end;
  int64_t bytes;
  bool detached;  // its op finished when posted
};
struct PendingRecv {
  int rank, op;
  int64_t post;
};
struct Channel {
  std::deque<PendingSend> sends;
  std::deque<PendingRecv> recvs;
};
struct CollectiveInstance {
  std::vector<std::pair<int, int>> members;  // (rank, op) in post order
  int64_t last_post = 0;
};

class Engine {
 public:
  Engine(const Plans& plans, const RankLayout& layout, const LinkParams& links, const HardwareProfile& hw)
      : plans_(plans), layout_(layout), hw_(hw), nics_(std::make_shared<LocalNicTable>(layout.num_nodes() * links.nics_per_node)),
        emu_(with_emulation(links), layout, nics_) {
    const size_t n = plans.ranks.size();
    records_.resize(n);
    for (size_t r = 0; r < n; ++r) records_[r].resize(plans.ranks[r].size());
    next_.assign(n, 0);
    pending_.assign(n, 0);
    seq_.resize(n);
  }

  void run() {
    for (int r = 0; r < static_cast<int>(plans_.ranks.size()); ++r) ready(r, 0, -1, -1);
    while (!queue_.empty()) {
      const auto [t, r] = queue_.top();
      queue_.pop();
      post(r, t);
    }
    for (size_t r = 0; r < plans_.ranks.size(); ++r) {
      if (next_[r] < plans_.ranks[r].size()) {
        throw std::logic_error(fmt::format("simulator: rank {} blocked at operation {} ({}): the plans deadlock", r,
                                           next_[r], plans_.ranks[r][next_[r]].label));
      }
    }
  }

  const std::vector<std::vector<OpRecord>>& records() const { return records_; }

 private:
  static LinkParams with_emulation(LinkParams p) {
    p.emulate = true;
    return p;
  }

  // Rank r may post its next operation at `t`; `by` released it.
  void ready(int r, int64_t t, int by_rank, int by_op) {
    if (next_[r] >= plans_.ranks[r].size()) return;
    auto& rec = records_[r][next_[r]];
    rec.post = rec.from = t;
    rec.by_rank = by_rank, rec.by_op = by_op;
    queue_.push({t, r});
  }

  void finish(int r, int op, int64_t end) {
    records_[r][op].end = end;
    next_[r] = op + 1;
    ready(r, end, r, op);
  }

  void post(int r, int64_t t) {
    const int i = static_cast<int>(next_[r]);
    const Op& op = plans_.ranks[r][i];
    if (op.kind == OpKind::kCompute) return finish(r, i, t + op.duration_ns);
    if (op.kind == OpKind::kCollective) return post_collective(r, i, t);
    pending_[r] = static_cast<int>(op.messages.size());
    records_[r][i].end = t;
    for (const auto& m : op.messages) {
      const int from = m.send ? r : m.peer, to = m.send ? m.peer : r;
      Channel& ch = channels_[{from, to, m.channel}];
      if (m.send) {
        const int64_t start = emu_.p2p_send_start(r, m.peer, m.bytes, t);
        ch.sends.push_back({r, i, t, emu_.p2p_end(r, m.peer, m.bytes, start), m.bytes, op.detached});
      } else {
        ch.recvs.push_back({r, i, t});
      }
      while (!ch.sends.empty() && !ch.recvs.empty()) {
        match(ch.sends.front(), ch.recvs.front());
        ch.sends.pop_front();
        ch.recvs.pop_front();
      }
    }
    if (op.detached) finish(r, i, t);  // the sends complete when matched; the rank goes on now
  }

  // Both ends complete at max(data end, both posts, the real transport's time after the later
  // post). `from` on each side: the later of the two posts (a receive waiting for its sender is
  // idle until then).
  void match(const PendingSend& s, const PendingRecv& v) {
    const int64_t real_end = std::max(s.post, v.post) + to_ns(hw_.transport_p2p_seconds(s.bytes));
    const int64_t done = std::max({s.data_end, s.post, v.post, real_end});
    if (!s.detached) settle(s.rank, s.op, done, v.post > s.post ? v.rank : -1, v.op);
    settle(v.rank, v.op, done, s.post > v.post ? s.rank : -1, s.op);
  }

  void settle(int r, int op, int64_t done, int peer, int peer_op) {
    auto& rec = records_[r][op];
    if (done > rec.end || (done == rec.end && peer >= 0)) {
      rec.end = done;
      if (peer >= 0) {  // released by the peer's post: its previous operation
        rec.from = records_[peer][peer_op].post;
        rec.by_rank = peer, rec.by_op = peer_op - 1;
      } else {  // by its own post (and the transfer)
        rec.from = rec.post;
        rec.by_rank = r, rec.by_op = op - 1;
      }
    }
    if (--pending_[r] == 0) finish(r, op, rec.end);
  }

  void post_collective(int r, int i, int64_t t) {
    const Op& op = plans_.ranks[r][i];
    const int n = static_cast<int>(plans_.groups[op.group].size());
    auto& inst = collectives_[{op.group, seq_[r][op.group]++}];
    inst.members.push_back({r, i});
    inst.last_post = std::max(inst.last_post, t);
    if (static_cast<int>(inst.members.size()) < n) return;
    const auto& group = plans_.groups[op.group];
    const int64_t send = LinkEmulator::ring_send_bytes(op.collective, op.bytes, n);
    int64_t s = inst.last_post;
    for (int member : group) s = std::max(s, emu_.collective_nic_start(member, group, send, inst.last_post));
    const int64_t end = std::max(s + to_ns(emu_.ring_seconds(op.collective, op.bytes, group)),
                                 inst.last_post + to_ns(hw_.transport_ring_seconds(op.collective, op.bytes, n)));
    const auto [last_rank, last_op] = inst.members.back();
    for (const auto& [mr, mi] : inst.members) {
      auto& rec = records_[mr][mi];
      rec.from = inst.last_post;
      if (mr != last_rank) rec.by_rank = last_rank, rec.by_op = last_op - 1;
    }
    const auto members = inst.members;
    collectives_.erase({op.group, seq_[r][op.group] - 1});
    for (const auto& [mr, mi] : members) finish(mr, mi, end);
  }

  static int64_t to_ns(double seconds) { return static_cast<int64_t>(std::ceil(seconds * 1e9)); }

  const Plans& plans_;
  const RankLayout& layout_;
  const HardwareProfile& hw_;
  std::shared_ptr<LocalNicTable> nics_;
  LinkEmulator emu_;
  std::vector<std::vector<OpRecord>> records_;
  std::vector<size_t> next_;
  std::vector<int> pending_;
  std::vector<std::map<int, int>> seq_;  // per rank, per group: collectives posted so far
  std::map<std::tuple<int, int, int>, Channel> channels_;
  std::map<std::pair<int, int>, CollectiveInstance> collectives_;
  using Item = std::pair<int64_t, int>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue_;
};

// ---- results ----

void fill_breakdown(SimResult& res, const Plans& plans, const std::vector<std::vector<OpRecord>>& rec) {
  const int r = res.critical_rank;
  for (size_t i = 0; i < plans.ranks[r].size(); ++i) {
    const Op& op = plans.ranks[r][i];
    const OpRecord& o = rec[r][i];
    if (op.label == "schedule end") res.schedule_end_s = to_s(o.end);
    double idle = 0;
    // a receive (or send) released by its peer's later post: the wait is idle (breakdown.h)
    if (op.kind == OpKind::kP2P) idle = to_s(o.from - o.post);
    res.breakdown_s[static_cast<int>(Category::kIdle)] += idle;
    res.breakdown_s[static_cast<int>(op.category)] += to_s(o.end - o.post) - idle;
  }
}

void fill_critical_path(SimResult& res, const Plans& plans, const std::vector<std::vector<OpRecord>>& rec,
                        const RankLayout& layout) {
  int r = res.critical_rank, i = static_cast<int>(plans.ranks[r].size()) - 1;
  std::vector<CriticalSegment> path;
  int64_t guard = res.operations;  // each step moves to an earlier operation; never more steps
  while (r >= 0 && i >= 0 && guard-- > 0) {
    const Op& op = plans.ranks[r][i];
    const OpRecord& o = rec[r][i];
    const double start = to_s(o.from), end = to_s(o.end);
    res.critical_path_s[static_cast<int>(op.category)] += end - start;
    if (!path.empty() && path.back().rank == r && path.back().category == op.category) {
      auto& seg = path.back();
      seg.first = op.label, seg.start_s = start, seg.ops += 1;
    } else if (end > start || op.kind != OpKind::kCompute) {
      path.push_back({r, layout.coord(r).pp, op.category, op.label, op.label, 1, start, end});
    }
    const int nr = o.by_rank, ni = o.by_op;
    r = nr, i = ni;
  }
  std::reverse(path.begin(), path.end());
  res.critical_path = std::move(path);
}

std::vector<StageCompute> stage_compute(const Config& cfg, const TrafficEstimate& e, const HardwareProfile& hw,
                                        const SimOptions& o) {
  const int64_t t = e.dims.tp, h = cfg.model.hidden_size, s = cfg.model.seq_len, b = cfg.train.micro_batch_size;
  const double layer_f = layer_forward_flops(h, s, b) / double(t);
  const double head_f = logits_forward_flops(h, s, b, cfg.padded_vocab_size()) / double(t);
  std::vector<StageCompute> out;
  for (int k = 0; k < e.dims.pp; ++k) {
    StageCompute c;
    c.layers = e.stages[k].layers;
    c.layer_forward_s = layer_f / hw.forward_flops_per_s;
    c.layer_backward_s = backward_flops(layer_f, o.recompute) / hw.backward_flops_per_s;
    c.layer_weight_s = layer_weight_grad_flops(h, s, b) / double(t) / hw.backward_flops_per_s;
    if (k == e.dims.pp - 1) {
      c.head_forward_s = head_f / hw.forward_flops_per_s;
      c.head_backward_s = backward_flops(head_f, o.recompute) / hw.backward_flops_per_s;
    }
    c.optimizer_s = double(e.stages[k].parameters) * hw.optimizer_seconds_per_parameter;
    out.push_back(c);
  }
  return out;
}

}  // namespace

SimInputs make_sim_inputs(const Config& cfg, const HardwareProfile& hw, const SimOptions& o) {
  TrafficModelOptions t;
  t.recompute = o.recompute;
  t.element_bytes = o.element_bytes;
  t.reference_powersgd = o.reference_powersgd;
  t.gloo = o.gloo;
  t.ranks_per_node = hw.devices_per_node;
  SimInputs in;
  in.traffic = estimate_traffic(cfg, t);
  in.stages = stage_compute(cfg, in.traffic, hw, o);
  in.links = hw.links;
  in.schedule = cfg.parallel.schedule;
  in.virtual_stages = static_cast<int>(cfg.parallel.virtual_stages);
  in.fused_embedding = cfg.compression.fused_embedding;
  in.outer_inner_steps = cfg.compression.diloco_on() ? cfg.compression.diloco.inner_steps : 0;
  in.hw = hw;
  return in;
}

SimResult replay(const SimInputs& in) {
  const RankLayout layout(in.traffic.dims, in.traffic.ranks_per_node);
  Plans plans;
  PlanBuilder builder{in, layout, plans, make_schedule(in.schedule, in.virtual_stages)};
  for (int r = 0; r < layout.world(); ++r) plans.ranks.push_back(builder.rank_plan(r));
  Engine engine(plans, layout, in.links, in.hw);
  engine.run();
  const auto& rec = engine.records();
  SimResult res;
  for (int r = 0; r < layout.world(); ++r) {
    res.operations += static_cast<int64_t>(plans.ranks[r].size());
    const double end = rec[r].empty() ? 0.0 : to_s(rec[r].back().end);
    if (end > res.iteration_s) res.iteration_s = end, res.critical_rank = r;
  }
  fill_breakdown(res, plans, rec);
  fill_critical_path(res, plans, rec, layout);
  res.notes = in.traffic.notes;
  return res;
}

SimResult replay_period(SimInputs in) {
  in.outer_fragment = -1;
  SimResult plain = replay(in);
  if (in.outer_inner_steps <= 0 || in.traffic.stages.empty()) return plain;
  const int64_t H = in.outer_inner_steps, F = static_cast<int64_t>(in.traffic.stages[0].outer_steps.size());
  SimResult mean = plain;
  const auto scale = [](auto& a, double w) {
    for (auto& x : a) x *= w;
  };
  mean.iteration_s *= static_cast<double>(H - F);
  scale(mean.breakdown_s, static_cast<double>(H - F));
  scale(mean.critical_path_s, static_cast<double>(H - F));
  std::string syncs;
  for (int64_t f = 0; f < F; ++f) {
    in.outer_fragment = static_cast<int>(f);
    const SimResult r = replay(in);
    mean.iteration_s += r.iteration_s;
    for (int c = 0; c < kNumCategories; ++c) {
      mean.breakdown_s[c] += r.breakdown_s[c];
      mean.critical_path_s[c] += r.critical_path_s[c];
    }
    mean.operations += r.operations;
    syncs += fmt::format("{}{:.4g}", f ? ", " : "", r.iteration_s);
  }
  mean.iteration_s /= static_cast<double>(H);
  scale(mean.breakdown_s, 1.0 / static_cast<double>(H));
  scale(mean.critical_path_s, 1.0 / static_cast<double>(H));
  mean.notes.push_back(fmt::format(
      "dp_strategy diloco: the mean iteration of a period of {} ({} without an outer exchange, {:.4g} s each; the "
      "sync iterations of the {} fragment{}: {} s); the critical path shown is the plain iteration's",
      H, H - F, plain.iteration_s, F, F == 1 ? "" : "s", syncs));
  return mean;
}

std::vector<SchemeSimulation> simulate_schemes(const Config& cfg, const HardwareProfile& hw, const SimOptions& o,
                                               const std::vector<std::string>& schemes) {
  std::vector<SchemeSimulation> out;
  for (const auto& name : schemes) {
    Config v = detached_copy(cfg);
    if (name != "config") apply_compression_scheme(v.compression, name);
    SimInputs in = make_sim_inputs(v, hw, o);
    SchemeSimulation s{name, replay_period(in), std::move(in.traffic)};
    if (cfg.network.emulate || !cfg.network.skip.empty() || cfg.network.scale != 1.0) {
      s.result.notes.push_back(fmt::format("the config's network section (emulate, scale, skip) is not used: links "
                                           "come from profile {}", hw.name));
    }
    if (cfg.parallel.ranks_per_node > 0 && cfg.parallel.ranks_per_node != hw.devices_per_node) {
      s.result.notes.push_back(fmt::format("nodes of {} ranks (the profile's devices_per_node), not the config's "
                                           "parallel.ranks_per_node = {}", hw.devices_per_node,
                                           cfg.parallel.ranks_per_node));
    }
    out.push_back(std::move(s));
  }
  return out;
}

double inter_node_share(const SimResult& r) {
  const auto& b = r.breakdown_s;
  const double inter = b[static_cast<int>(Category::kDataParallel)] + b[static_cast<int>(Category::kEmbedding)] +
                       b[static_cast<int>(Category::kPipelineForward)] + b[static_cast<int>(Category::kPipelineBackward)];
  return r.iteration_s > 0 ? inter / r.iteration_s : 0.0;
}

double match_inter_node_share(const Config& cfg, const HardwareProfile& hw, const SimOptions& o, double target,
                              double& share) {
  Config base = detached_copy(cfg);
  apply_compression_scheme(base.compression, "baseline");
  SimInputs in = make_sim_inputs(base, hw, o);
  const LinkParams links = hw.links;
  auto share_at = [&](double scale) {
    in.links = links;
    in.links.scale = scale;  // bandwidths divided by `scale`; latencies kept as the profile's
    in.links.intra_latency_s = links.intra_latency_s * links.scale / scale;
    in.links.inter_latency_s = links.inter_latency_s * links.scale / scale;
    return inter_node_share(replay(in));
  };
  double lo = std::log(1e-3), hi = std::log(1e9);
  for (int i = 0; i < 60; ++i) {  // the share grows with the scale
    const double mid = 0.5 * (lo + hi);
    (share_at(std::exp(mid)) < target ? lo : hi) = mid;
  }
  const double scale = std::exp(0.5 * (lo + hi));
  share = share_at(scale);
  return scale;
}

}  // namespace optcc

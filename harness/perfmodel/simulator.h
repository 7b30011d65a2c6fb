// Scale simulator: one training iteration of any model, layout and cluster, replayed as discrete
// events. `optcc simulate` (simulate_report.h) prints it per compression scheme.
//
// What is replayed, per rank (every TP, DP and PP rank of the layout):
//   1. the pipeline schedule as data: communication_plan() of parallel.schedule (1F1B or GPipe,
//      harness/parallel/schedule.h) for the rank's stage; every forward and backward of every
//      micro-batch, every P2P call with its messages (matched FIFO per channel, rendezvous: a
//      message completes once both ends posted and its data arrived);
//   2. inside a forward: per layer two halves of compute, each followed by a TP all-reduce
//      (first stage: the embedding all-reduce first; last stage: the output layer and the three
//      cross-entropy all-reduces after the layers); inside a backward the output layer's compute
//      and all-reduce first, then per layer k_TP - 2 pieces each followed by an all-reduce;
//   3. CB: encode before a call that sends a compressed gradient, decode after receiving one; the
//      scatter-gather all-gather on the TP group after every received message;
//   4. after the schedule: the DP reducer's operations (SC: compression.dp on stages < way, else
//      raw), then the embedding sync (the 2-rank pair, or FE's 2d-rank group), then the optimizer.
// Bytes, messages and reducer operations come from the traffic model (traffic_estimate.h: the
// StageTrafficEstimate operation lists), FLOPs from models/flops.h, link times and shared-NIC
// queueing from the emulator's own code (link_emulator.h LinkEmulator on a LocalNicTable, driven
// by the simulated clock): p2p messages reserve the sender's transmit and the receiver's receive
// NIC at post time in the order they are posted; a collective starts when its last member posted,
// members whose ring neighbour sits on another node reserve their NIC for their ring volume, and
// all complete at the latest reservation start + the ring time.
// A profile with a `transport` (this-machine) also bounds every operation from below by that real
// transport's time after its last post, as an emulated run's operations end at the later of their
// real and their emulated end (link_emulator.h).
// Not modelled: control traffic (grad norm, loss), data loading, kernel launch and framework
// overheads, overlap of communication with computation (optcc overlaps none).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "harness/config/config.h"
#include "harness/perfmodel/hardware_profile.h"
#include "harness/perfmodel/traffic_estimate.h"
#include "harness/train/breakdown.h"

namespace optcc {

struct SimOptions {
  bool recompute = false;           // full activation recomputation (the paper's runs): k_TP = 6 and
                                    // backward = 3 x forward FLOPs
  int64_t element_bytes = 4;        // β (traffic_estimate.h)
  bool reference_powersgd = false;  // DP PowerSGD compresses every >= 2-D gradient (the reference)
  bool gloo = false;                // the bf16 DP reducer all-gathers (CPU runs)
};

/// Compute of one TP rank of a stage, seconds per micro-batch (from FLOPs and the profile).
struct StageCompute {
  int64_t layers = 0;
  double layer_forward_s = 0, layer_backward_s = 0;  // one transformer layer
  double head_forward_s = 0, head_backward_s = 0;    // the output layer (last stage; 0 elsewhere)
  double optimizer_s = 0;                            // the optimizer step, once per iteration
  // Of layer_backward_s, the weight gradients (W when the schedule splits the backward,
  // models/flops.h layer_weight_grad_flops). The output layer's stay in B (models/gpt.h head_loss).
  double layer_weight_s = 0;
};

/// Everything a replay needs. make_sim_inputs() derives it from a config and a profile; tests
/// change fields to build exact cases.
struct SimInputs {
  TrafficEstimate traffic;           // layout, message and reducer operations per stage
  std::vector<StageCompute> stages;  // [pp]
  LinkParams links;                  // the profile's links (emulate = false: only the cost model)
  std::string schedule = "1f1b";     // parallel.schedule
  int virtual_stages = 1;            // parallel.virtual_stages (model chunks per stage)
  bool fused_embedding = false;      // FE: the embedding group is fused_embedding_group()
  HardwareProfile hw;                // compressor and memory rates
  /// dp_strategy: diloco: H (diloco.inner_steps; 0 under allreduce), and the fragment whose outer
  /// sync the replayed iteration carries (-1: none). replay_period() sets it per iteration.
  int64_t outer_inner_steps = 0;
  int outer_fragment = -1;
};

/// The iteration of `cfg` on `hw`: the layout's nodes are hw.devices_per_node ranks (the config's
/// parallel.ranks_per_node is replaced; a note says so when they differ) and the links are the
/// profile's (the config's network section is not used; simulate_schemes notes it when set). Throws ConfigError for
/// what the traffic model cannot model.
SimInputs make_sim_inputs(const Config& cfg, const HardwareProfile& hw, const SimOptions& o = {});

/// A run of consecutive critical-path operations of one rank and category.
struct CriticalSegment {
  int rank = 0;
  int stage = 0;
  Category category = Category::kCompute;
  std::string first, last;  // labels of its first and last operation ("F3", "B0", "dp: P all-reduce")
  int ops = 0;
  double start_s = 0, end_s = 0;
};

struct SimResult {
  double iteration_s = 0;   // the last rank's end
  int critical_rank = 0;    // the rank that ends last (lowest index on ties)
  double schedule_end_s = 0;  // when the critical rank finished its pipeline schedule
  /// The critical rank's timeline per Category (breakdown.h's method: a receive waiting for its
  /// sender to post is idle, the rest of a communication operation its class); sums to iteration_s.
  std::array<double, kNumCategories> breakdown_s{};
  /// The critical path from 0 to iteration_s, walking back from the last operation through
  /// whatever released each one (its own previous operation, the peer that posted last, the last
  /// member of a collective); merged runs, in time order. Its per-Category time:
  std::vector<CriticalSegment> critical_path;
  std::array<double, kNumCategories> critical_path_s{};
  int64_t operations = 0;   // simulated operations, all ranks
  std::vector<std::string> notes;
};

/// Replays one iteration. Throws std::logic_error when the plans deadlock (a bug).
SimResult replay(const SimInputs& in);
/// The mean iteration: replay() under allreduce; under dp_strategy: diloco the mean over a period
/// of H iterations: H - F without an outer exchange and one sync iteration per fragment (the
/// exchange blocking, as the run issues it; harness/train/outer_sync.h). iteration_s, breakdown_s
/// and critical_path_s are the period's means; critical_path and critical_rank are the plain
/// iteration's; a note says so.
SimResult replay_period(SimInputs in);

struct SchemeSimulation {
  std::string scheme;  // a compression.scheme name, or "config" (the config's own compression)
  SimResult result;
  TrafficEstimate traffic;
};

/// make_sim_inputs + replay for each scheme (the config with compression.scheme = it; "config":
/// as given). Default schemes: baseline, cb, cb_fe, cb_fe_sc, cb_nonlep.
std::vector<SchemeSimulation> simulate_schemes(const Config& cfg, const HardwareProfile& hw, const SimOptions& o,
                                               const std::vector<std::string>& schemes);

/// The link scale that gives `cfg` on `hw` (links scaled, latencies not) the `target` share of
/// its baseline iteration in inter-node classes (dp, embedding, pp_fwd, pp_bwd of the breakdown),
/// by bisection over [1e-3, 1e9]. Returns the scale and fills `share` with what it reaches.
double match_inter_node_share(const Config& cfg, const HardwareProfile& hw, const SimOptions& o, double target,
                              double& share);
/// dp + embedding + pp_fwd + pp_bwd of the breakdown over the iteration.
double inter_node_share(const SimResult& r);

}  // namespace optcc

// Scale simulator (harness/perfmodel/simulator.h): exact cases, profiles, and its agreement with the
// traffic model and the emulator's cost model.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "harness/config/config.h"
#include "harness/perfmodel/hardware_profile.h"
#include "harness/perfmodel/regime.h"
#include "harness/parallel/schedule.h"
#include "harness/perfmodel/simulator.h"
#include "models/flops.h"
#include "tests/support/paths.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

// 1 TFLOP/s, links of 10 GB/s (both), no latency, free optimizer.
const char* kProfile = R"(
name: test
description: exact cases
device: {peak_tflops: 1, efficiency: 1, memory_gbps: 1000, optimizer_ns_per_parameter: 0}
network: {intra_node_gbps: 10, inter_node_gbps: 10, intra_node_latency_us: 0, inter_node_latency_us: 0,
          devices_per_node: 1, nics_per_node: 1}
)";

HardwareProfile profile(int devices_per_node = 1) {
  HardwareProfile hw = parse_hardware_profile(kProfile, "test");
  hw.devices_per_node = devices_per_node;
  return hw;
}

Config small(int64_t tp, int64_t pp, int64_t dp, int64_t micro_batches, int64_t hidden = 64) {
  Config c;
  c.model.num_layers = 4;
  c.model.hidden_size = hidden;
  c.model.num_heads = 4;
  c.model.seq_len = 32;
  c.model.vocab_size = 256;
  c.parallel.tp = tp, c.parallel.pp = pp, c.parallel.dp = dp;
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 2 * micro_batches * dp;
  c.validate(tp * pp * dp);
  return c;
}

// No compute, no TP cost (links nearly infinite inside a node): only what a test puts in.
void zero_compute(SimInputs& in) {
  for (auto& s : in.stages) s = StageCompute{s.layers, 0, 0, 0, 0, 0};
}

TEST(Simulator, OneStageWithoutCommunicationIsItsComputeTime) {
  const Config c = small(1, 1, 1, 4);
  const SimResult r = replay(make_sim_inputs(c, profile()));
  const double f = 4 * layer_forward_flops(64, 32, 2) + logits_forward_flops(64, 32, 2, c.padded_vocab_size());
  const double expected = 4 * (f + 2 * f) / 1e12;  // m = 4 micro-batches, backward = 2 x forward
  EXPECT_NEAR(r.iteration_s, expected, 1e-9 * 16);
  EXPECT_NEAR(r.breakdown_s[static_cast<int>(Category::kCompute)], r.iteration_s, 1e-12);
}

TEST(Simulator, EqualStagesGiveThe1F1BFormula) {
  for (int p : {2, 4}) {
    for (int m : {1, 3, 8}) {
      SimInputs in = make_sim_inputs(small(1, p, 1, m), profile());
      const double tf = 0.010, tb = 0.025;
      for (auto& s : in.stages) s = StageCompute{1, tf, tb, 0, 0, 0};
      in.links.intra_bytes_per_s = in.links.inter_bytes_per_s = 1e30;  // free messages
      const SimResult r = replay(in);
      EXPECT_NEAR(r.iteration_s, (m + p - 1) * (tf + tb), 1e-6) << "p=" << p << " m=" << m;
      in.schedule = "gpipe";
      EXPECT_NEAR(replay(in).iteration_s, (m + p - 1) * (tf + tb), 1e-6) << "gpipe p=" << p << " m=" << m;
    }
  }
}

// Every schedule, messages free: the replay's iteration is the makespan of schedule.h's own timed
// simulation with the same action costs (F; B the backward less W where the schedule splits it;
// a chunk's action 1/v of the stage's): one schedule, two simulators that agree.
TEST(Simulator, EverySchedulesIterationIsItsPlansMakespan) {
  const double tf = 0.010, tb = 0.025, tw = 0.008;  // per layer: forward, whole backward, its W part
  for (const auto& [name, v] : std::vector<std::pair<std::string, int>>{
           {"1f1b", 1}, {"gpipe", 1}, {"zb_h1", 1}, {"interleaved_1f1b", 2}}) {
    for (int p : {2, 4}) {
      for (int m : {4, 8}) {
        SCOPED_TRACE(fmt::format("{} p={} m={}", name, p, m));
        Config c = small(1, p, 1, m);
        c.model.num_layers = 8;
        c.parallel.schedule = name;
        c.parallel.virtual_stages = v;
        c.validate(p);
        SimInputs in = make_sim_inputs(c, profile());
        const int64_t layers = 8 / p;
        for (auto& s : in.stages) s = StageCompute{layers, tf, tb, 0, 0, 0, tw};
        in.links.intra_bytes_per_s = in.links.inter_bytes_per_s = 1e30;  // free messages
        const auto schedule = make_schedule(name, v);
        const double w = schedule->splits_backward() ? layers * tw : 0.0;
        const SimulationResult plan = simulate(*schedule, p, m, ActionCosts{layers * tf, layers * tb - w, w});
        ASSERT_TRUE(plan.ok()) << plan.summary();
        EXPECT_NEAR(replay(in).iteration_s, plan.makespan, 1e-6);  // durations in whole ns
      }
    }
  }
}

TEST(Simulator, AllReduceAloneIsTheRingFormula) {
  SimInputs in = make_sim_inputs(small(1, 1, 4, 1), profile());  // 4 nodes of 1 rank
  zero_compute(in);
  const int64_t x = 100'000'000;
  CommStep ar;
  ar.bytes = x;
  in.traffic.stages[0].dp_steps = {ar};
  in.links.inter_latency_s = 5e-6;
  const SimResult r = replay(in);
  EXPECT_NEAR(r.iteration_s, 2 * 3 * (5e-6 + (x / 4) / 10e9), 1e-8);  // 2(n-1)(L + X/n / bw)
  EXPECT_NEAR(r.breakdown_s[static_cast<int>(Category::kDataParallel)], r.iteration_s, 1e-12);
}

TEST(Simulator, ARealTransportBoundsEveryOperationFromBelow) {
  // this-machine profiles carry the transport beneath the emulated links: an all-reduce takes
  // the later of its emulated ring time and the transport's 2(n-1) x latency + sent bytes / bw.
  SimInputs in = make_sim_inputs(small(1, 1, 4, 1), profile());  // 4 nodes of 1 rank, 10 GB/s
  zero_compute(in);
  const int64_t x = 100'000'000;
  CommStep ar;
  ar.bytes = x;
  in.traffic.stages[0].dp_steps = {ar};
  const double ring = replay(in).iteration_s;
  EXPECT_NEAR(ring, 2 * 3 * ((x / 4) / 10e9), 1e-8);
  in.hw.has_transport = true;
  in.hw.transport_step_latency_s = 1e-3;
  in.hw.transport_bytes_per_s = 1e9;  // slower than the link: the transport decides
  EXPECT_NEAR(replay(in).iteration_s, 6 * 1e-3 + 2.0 * 3 / 4 * x / 1e9, 1e-8);
  in.hw.transport_bytes_per_s = 0;  // latency-bound transport, faster than the link: the link decides
  EXPECT_NEAR(replay(in).iteration_s, ring, 1e-8);
  EXPECT_NEAR(in.hw.transport_p2p_seconds(x), 1e-3, 1e-12);
}

TEST(Simulator, TwoTensorParallelRanksSharingANicTakeTwiceAsLong) {
  const int64_t x = 100'000'000;
  CommStep ar;
  ar.bytes = x;
  // One rank per node: the DP all-reduce of 2 ranks alone on its NIC.
  SimInputs one = make_sim_inputs(small(1, 1, 2, 1), profile(1));
  zero_compute(one);
  one.traffic.stages[0].dp_steps = {ar};
  // TP2 x DP2, nodes of 2: each node's two TP ranks run their DP all-reduces through one NIC.
  SimInputs two = make_sim_inputs(small(2, 1, 2, 1), profile(2));
  zero_compute(two);
  two.traffic.stages[0].dp_steps = {ar};
  two.links.intra_bytes_per_s = 1e30;  // the TP all-reduces of the forward cost nothing
  const double t1 = replay(one).iteration_s, t2 = replay(two).iteration_s;
  EXPECT_NEAR(t1, x / 10e9, 1e-8);  // 2(n-1) steps of X/n: X / bw for n = 2
  EXPECT_NEAR(t2, 2 * t1, 1e-7);    // (the free TP all-reduces round up to 1 ns each)
  two.links.nics_per_node = 2;      // a NIC each: no queue
  EXPECT_NEAR(replay(two).iteration_s, t1, 1e-7);
}

TEST(Simulator, ReplaysTheTrafficModelsMessagesAndCollectives) {
  // TP2 x PP2 x DP2, CB + FE + SC: the bytes in the plans are the traffic model's, so the replay
  // of a layout with free links and no compute is instantaneous and every scheme runs to the end.
  Config c = small(2, 2, 2, 4);
  for (const char* scheme : {"baseline", "cb", "cb_fe", "cb_fe_sc", "cb_nonlep"}) {
    Config v = detached_copy(c);
    apply_compression_scheme(v.compression, scheme);
    SimInputs in = make_sim_inputs(v, profile(2));
    const SimResult r = replay(in);
    EXPECT_GT(r.iteration_s, 0) << scheme;
    EXPECT_GT(r.operations, 8 * 4 * 2) << scheme;
    double sum = 0;
    for (double v2 : r.breakdown_s) sum += v2;
    EXPECT_NEAR(sum, r.iteration_s, 1e-9) << scheme;  // the breakdown covers the iteration
    double path = 0;
    for (const auto& s : r.critical_path) path += s.end_s - s.start_s;
    EXPECT_NEAR(path, r.iteration_s, 1e-9) << scheme;  // the critical path covers it too
  }
}

TEST(Simulator, CompressionCutsInterNodeTimeWhenLinksAreSlow) {
  // h = 1024 on 100 MB/s nodes: the DP all-reduce (50 MB per stage and rank) dominates the
  // baseline; PowerSGD rank 128 (SC) sends about 5x less, so CB+FE+SC is faster and spends less in dp.
  Config c = small(2, 2, 2, 4, 1024);
  HardwareProfile hw = profile(2);
  hw.links.inter_bytes_per_s = 1e8;
  const auto runs = simulate_schemes(c, hw, {}, {"baseline", "cb_fe_sc"});
  const int dp = static_cast<int>(Category::kDataParallel);
  EXPECT_LT(runs[1].result.iteration_s, runs[0].result.iteration_s);
  EXPECT_LT(runs[1].result.breakdown_s[dp], runs[0].result.breakdown_s[dp] / 2);
  EXPECT_GT(runs[0].result.breakdown_s[dp], runs[0].result.breakdown_s[static_cast<int>(Category::kCompute)]);
}

TEST(HardwareProfile, RefusesUnknownKeysAndMissingNumbers) {
  EXPECT_THROW(parse_hardware_profile("name: x\ndevice: {peak_tflops: 1, memory_gbps: 1, typo: 3}\n"
                                      "network: {intra_node_gbps: 1, inter_node_gbps: 1}\n", "t"),
               ConfigError);
  EXPECT_THROW(parse_hardware_profile("name: x\ndevice: {memory_gbps: 1}\nnetwork: {intra_node_gbps: 1, "
                                      "inter_node_gbps: 1}\n", "t"),
               ConfigError);
  EXPECT_THROW(parse_hardware_profile("name: x\ndevice: {peak_tflops: 1, memory_gbps: 1}\nnetwork: "
                                      "{emulator_profile: nope}\n", "t"),
               ConfigError);
  const std::string base = "name: x\ndevice: {peak_tflops: 1, memory_gbps: 1}\n"
                           "network: {intra_node_gbps: 1, inter_node_gbps: 1}\n";
  EXPECT_THROW(parse_hardware_profile(base + "transport: {step_latency_us: 5, bandwidth: 1}\n", "t"), ConfigError);
  EXPECT_THROW(parse_hardware_profile(base + "transport: {step_latency_us: -1, gbps: 1}\n", "t"), ConfigError);
  EXPECT_FALSE(parse_hardware_profile(base, "t").has_transport);
  const HardwareProfile hw = parse_hardware_profile(base + "transport: {step_latency_us: 1200, gbps: 0.8}\n", "t");
  EXPECT_TRUE(hw.has_transport);
  EXPECT_DOUBLE_EQ(hw.transport_step_latency_s, 1.2e-3);
  EXPECT_DOUBLE_EQ(hw.transport_bytes_per_s, 0.8e9);
}

// The regime match (regime.h): the CPU config reaches the paper run's inter-node share at the
// scale it returns, its links are the paper profile's divided by it, and its latencies, once
// scaled, are the profile's. A machine twice as fast at everything needs links twice as fast:
// half the scale (to the latencies' share, which the match keeps fixed: well under 1% here).
TEST(Regime, MatchesThePaperRunsInterNodeShare) {
  const std::string src = optcc::testing::source_dir();
  const std::string paper = src + "/experiments/paper/gpt-2.5b.yaml", paper_profile = src + "/experiments/profiles/paper-a100-ib200.yaml";
  Config cpu = small(2, 2, 2, 8, 128);
  cpu.parallel.ranks_per_node = 2;
  const char* machine_yaml = R"(
name: machine
device: {forward_gflops: 20, backward_gflops: 30, memory_gbps: 8, optimizer_ns_per_parameter: 10}
network: {intra_node_gbps: 1, inter_node_gbps: 1, devices_per_node: 2}
)";
  const HardwareProfile machine = parse_hardware_profile(machine_yaml, "test");
  const RegimeMatch m = match_regime(cpu, machine, paper, paper_profile);
  EXPECT_GT(m.target_share, 0.02);
  EXPECT_LT(m.target_share, 0.5);
  EXPECT_NEAR(m.reached_share, m.target_share, 1e-6);
  const HardwareProfile p = load_hardware_profile(paper_profile);
  EXPECT_DOUBLE_EQ(m.inter_bytes_per_s * m.scale, p.links.inter_bytes_per_s);
  EXPECT_DOUBLE_EQ(m.intra_bytes_per_s * m.scale, p.links.intra_bytes_per_s);
  EXPECT_NEAR(m.inter_latency_us * m.scale, p.links.inter_latency_s * 1e6, 1e-9);
  // The same share replayed from the outside: the config at the match's scale and latencies.
  HardwareProfile at = machine;
  at.links = p.links;
  at.links.scale = m.scale;
  at.links.inter_latency_s = m.inter_latency_us * 1e-6;
  at.links.intra_latency_s = m.intra_latency_us * 1e-6;
  at.devices_per_node = 2;
  Config base = cpu;
  apply_compression_scheme(base.compression, "baseline");
  EXPECT_NEAR(inter_node_share(replay(make_sim_inputs(base, at))), m.target_share, 1e-6);
  // What a run sets: the scale to 4 significant digits, the links and latencies still the
  // profile's divided by it.
  const RegimeMatch r = rounded(m);
  EXPECT_DOUBLE_EQ(r.scale, std::stod(fmt::format("{:.4g}", m.scale)));
  EXPECT_NEAR(r.inter_bytes_per_s * r.scale / p.links.inter_bytes_per_s, 1.0, 1e-12);
  EXPECT_NEAR(r.inter_latency_us * r.scale, p.links.inter_latency_s * 1e6, 1e-9);
  EXPECT_NEAR(r.intra_latency_us * r.scale, p.links.intra_latency_s * 1e6, 1e-9);
  // Twice as fast at everything needs links twice as fast: exactly half the scale, on links
  // without latency (a latency is a fixed cost the match keeps, so it would not halve).
  testing::TempDir dir;
  std::ofstream(dir / "flat.yaml") << "name: flat\ndevice: {peak_tflops: 156, efficiency: 0.4, memory_gbps: 1555}\n"
                                      "network: {intra_node_gbps: 300, inter_node_gbps: 25, intra_node_latency_us: 0, "
                                      "inter_node_latency_us: 0, devices_per_node: 8, nics_per_node: 1}\n";
  HardwareProfile twice = machine;
  twice.forward_flops_per_s *= 2, twice.backward_flops_per_s *= 2, twice.memory_bytes_per_s *= 2;
  twice.optimizer_seconds_per_parameter /= 2;
  const RegimeMatch once = match_regime(cpu, machine, paper, dir / "flat.yaml");
  const RegimeMatch fast = match_regime(cpu, twice, paper, dir / "flat.yaml");
  EXPECT_NEAR(fast.scale / once.scale, 0.5, 1e-6);
  EXPECT_DOUBLE_EQ(fast.target_share, once.target_share);  // the paper run does not depend on this machine
}

TEST(HardwareProfile, PaperProfileTakesTheEmulatorsLinks) {
  // One source of truth: experiments/profiles/paper-a100-ib200.yaml names the built-in network
  // profile (harness/config/config_network.cpp) instead of restating its numbers.
  const HardwareProfile hw = load_hardware_profile(std::string(optcc::testing::source_dir()) + "/experiments/profiles/paper-a100-ib200.yaml");
  NetworkConfig net;
  apply_network_profile(net, "paper-a100-ib200");
  EXPECT_EQ(hw.emulator_profile, "paper-a100-ib200");
  EXPECT_DOUBLE_EQ(hw.links.inter_bytes_per_s, net.inter_node_gbps * 1e9);
  EXPECT_DOUBLE_EQ(hw.links.intra_bytes_per_s, net.intra_node_gbps * 1e9);
  EXPECT_DOUBLE_EQ(hw.links.inter_latency_s, net.inter_node_latency_us * 1e-6);
  EXPECT_DOUBLE_EQ(hw.links.intra_latency_s, net.intra_node_latency_us * 1e-6);
  EXPECT_EQ(hw.devices_per_node, 8);
  EXPECT_EQ(hw.links.nics_per_node, 1);
}

// dp_strategy: diloco (H = 4, F = 2) on DP2, one rank per node, no compute: no dp traffic; a
// plain iteration costs nothing, fragment f's sync iteration one ring all-reduce of its fp32
// parameters (X_f / B on two ranks), and replay_period() is their mean over the period: (X_0 + X_1) / B / 4.
TEST(Simulator, DilocoPeriodMeanWeighsThePlainAndTheSyncIterations) {
  Config c = small(1, 1, 2, 4);
  c.compression.dp_strategy = "diloco";
  c.compression.diloco.inner_steps = 4;
  c.compression.diloco.fragments = 2;
  c.validate(2);
  SimInputs in = make_sim_inputs(c, profile());
  zero_compute(in);
  const auto& g = in.traffic.stages[0];
  EXPECT_EQ(g.dp, 0);
  ASSERT_EQ(g.outer_steps.size(), 2u);
  int64_t x = 0, params = 0;
  for (const auto& f : g.outer_steps) x += collective_bytes(f);
  for (const auto& prm : stage_parameter_shapes(c, 0)) params += prm.numel();
  EXPECT_EQ(x, 4 * params);
  EXPECT_EQ(g.outer, x / 4);  // per step: the period's bytes / H (2(n-1)/n X = X on two ranks)
  EXPECT_NEAR(replay(in).iteration_s, 0.0, 1e-12);
  const SimResult r = replay_period(in);
  EXPECT_NEAR(r.iteration_s, static_cast<double>(x) / 10e9 / 4, 1e-9);
  EXPECT_NEAR(r.breakdown_s[static_cast<int>(Category::kDataParallel)], r.iteration_s, 1e-9);
}

}  // namespace
}  // namespace optcc

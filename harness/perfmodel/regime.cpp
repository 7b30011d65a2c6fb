// The paper's regime on any CPU (regime.h).
#include "harness/perfmodel/regime.h"

#include <fmt/format.h>

#include "harness/perfmodel/calibrate.h"

namespace optcc {

RegimeMatch match_regime(const Config& cpu, const HardwareProfile& machine, const std::string& paper_config,
                         const std::string& paper_profile, const SimOptions& o) {
  RegimeMatch m;
  m.paper_config = paper_config;
  m.paper_profile = paper_profile;
  const HardwareProfile paper_hw = load_hardware_profile(paper_profile);
  Config paper = load_config(paper_config);
  paper.validate(paper.parallel.tp * paper.parallel.pp * paper.parallel.dp, Config::BuildLimits::kAnyBuild);
  SimOptions paper_opts = o;
  paper_opts.recompute = true;  // the paper's runs (docs/design.md §8.1)
  const auto paper_run = simulate_schemes(paper, paper_hw, paper_opts, {"baseline"}).at(0);
  m.paper_iteration_s = paper_run.result.iteration_s;
  m.target_share = inter_node_share(paper_run.result);
  HardwareProfile scaled = machine;
  scaled.links = paper_hw.links;  // the paper's links, to be scaled
  scaled.devices_per_node = static_cast<int>(cpu.parallel.ranks_per_node > 0
                                                 ? cpu.parallel.ranks_per_node
                                                 : cpu.parallel.tp * cpu.parallel.pp * cpu.parallel.dp);
  m.scale = match_inter_node_share(cpu, scaled, o, m.target_share, m.reached_share);
  const LinkParams& l = paper_hw.links;
  m.intra_bytes_per_s = l.intra_bytes_per_s / m.scale;
  m.inter_bytes_per_s = l.inter_bytes_per_s / m.scale;
  m.intra_latency_us = l.intra_latency_s * 1e6 / m.scale;
  m.inter_latency_us = l.inter_latency_s * 1e6 / m.scale;
  return m;
}

RegimeMatch rounded(const RegimeMatch& m) {
  RegimeMatch r = m;
  r.scale = std::stod(fmt::format("{:.4g}", m.scale));
  const double k = m.scale / r.scale;  // each value was the profile's / m.scale
  r.intra_bytes_per_s *= k, r.inter_bytes_per_s *= k, r.intra_latency_us *= k, r.inter_latency_us *= k;
  return r;
}

void apply_regime(NetworkConfig& n, const RegimeMatch& m) {
  n.scale = m.scale;
  n.inter_node_latency_us = m.inter_latency_us;
  n.intra_node_latency_us = m.intra_latency_us;
}

std::string regime_summary(const RegimeMatch& m, const HardwareProfile& machine) {
  return fmt::format(
      "scale {} from {} on {} (baseline iteration {:.1f} ms, {:.1f}% inter-node; recompute on): here {:.1f}% "
      "(replayed); links {:.4g} MB/s per node NIC and {:.4g} GB/s intra-node, latencies {:.4g} / {:.4g} us (the "
      "profile's once scaled); from this machine: forward {:.4g} GFLOP/s, backward {:.4g} GFLOP/s, memory "
      "{:.4g} GB/s, transport {:.4g} us per step",
      m.scale, m.paper_config, m.paper_profile, m.paper_iteration_s * 1e3, 100 * m.target_share, 100 * m.reached_share,
      m.inter_bytes_per_s / 1e6, m.intra_bytes_per_s / 1e9, m.inter_latency_us, m.intra_latency_us,
      machine.forward_flops_per_s / 1e9, machine.backward_flops_per_s / 1e9, machine.memory_bytes_per_s / 1e9,
      machine.transport_step_latency_s * 1e6);
}

std::string derive_network_regime(Config& cfg, Distributed& d) {
  const HardwareProfile machine = parse_hardware_profile(measure_machine_in_run(cfg, d), "this run's start");
  const RegimeMatch m = rounded(match_regime(cfg, machine, cfg.network.match_regime, cfg.network.profile));
  apply_regime(cfg.network, m);
  return regime_summary(m, machine);
}

}  // namespace optcc

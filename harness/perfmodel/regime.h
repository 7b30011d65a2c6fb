// The paper's regime on any CPU: the link scale at which a CPU-sized config spends the same share
// of its baseline iteration in inter-node traffic (dp, embedding, pp) as a paper run does on the
// paper's cluster. Two users:
//   optcc simulate --config X --match-regime PAPER_CONFIG   prints it for a calibrated profile;
//   network.match_regime: PAPER_CONFIG                      a run derives it when it starts, from
//                                                           this machine measured by its own ranks
//                                                           (calibrate.h measure_machine_in_run),
//                                                           and emulates its links at that scale.
// The share and the scale both come from the simulator's replay (simulator.h): the paper run with
// recomputation on, on its profile (the config's network.profile: experiments/profiles/<name>.yaml);
// the CPU config on the measured rates with that profile's links, bisected over the scale.
#pragma once

#include <string>

#include "harness/config/config.h"
#include "harness/parallel/distributed.h"
#include "harness/perfmodel/hardware_profile.h"
#include "harness/perfmodel/simulator.h"

namespace optcc {

struct RegimeMatch {
  std::string paper_config;     // the paper run's config file
  std::string paper_profile;    // its hardware profile (the links that get scaled)
  double paper_iteration_s = 0; // its replayed baseline iteration, seconds
  double target_share = 0;      // its inter-node share of that iteration, in [0, 1]
  double scale = 0;             // network.scale for the CPU config
  double reached_share = 0;     // the CPU config's share at that scale (replayed)
  double intra_bytes_per_s = 0, inter_bytes_per_s = 0;  // the profile's links divided by the scale
  double intra_latency_us = 0, inter_latency_us = 0;    // network.*_latency_us to set: the profile's
                                                        // latencies / scale, so that scaled they are
                                                        // the profile's own (a message's fixed cost
                                                        // does not shrink with the model)
};

/// The match for `cpu` computing at `machine`'s rates (its links are replaced by the paper
/// profile's). Throws ConfigError for a paper config or profile that does not load.
RegimeMatch match_regime(const Config& cpu, const HardwareProfile& machine, const std::string& paper_config,
                         const std::string& paper_profile, const SimOptions& o = {});

/// `m` with its scale rounded to 4 significant digits and the links and latencies recomputed from
/// it: the values a run sets (so the log, the emulator's own line and the recorded config print
/// the same number; the share moves by well under 0.1%).
RegimeMatch rounded(const RegimeMatch& m);
/// Sets n.scale and both latencies to `m`'s.
void apply_regime(NetworkConfig& n, const RegimeMatch& m);

/// One line for the log and the results' `network_regime` attribute: the paper run, its share,
/// the scale, the links it gives and the measured rates it came from.
std::string regime_summary(const RegimeMatch& m, const HardwareProfile& machine);

/// network.match_regime at run start, on every rank (collective over d.world): measures this
/// machine (measure_machine_in_run), matches the regime of cfg.network.match_regime on
/// cfg.network.profile's links, and sets cfg.network.scale and both latencies to the match. Every
/// rank computes the same numbers from the same gathered medians. Returns regime_summary().
/// Throws ConfigError when the paper config or the profile does not load.
std::string derive_network_regime(Config& cfg, Distributed& d);

}  // namespace optcc

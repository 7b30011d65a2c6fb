// `optcc simulate`: the simulator's results per scheme as text or JSON (simulator.h), the
// emulation calibration (--match-regime). scripts/projections.py builds the projection table from
// the JSON.
#pragma once

#include <string>
#include <vector>

#include "harness/config/config.h"
#include "harness/perfmodel/simulator.h"

namespace optcc {

struct SimulateCommandOptions {
  std::string profile = "paper-a100-ib200";  // NAME (experiments/profiles/NAME.yaml) or FILE
  std::string schemes = "baseline,cb,cb_fe,cb_fe_sc,cb_nonlep";  // comma-separated; "config": as given
  bool json = false;
  SimOptions sim;
  /// --match-regime PAPER_CONFIG: the link scale that puts --config (a CPU config, computing at
  /// `machine_profile`'s rates on --profile's links) into PAPER_CONFIG's inter-node share on
  /// --profile (the paper's runs: recomputation on).
  std::string match_regime;
  std::string machine_profile = "this-machine";
  int critical_path_lines = 24;  // text: segments of the first scheme's critical path shown
};

/// Text: the layout and profile, one row per scheme (iteration, speed-up vs the first scheme,
/// per-Category breakdown in ms, dominant category), the critical path of the first scheme, notes.
std::string simulate_report(const Config& cfg, const HardwareProfile& hw, const std::vector<SchemeSimulation>& runs,
                            const SimulateCommandOptions& o);
std::string simulate_report_json(const Config& cfg, const HardwareProfile& hw,
                                 const std::vector<SchemeSimulation>& runs);

/// The speed-up of `run` over runs[0] (its iteration time over this one's).
double speedup(const std::vector<SchemeSimulation>& runs, size_t i);
/// The largest non-idle Category of a result.
Category dominant_category(const SimResult& r);
/// Splits "a,b,c" (no empty names; ConfigError otherwise, naming the known schemes).
std::vector<std::string> parse_scheme_list(const std::string& list);

/// The whole command: loads the profile(s), simulates, prints to stdout. Returns the exit code.
int run_simulate_command(const Config& cfg, const SimulateCommandOptions& o);

}  // namespace optcc

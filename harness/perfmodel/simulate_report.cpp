// `optcc simulate` output and command (simulate_report.h).
#include "harness/perfmodel/simulate_report.h"
#include "harness/perfmodel/regime.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <sstream>

namespace optcc {
namespace {

double ms(double s) { return s * 1e3; }

std::string layout_line(const Config& cfg, const HardwareProfile& hw, const SimOptions& o, int64_t m) {
  const auto& p = cfg.parallel;
  return fmt::format(
      "model {} (L={} h={} s={} b={}), TP{} x PP{} x DP{} = {} ranks, {} per node, {} schedule, m={}, "
      "recompute {}, {} bytes per element",
      cfg.model.preset.empty() ? "custom" : cfg.model.preset, cfg.model.num_layers, cfg.model.hidden_size,
      cfg.model.seq_len, cfg.train.micro_batch_size, p.tp, p.pp, p.dp, p.tp * p.pp * p.dp, hw.devices_per_node,
      p.virtual_stages > 1 ? fmt::format("{} (v={})", p.schedule, p.virtual_stages) : p.schedule, m,
      o.recompute ? "on" : "off", o.element_bytes);
}

std::string profile_line(const HardwareProfile& hw) {
  const auto& l = hw.links;
  return fmt::format(
      "profile {}: {}\n  device forward {:.3g} TFLOP/s, backward {:.3g} TFLOP/s, memory {:.4g} GB/s; links "
      "intra {:.4g} GB/s {:.3g} us, inter {:.4g} GB/s x {} NIC(s)/node {:.3g} us (times x scale {:.4g})",
      hw.name, hw.description, hw.forward_flops_per_s / 1e12, hw.backward_flops_per_s / 1e12,
      hw.memory_bytes_per_s / 1e9, l.intra_bytes_per_s / 1e9, l.intra_latency_s * 1e6, l.inter_bytes_per_s / 1e9,
      l.nics_per_node, l.inter_latency_s * 1e6, l.scale);
}

// The action a segment belongs to: "F3", "B0", "dp:", ... (its first label's first word).
std::string action_of(const CriticalSegment& s) { return s.first.substr(0, s.first.find(' ')); }

std::string critical_path_text(const SimResult& r, int lines) {
  std::string out = fmt::format("critical path (rank {} ends last; per class:", r.critical_rank);
  for (int c = 0; c < kNumCategories; ++c) {
    if (r.critical_path_s[c] > 0) out += fmt::format(" {} {:.1f} ms", category_name(Category(c)), ms(r.critical_path_s[c]));
  }
  out += ")\n";
  // One line per run of segments of one rank and action (a forward with its TP all-reduces, ...).
  std::vector<std::string> rows;
  for (size_t i = 0; i < r.critical_path.size();) {
    const auto& s0 = r.critical_path[i];
    std::array<double, kNumCategories> per{};
    size_t j = i;
    for (; j < r.critical_path.size() && r.critical_path[j].rank == s0.rank && action_of(r.critical_path[j]) == action_of(s0); ++j) {
      per[static_cast<int>(r.critical_path[j].category)] += r.critical_path[j].end_s - r.critical_path[j].start_s;
    }
    std::string detail;
    for (int c = 0; c < kNumCategories; ++c) {
      if (per[c] > 0) detail += fmt::format("{}{} {:.2f}", detail.empty() ? "" : ", ", category_name(Category(c)), ms(per[c]));
    }
    const std::string what = j - i == 1 ? s0.first + (s0.ops > 1 ? " .. " + s0.last : "") : action_of(s0);
    rows.push_back(fmt::format("  {:9.2f} -> {:9.2f} ms  stage {:2} rank {:4}  {:<28} ({})", ms(s0.start_s),
                               ms(r.critical_path[j - 1].end_s), s0.stage, s0.rank, what, detail));
    i = j;
  }
  const int n = static_cast<int>(rows.size());
  for (int i = 0; i < n; ++i) {
    if (i == lines / 2 && n > lines) {
      out += fmt::format("  ... {} more ...\n", n - lines);
      i = n - lines / 2;
    }
    out += rows[i] + "\n";
  }
  return out;
}

nlohmann::json categories_json(const std::array<double, kNumCategories>& v) {
  nlohmann::json j = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c) j[category_name(Category(c))] = v[c];
  return j;
}

}  // namespace

double speedup(const std::vector<SchemeSimulation>& runs, size_t i) {
  return runs.at(i).result.iteration_s > 0 ? runs.at(0).result.iteration_s / runs.at(i).result.iteration_s : 0.0;
}

Category dominant_category(const SimResult& r) {
  int best = 0;
  for (int c = 0; c < kNumCategories; ++c) {
    if (Category(c) != Category::kIdle && r.breakdown_s[c] > r.breakdown_s[best]) best = c;
  }
  return Category(best);
}

std::vector<std::string> parse_scheme_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  std::string name;
  auto known = compression_scheme_names();
  known.push_back("config");
  while (std::getline(in, name, ',')) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw ConfigError(fmt::format("--schemes {}: '{}' is not a scheme. Fix: a comma-separated list of {}.", list,
                                    name, fmt::join(known, ", ")));
    }
    out.push_back(name);
  }
  if (out.empty()) throw ConfigError("--schemes is empty. Fix: name at least one scheme, e.g. baseline,cb_fe_sc.");
  return out;
}

std::string simulate_report(const Config& cfg, const HardwareProfile& hw, const std::vector<SchemeSimulation>& runs,
                            const SimulateCommandOptions& o) {
  std::string out = "optcc simulate (one iteration, discrete-event replay; harness/perfmodel/simulator.h)\n";
  out += "  " + layout_line(cfg, hw, o.sim, runs.at(0).traffic.micro_batches) + "\n  " + profile_line(hw) + "\n\n";
  out += fmt::format("{:<10} {:>11} {:>8}", "scheme", "iteration", "speed-up");
  for (int c = 0; c < kNumCategories; ++c) out += fmt::format(" {:>9}", category_name(Category(c)));
  out += "  dominant\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i].result;
    out += fmt::format("{:<10} {:>9.1f}ms {:>8.3f}", runs[i].scheme, ms(r.iteration_s), speedup(runs, i));
    for (int c = 0; c < kNumCategories; ++c) out += fmt::format(" {:>9.1f}", ms(r.breakdown_s[c]));
    out += fmt::format("  {}\n", category_name(dominant_category(r)));
  }
  out += "(breakdown: ms of the critical rank's iteration per class, as harness/train/breakdown.h; speed-up vs " +
         runs[0].scheme + ")\n\n";
  out += runs[0].scheme + " " + critical_path_text(runs[0].result, o.critical_path_lines);
  std::vector<std::string> notes = runs[0].result.notes;
  for (const auto& n : notes) out += "note: " + n + "\n";
  return out;
}

std::string simulate_report_json(const Config& cfg, const HardwareProfile& hw,
                                 const std::vector<SchemeSimulation>& runs) {
  nlohmann::json j;
  j["config"] = cfg.source_path;
  j["profile"] = {{"name", hw.name}, {"description", hw.description}, {"path", hw.path},
                  {"forward_flops_per_s", hw.forward_flops_per_s}, {"backward_flops_per_s", hw.backward_flops_per_s},
                  {"memory_bytes_per_s", hw.memory_bytes_per_s}, {"devices_per_node", hw.devices_per_node},
                  {"nics_per_node", hw.links.nics_per_node}, {"intra_bytes_per_s", hw.links.intra_bytes_per_s},
                  {"inter_bytes_per_s", hw.links.inter_bytes_per_s}, {"intra_latency_s", hw.links.intra_latency_s},
                  {"inter_latency_s", hw.links.inter_latency_s}, {"scale", hw.links.scale},
                  {"emulator_profile", hw.emulator_profile}};
  j["layout"] = {{"tp", cfg.parallel.tp}, {"pp", cfg.parallel.pp}, {"dp", cfg.parallel.dp},
                 {"micro_batches", runs.at(0).traffic.micro_batches}, {"schedule", cfg.parallel.schedule},
                 {"virtual_stages", cfg.parallel.virtual_stages}};
  j["schemes"] = nlohmann::json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i].result;
    nlohmann::json path = nlohmann::json::array();
    for (const auto& s : r.critical_path) {
      path.push_back({{"rank", s.rank}, {"stage", s.stage}, {"category", category_name(s.category)},
                      {"first", s.first}, {"last", s.last}, {"ops", s.ops}, {"start_s", s.start_s}, {"end_s", s.end_s}});
    }
    j["schemes"].push_back({{"scheme", runs[i].scheme}, {"iteration_s", r.iteration_s}, {"speedup", speedup(runs, i)},
                            {"critical_rank", r.critical_rank}, {"schedule_end_s", r.schedule_end_s},
                            {"breakdown_s", categories_json(r.breakdown_s)},
                            {"critical_path_s", categories_json(r.critical_path_s)},
                            {"dominant", category_name(dominant_category(r))},
                            {"inter_node_share", inter_node_share(r)}, {"operations", r.operations},
                            {"critical_path", path}, {"notes", r.notes}});
  }
  return j.dump(2) + "\n";
}

namespace {

// --match-regime: the paper's baseline share of inter-node time, then the scale for `cfg` (regime.h).
int match_regime_command(const Config& cpu, const SimulateCommandOptions& o) {
  const HardwareProfile machine = load_hardware_profile(o.machine_profile);
  const RegimeMatch m = match_regime(cpu, machine, o.match_regime, o.profile, o.sim);
  const HardwareProfile paper_hw = load_hardware_profile(o.profile);
  std::cout << fmt::format(
      "paper regime: {} on {} (recompute on): baseline iteration {:.1f} ms, inter-node classes (dp, embedding, "
      "pp) {:.1f}% of it\n",
      o.match_regime, paper_hw.name, ms(m.paper_iteration_s), 100 * m.target_share);
  std::cout << fmt::format(
      "cpu config: {} computing at {}'s rates on {}'s links: scale {:.0f} gives {:.1f}% (links {:.4g} GB/s "
      "intra, {:.4g} MB/s inter per node; latencies kept at the profile's)\n",
      cpu.source_path, machine.name, paper_hw.name, m.scale, 100 * m.reached_share, m.intra_bytes_per_s / 1e9,
      m.inter_bytes_per_s / 1e6);
  const auto& l = paper_hw.links;
  std::cout << fmt::format(
      "network:\n  emulate: true\n  profile: {}\n  scale: {:.0f}\n  inter_node_latency_us: {:.4g}   # {:.3g} / "
      "scale\n  intra_node_latency_us: {:.4g}  # {:.3g} / scale\n"
      "(or `match_regime: {}` in the network section: a run derives this at its start, on its own ranks)\n",
      paper_hw.emulator_profile.empty() ? "\"\"" : paper_hw.emulator_profile, m.scale, m.inter_latency_us,
      l.inter_latency_s * 1e6, m.intra_latency_us, l.intra_latency_s * 1e6, o.match_regime);
  return 0;
}

}  // namespace

int run_simulate_command(const Config& cfg, const SimulateCommandOptions& o) {
  if (!o.match_regime.empty()) return match_regime_command(cfg, o);
  const HardwareProfile hw = load_hardware_profile(o.profile);
  const auto runs = simulate_schemes(cfg, hw, o.sim, parse_scheme_list(o.schemes));
  std::cout << (o.json ? simulate_report_json(cfg, hw, runs) : simulate_report(cfg, hw, runs, o));
  return 0;
}

}  // namespace optcc

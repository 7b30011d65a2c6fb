// The `network:` section: link profiles and validation (config.h documents the keys).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "harness/config/config.h"

namespace optcc {
namespace {

// One preset of the four link keys. Sources are given per value, so an experiment can say what it
// assumes and a reader can check it. This table is the one source of these link numbers: the
// simulator's hardware profiles name an entry (experiments/profiles/paper-a100-ib200.yaml:
// `emulator_profile: paper-a100-ib200`, harness/perfmodel/hardware_profile.h) instead of restating it.
struct NetworkProfile {
  const char* name;
  double intra_node_gbps, inter_node_gbps, intra_node_latency_us, inter_node_latency_us;
};

// paper-a100-ib200 (docs/design.md §8.1): nodes of 8 A100 (SXM4) behind ONE 200 Gb/s InfiniBand HDR HCA.
//   inter_node_gbps 25    200 Gb/s = 25 GB/s per direction, the whole node's (NCCL pinned to mlx5_0).
//   intra_node_gbps 300   NVLink 3 on A100: 12 links x 25 GB/s = 300 GB/s per direction (600 GB/s
//                         both ways; NVIDIA A100 datasheet).
//   latencies 3.4 / 9.6   µs per ring step, NCCL's own cost model (src/graph/tuning.cc, hwLat,
//                         Ring/Simple: NVLink 3.4, NET 9.6) in the releases around the paper's 2.8.3.
constexpr NetworkProfile kProfiles[] = {
    {"paper-a100-ib200", 300.0, 25.0, 3.4, 9.6},
};

const char* const kLinkKeys[] = {"intra_node_gbps", "inter_node_gbps", "intra_node_latency_us",
                                 "inter_node_latency_us"};

[[noreturn]] void fail(const std::string& key, const std::string& value, const std::string& rule,
                       const std::string& fix) {
  throw ConfigError(fmt::format("config error: {} = {}: {}. Fix: {}.", key, value, rule, fix));
}

bool is_explicit(const NetworkConfig& n, const char* key) {
  return std::find(n.explicit_keys.begin(), n.explicit_keys.end(), key) != n.explicit_keys.end();
}

}  // namespace

std::vector<std::string> network_profile_names() {
  std::vector<std::string> names;
  for (const auto& p : kProfiles) names.emplace_back(p.name);
  return names;
}

std::vector<std::string> network_skip_names() { return {"tp", "pp_fwd", "pp_bwd", "dp", "embedding", "outer"}; }

void apply_network_profile(NetworkConfig& n, const std::string& name) {
  NetworkProfile values{"", 0.0, 0.0, 0.0, 0.0};  // "" resets the keys the profile controls
  if (!name.empty()) {
    const auto* it = std::find_if(std::begin(kProfiles), std::end(kProfiles),
                                  [&](const NetworkProfile& p) { return name == p.name; });
    if (it == std::end(kProfiles)) {
      throw ConfigError(fmt::format(
          "network.profile = '{}' is not a known profile. Known profiles: {}. Fix: pick one, or "
          "leave profile empty and set intra_node_gbps / inter_node_gbps (and latencies) yourself.",
          name, fmt::join(network_profile_names(), ", ")));
    }
    values = *it;
  }
  n.profile = name;
  double* fields[] = {&n.intra_node_gbps, &n.inter_node_gbps, &n.intra_node_latency_us,
                      &n.inter_node_latency_us};
  const double preset[] = {values.intra_node_gbps, values.inter_node_gbps, values.intra_node_latency_us,
                           values.inter_node_latency_us};
  for (int i = 0; i < 4; ++i) {
    if (!is_explicit(n, kLinkKeys[i])) *fields[i] = preset[i];
  }
}

void validate_network_config(const Config& c) {
  const NetworkConfig& n = c.network;
  const auto profiles = network_profile_names();
  if (!n.profile.empty() && std::find(profiles.begin(), profiles.end(), n.profile) == profiles.end()) {
    fail("network.profile", "'" + n.profile + "'", fmt::format("must be one of {} or empty", fmt::join(profiles, ", ")),
         "pick a listed profile or declare the link keys yourself");
  }
  for (auto [key, v] : {std::pair{"network.intra_node_gbps", n.intra_node_gbps},
                        std::pair{"network.inter_node_gbps", n.inter_node_gbps},
                        std::pair{"network.intra_node_latency_us", n.intra_node_latency_us},
                        std::pair{"network.inter_node_latency_us", n.inter_node_latency_us}}) {
    if (v < 0) fail(key, fmt::format("{}", v), "must be >= 0", "give a bandwidth in GB/s or a latency in µs");
  }
  if (!(n.scale > 0)) {
    fail("network.scale", fmt::format("{}", n.scale), "must be > 0 (it multiplies every emulated time)",
         "use 1 for the declared links as they are, or the factor your experiment derives");
  }
  if (n.emulate && (n.intra_node_gbps <= 0 || n.inter_node_gbps <= 0)) {
    fail("network.emulate", "true",
         fmt::format("needs intra_node_gbps and inter_node_gbps > 0 (have {} and {})", n.intra_node_gbps,
                     n.inter_node_gbps),
         fmt::format("declare both link bandwidths, or name a profile ({}), or set emulate: false",
                     fmt::join(profiles, ", ")));
  }
  if (!n.match_regime.empty()) {
    const std::string v = "'" + n.match_regime + "'";
    if (!n.emulate) {
      fail("network.match_regime", v, "derives the emulated links' scale, and network.emulate is false",
           "set network.emulate: true, or remove match_regime");
    }
    if (n.profile.empty()) {
      fail("network.match_regime", v,
           fmt::format("needs network.profile: the cluster whose links are scaled ({})", fmt::join(profiles, ", ")),
           "name the paper run's profile, e.g. profile: paper-a100-ib200");
    }
    for (const char* key : {"scale", "inter_node_latency_us", "intra_node_latency_us"}) {
      if (is_explicit(n, key)) {
        fail("network.match_regime", v,
             fmt::format("derives network.{} when the run starts, and the config sets it too", key),
             fmt::format("remove network.{}, or set match_regime: \"\" to use your own value", key));
      }
    }
    const bool recorded = n.match_regime.rfind(kRecordedRegimePrefix, 0) == 0;
    const std::string file = recorded ? n.match_regime.substr(std::strlen(kRecordedRegimePrefix)) : n.match_regime;
    if (recorded && !std::filesystem::is_regular_file(file)) {
      fail("network.match_regime", v, "names no file after from: (an earlier run's results file, relative to the working directory)",
           "give the .h5 of the run whose links to reuse, e.g. from:results/emulation-mini-3d-baseline.h5");
    }
    if (!recorded && !std::filesystem::is_regular_file(file)) {
      fail("network.match_regime", v, "is not a file (a paper run's config, relative to the working directory)",
           "give the path of one, e.g. experiments/paper/gpt-2.5b.yaml, and run from the repository; or "
           "from:<results file> to reuse the links an earlier run derived");
    }
  }
  const auto names = network_skip_names();
  for (size_t i = 0; i < n.skip.size(); ++i) {
    const std::string& s = n.skip[i];
    if (std::find(names.begin(), names.end(), s) == names.end()) {
      fail(fmt::format("network.skip[{}]", i), "'" + s + "'",
           fmt::format("must be a traffic class: {}", fmt::join(names, ", ")), "use those names, e.g. [pp_bwd, dp]");
    }
    if (std::count(n.skip.begin(), n.skip.end(), s) > 1) {
      fail("network.skip", fmt::format("[{}]", fmt::join(n.skip, ", ")), fmt::format("lists '{}' twice", s),
           "name each class once");
    }
  }
}

}  // namespace optcc

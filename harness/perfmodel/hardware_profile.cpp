// Hardware profile files (hardware_profile.h documents the format).
#include "harness/perfmodel/hardware_profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/config/config.h"

#ifndef OPTCC_SOURCE_DIR
#define OPTCC_SOURCE_DIR "."
#endif

namespace optcc {
namespace {
namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& origin, const std::string& key, const std::string& value,
                       const std::string& rule) {
  throw ConfigError(fmt::format("profile error: {}: {} = {}: {}. Fix: edit the profile (format: "
                                "harness/perfmodel/hardware_profile.h).",
                                origin, key, value, rule));
}

void check_keys(const YAML::Node& node, const std::string& section, const std::vector<std::string>& known,
                const std::string& origin) {
  if (!node) return;
  if (!node.IsMap()) fail(origin, section, "(not a map)", "must be a map of keys");
  for (const auto& kv : node) {
    const auto key = kv.first.as<std::string>();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      fail(origin, section.empty() ? key : section + "." + key, "(unknown key)",
           fmt::format("known keys{}: {}", section.empty() ? "" : " of " + section, fmt::join(known, ", ")));
    }
  }
}

// A positive number at node[key], or `fallback` when absent (fallback < 0: required).
double number(const YAML::Node& node, const std::string& section, const std::string& key, const std::string& origin,
              double fallback = -1, bool allow_zero = false) {
  const std::string full = section + "." + key;
  if (!node || !node[key]) {
    if (fallback < 0) fail(origin, full, "(missing)", "required");
    return fallback;
  }
  double v = 0;
  try {
    v = node[key].as<double>();
  } catch (const YAML::Exception&) {
    fail(origin, full, node[key].as<std::string>(""), "must be a number");
  }
  if (!(v > 0 || (allow_zero && v == 0))) fail(origin, full, fmt::format("{}", v), allow_zero ? "must be >= 0" : "must be > 0");
  return v;
}

void parse_device(HardwareProfile& hw, const YAML::Node& d, const std::string& origin) {
  check_keys(d, "device", {"peak_tflops", "efficiency", "forward_gflops", "backward_gflops", "memory_gbps",
                           "optimizer_ns_per_parameter"}, origin);
  if (!d) fail(origin, "device", "(missing)", "required");
  const bool measured = d["forward_gflops"] || d["backward_gflops"];
  if (measured && (d["peak_tflops"] || d["efficiency"])) {
    fail(origin, "device", "(both)", "give forward_gflops and backward_gflops (measured) OR peak_tflops and efficiency");
  }
  if (measured) {
    hw.forward_flops_per_s = number(d, "device", "forward_gflops", origin) * 1e9;
    hw.backward_flops_per_s = number(d, "device", "backward_gflops", origin) * 1e9;
  } else {
    const double eff = number(d, "device", "efficiency", origin, 1.0);
    if (eff > 1) fail(origin, "device.efficiency", fmt::format("{}", eff), "must be in (0, 1]");
    hw.forward_flops_per_s = hw.backward_flops_per_s = number(d, "device", "peak_tflops", origin) * 1e12 * eff;
  }
  hw.memory_bytes_per_s = number(d, "device", "memory_gbps", origin) * 1e9;
  const double opt_ns = number(d, "device", "optimizer_ns_per_parameter", origin, 32.0 / hw.memory_bytes_per_s * 1e9, true);
  hw.optimizer_seconds_per_parameter = opt_ns * 1e-9;
}

void parse_network(HardwareProfile& hw, const YAML::Node& n, const std::string& origin) {
  check_keys(n, "network", {"emulator_profile", "intra_node_gbps", "inter_node_gbps", "intra_node_latency_us",
                            "inter_node_latency_us", "scale", "devices_per_node", "nics_per_node"}, origin);
  if (!n) fail(origin, "network", "(missing)", "required");
  NetworkConfig net;
  for (const char* key : {"intra_node_gbps", "inter_node_gbps", "intra_node_latency_us", "inter_node_latency_us"}) {
    if (n[key]) net.explicit_keys.push_back(key);
  }
  net.intra_node_gbps = number(n, "network", "intra_node_gbps", origin, 0);
  net.inter_node_gbps = number(n, "network", "inter_node_gbps", origin, 0);
  net.intra_node_latency_us = number(n, "network", "intra_node_latency_us", origin, 0, true);
  net.inter_node_latency_us = number(n, "network", "inter_node_latency_us", origin, 0, true);
  if (n["emulator_profile"]) {
    hw.emulator_profile = n["emulator_profile"].as<std::string>();
    try {
      apply_network_profile(net, hw.emulator_profile);  // the built-in numbers, one source
    } catch (const ConfigError& e) {
      fail(origin, "network.emulator_profile", hw.emulator_profile, e.what());
    }
  }
  if (!(net.intra_node_gbps > 0 && net.inter_node_gbps > 0)) {
    fail(origin, "network", "(bandwidths)", "needs intra_node_gbps and inter_node_gbps > 0, or an emulator_profile");
  }
  const double scale = number(n, "network", "scale", origin, 1.0);
  hw.links.intra_bytes_per_s = net.intra_node_gbps * 1e9;
  hw.links.inter_bytes_per_s = net.inter_node_gbps * 1e9;
  hw.links.intra_latency_s = net.intra_node_latency_us * 1e-6;
  hw.links.inter_latency_s = net.inter_node_latency_us * 1e-6;
  hw.links.scale = scale;
  hw.devices_per_node = static_cast<int>(number(n, "network", "devices_per_node", origin, 8));
  hw.links.nics_per_node = static_cast<int>(number(n, "network", "nics_per_node", origin, 1));
  if (hw.links.nics_per_node > hw.devices_per_node) {
    fail(origin, "network.nics_per_node", std::to_string(hw.links.nics_per_node), "must be <= devices_per_node");
  }
}

}  // namespace

double HardwareProfile::codec_seconds(const std::string& codec, double flops, double memory_bytes) const {
  const auto it = codec_flops_per_s.find(codec);
  const double rate = it != codec_flops_per_s.end() ? it->second : forward_flops_per_s;
  return std::max(rate > 0 ? flops / rate : 0.0, memory_bytes_per_s > 0 ? memory_bytes / memory_bytes_per_s : 0.0);
}

double HardwareProfile::transport_p2p_seconds(int64_t bytes) const {
  if (!has_transport) return 0.0;
  return transport_step_latency_s + (transport_bytes_per_s > 0 ? double(bytes) / transport_bytes_per_s : 0.0);
}

double HardwareProfile::transport_ring_seconds(CollectiveKind kind, int64_t bytes, int n) const {
  if (!has_transport || n < 2) return 0.0;
  const int steps = kind == CollectiveKind::kAllReduce ? 2 * (n - 1) : n - 1;
  const double send = double(LinkEmulator::ring_send_bytes(kind, bytes, n));
  return steps * transport_step_latency_s + (transport_bytes_per_s > 0 ? send / transport_bytes_per_s : 0.0);
}

HardwareProfile parse_hardware_profile(const std::string& yaml_text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("profile error: {}: not valid YAML: {}", origin, e.what()));
  }
  if (const std::string repeated = repeated_yaml_key(root); !repeated.empty()) {
    throw ConfigError(fmt::format("profile error: {}: key {} is written twice; YAML keeps one of them silently. "
                                  "Fix: keep one.", origin, repeated));
  }
  check_keys(root, "", {"name", "description", "device", "network", "transport", "compression"}, origin);
  HardwareProfile hw;
  hw.path = origin;
  if (!root["name"]) fail(origin, "name", "(missing)", "required");
  hw.name = root["name"].as<std::string>();
  hw.description = root["description"] ? root["description"].as<std::string>() : "";
  parse_device(hw, root["device"], origin);
  parse_network(hw, root["network"], origin);
  if (const YAML::Node t = root["transport"]) {
    check_keys(t, "transport", {"step_latency_us", "gbps"}, origin);
    hw.transport_step_latency_s = number(t, "transport", "step_latency_us", origin, 0, true) * 1e-6;
    hw.transport_bytes_per_s = number(t, "transport", "gbps", origin, 0, true) * 1e9;
    hw.has_transport = true;
  }
  const YAML::Node c = root["compression"];
  if (c && !c.IsMap()) fail(origin, "compression", "(not a map)", "must map codec names to {gflops: X}");
  if (c) {
    for (const auto& kv : c) {
      const auto codec = kv.first.as<std::string>();
      check_keys(kv.second, "compression." + codec, {"gflops"}, origin);
      hw.codec_flops_per_s[codec] = number(kv.second, "compression." + codec, "gflops", origin) * 1e9;
    }
  }
  return hw;
}

HardwareProfile load_hardware_profile(const std::string& name_or_path) {
  std::vector<fs::path> candidates = {fs::path(name_or_path)};
  if (name_or_path.find('/') == std::string::npos && fs::path(name_or_path).extension() != ".yaml") {
    candidates.push_back(fs::path("experiments/profiles") / (name_or_path + ".yaml"));
    candidates.push_back(fs::path(OPTCC_SOURCE_DIR) / "experiments/profiles" / (name_or_path + ".yaml"));
  }
  for (const auto& p : candidates) {
    if (!fs::is_regular_file(p)) continue;
    std::ifstream in(p);
    std::stringstream text;
    text << in.rdbuf();
    HardwareProfile hw = parse_hardware_profile(text.str(), p.string());
    if (hw.name != p.stem().string()) {
      fail(p.string(), "name", hw.name, fmt::format("must equal the file stem '{}'", p.stem().string()));
    }
    return hw;
  }
  throw ConfigError(fmt::format(
      "profile error: --profile {}: no such file, nor experiments/profiles/{}.yaml (here or in {}). Fix: "
      "name a file, or one of experiments/profiles/*.yaml (this-machine.yaml: run `optcc calibrate` first).",
      name_or_path, name_or_path, OPTCC_SOURCE_DIR));
}

}  // namespace optcc

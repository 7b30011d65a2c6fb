// Link emulation set-up on a rank and in the local launcher (see network_setup.h).
#include "harness/train/network_setup.h"

#include <yaml-cpp/yaml.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "harness/records/results_reader.h"

namespace optcc {
namespace {

std::shared_ptr<NicTable> open_nic_table(Distributed& d) {
  const int nodes = d.layout.num_nodes();
  if (const char* name = std::getenv(kNicShmEnv)) return SharedNicTable::open(name, nodes);
  if (d.env.world_size == 1) return std::make_shared<LocalNicTable>(nodes);
  // No launcher of ours (srun / torchrun on one host, ranks as threads): rank 0 creates the
  // segment and publishes its name; once every rank mapped it, rank 0 unlinks it.
  static thread_local int calls = 0;  // the same sequence on every rank (thread or process)
  const int call = calls++;
  std::unique_ptr<SharedNicSegment> segment;
  const std::string key = fmt::format("optcc/nic_shm/{}", call);
  if (d.rank() == 0) {
    segment = std::make_unique<SharedNicSegment>(nic_segment_name(fmt::format("{}-{}", d.env.master_port, call)), nodes);
    d.store->set(key, std::vector<uint8_t>(segment->name().begin(), segment->name().end()));
  }
  const auto v = d.store->get(key);
  std::shared_ptr<NicTable> table = SharedNicTable::open(std::string(v.begin(), v.end()), nodes);
  d.world->barrier();
  if (segment) segment->unlink();
  return table;
}

void attach(Distributed& d, LinkEmulator* e) {
  for (auto* c : {&d.world, &d.tp, &d.dp, &d.pp, &d.model_parallel, &d.embedding, &d.fused_embedding}) {
    if (*c) (*c)->set_emulator(e);
  }
}

}  // namespace

LinkParams link_params(const NetworkConfig& n) {
  LinkParams p;
  p.emulate = n.emulate;
  p.intra_bytes_per_s = n.intra_node_gbps * 1e9;
  p.inter_bytes_per_s = n.inter_node_gbps * 1e9;
  p.intra_latency_s = n.intra_node_latency_us * 1e-6;
  p.inter_latency_s = n.inter_node_latency_us * 1e-6;
  p.scale = n.scale;
  for (int c = 0; c < kNumTraffic; ++c) {
    const std::string name = traffic_name(static_cast<Traffic>(c));
    p.skip[c] = std::find(n.skip.begin(), n.skip.end(), name) != n.skip.end();
  }
  return p;
}

std::string network_summary(const NetworkConfig& n) {
  return fmt::format("emulate={} profile={} intra_node_gbps={} inter_node_gbps={} intra_node_latency_us={} "
                     "inter_node_latency_us={} scale={} skip=[{}]",
                     n.emulate, n.profile.empty() ? "(none)" : n.profile, n.intra_node_gbps, n.inter_node_gbps,
                     n.intra_node_latency_us, n.inter_node_latency_us, n.scale, fmt::join(n.skip, ", "));
}

void setup_network(Distributed& d, const Config& cfg, std::shared_ptr<NicTable> nics) {
  const NetworkConfig& n = cfg.network;
  attach(d, nullptr);
  d.network.reset();
  if (!n.emulate && n.skip.empty()) return;  // off: nothing is constructed
  if (n.emulate) {
    // Hosts are told apart by address (distributed.h): two hosts may share a hostname.
    std::set<std::string> hosts;
    for (size_t r = 0; r < d.addresses.size(); ++r) hosts.insert(fmt::format("{} ({})", d.hosts.at(r), d.addresses[r]));
    if (hosts.size() > 1) {
      throw ConfigError(fmt::format(
          "config error: network.emulate = true: the {} ranks run on {} hosts ({}). Link emulation models a "
          "cluster on ONE machine: it can only add delay to real links, and the nodes' shared NICs live in "
          "this machine's shared memory. Fix: run on one host (e.g. sbatch -N 1), or set network.emulate: "
          "false to measure the real network.",
          d.env.world_size, hosts.size(), fmt::join(hosts, ", ")));
    }
    if (!nics) nics = open_nic_table(d);
  }
  d.network = std::make_unique<LinkEmulator>(link_params(n), d.layout, n.emulate ? nics : nullptr);
  attach(d, d.network.get());
}

void log_network(const NetworkConfig& n, const RankLayout& layout) {
  if (n.emulate) {
    spdlog::info("network emulation on{}: intra-node {} GB/s + {} us per rank pair, inter-node {} GB/s + {} us per "
                 "node NIC (shared by its ranks), scale {}; {} nodes of {} ranks",
                 n.profile.empty() ? "" : " (profile " + n.profile + ")", n.intra_node_gbps, n.intra_node_latency_us,
                 n.inter_node_gbps, n.inter_node_latency_us, n.scale, layout.num_nodes(), layout.ranks_per_node());
  } else if (n.intra_node_gbps > 0 || n.inter_node_gbps > 0) {
    spdlog::info("network.emulate is false: the declared links ({}) are recorded in the results, not enforced",
                 network_summary(n));
  }
  if (!n.skip.empty()) {
    spdlog::warn("network.skip = [{}]: these transfers are skipped (shapes kept, zeros received); the results are "
                 "marked trainable_result = false and are only good for timing by difference (docs/design.md §8.3)",
                 fmt::join(n.skip, ", "));
  }
}

std::unique_ptr<SharedNicSegment> make_launcher_nic_segment(const Config& cfg, int nproc) {
  if (!cfg.network.emulate) return nullptr;
  const int per_node = cfg.parallel.ranks_per_node > 0 ? static_cast<int>(cfg.parallel.ranks_per_node) : nproc;
  const int nodes = (nproc + per_node - 1) / per_node;
  auto segment = std::make_unique<SharedNicSegment>(nic_segment_name("launcher"), nodes);
  setenv(kNicShmEnv, segment->name().c_str(), 1);  // inherited by the ranks (launch_local copies environ)
  return segment;
}

// network.match_regime: from:<results file> (network_setup.h).
std::string reuse_recorded_regime(Config& cfg) {
  const std::string value = cfg.network.match_regime;
  const std::string file = value.substr(std::strlen(kRecordedRegimePrefix));
  const auto refuse = [&](const std::string& rule, const std::string& fix) {
    throw ConfigError(fmt::format("config error: network.match_regime = '{}': {}. Fix: {}.", value, rule, fix));
  };
  std::string recorded_line, recorded_config;
  try {
    recorded_line = read_root_attribute(file, "network_regime");
    recorded_config = read_root_attribute(file, "config");
  } catch (const std::exception& e) {
    refuse(fmt::format("cannot read {} ({})", file, e.what()), "name the results file (.h5) of the run whose links to reuse");
  }
  if (recorded_line.empty()) {
    refuse(fmt::format("{} records no derived regime (its run did not set network.match_regime)", file),
           "name the results file of a run that derived one (its log printed `network.match_regime: scale ...`)");
  }
  const YAML::Node net = YAML::Load(recorded_config)["network"];
  const std::string profile = net["profile"] ? net["profile"].as<std::string>() : "";
  if (profile != cfg.network.profile) {
    refuse(fmt::format("{} derived its scale for network.profile '{}', and this run's profile is '{}'", file, profile,
                       cfg.network.profile),
           fmt::format("set network.profile: {}, or derive a regime for this profile", profile));
  }
  cfg.network.scale = net["scale"].as<double>();
  cfg.network.inter_node_latency_us = net["inter_node_latency_us"].as<double>();
  cfg.network.intra_node_latency_us = net["intra_node_latency_us"].as<double>();
  cfg.network.match_regime = "";
  validate_network_config(cfg);
  return fmt::format("{} (reused from {}: scale {}, latencies {} / {} us inter / intra)", recorded_line, file,
                     cfg.network.scale, cfg.network.inter_node_latency_us, cfg.network.intra_node_latency_us);
}

}  // namespace optcc

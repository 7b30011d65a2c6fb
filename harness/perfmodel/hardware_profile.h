// Hardware profiles for the scale simulator (simulator.h): what one device computes, how fast its
// links are, how fast the compressors run. YAML files under experiments/profiles/ (one per
// cluster; every number there carries a comment saying where it comes from); `optcc calibrate`
// writes this-machine.yaml (calibrate.h).
//
// File format (every key below; an unknown key is an error naming it):
//   name: paper-a100-ib200            # must equal the file stem
//   description: "..."                # one line, printed with the results
//   device:
//     peak_tflops: 156                # dense FLOP/s of the math the model runs (fp32/TF32, ...)
//     efficiency: 0.40                # achieved share on GEMM-heavy layers (forward and backward)
//     forward_gflops: 12.5            # OR measured rates (this-machine): these replace peak x
//     backward_gflops: 10.1           #    efficiency for the forward / backward pass
//     memory_gbps: 1555               # GB/s: element-wise work (compressor passes, optimizer)
//     optimizer_ns_per_parameter: 2.1 # optional; default 32 bytes per parameter / memory_gbps
//                                     # (Adam: read param, grad, m, v; write param, m, v; zero grad)
//   network:
//     emulator_profile: paper-a100-ib200   # the link numbers of a built-in `network.profile`
//                                          # (harness/config/config_network.cpp, their one source)
//     intra_node_gbps / inter_node_gbps / intra_node_latency_us / inter_node_latency_us / scale:
//                                          # OR the links given here, as the config's network keys
//                                          # (GB/s per direction, µs; scale multiplies every time);
//                                          # a key given next to emulator_profile overrides it
//     devices_per_node: 8            # ranks per node (the simulated layout's parallel.ranks_per_node)
//     nics_per_node: 1               # inter-node NICs per node, each of inter_node_gbps, shared
//                                    # rail-style (link_emulator.h LinkParams::nics_per_node)
//   transport:                       # optional (this-machine): the real transport beneath emulated
//     step_latency_us: 900           # links, which no operation beats (an emulated run's operation
//     gbps: 0.6                      # ends at the later of its real and its emulated end): per ring
//                                    # step / message µs, and GB/s (0: no bandwidth term; optcc
//                                    # calibrate measures both)
//   compression:                     # optional, per codec/reducer name (lowrank, powersgd, ...)
//     powersgd: {gflops: 30.0}       # the rate its arithmetic runs at (default: the device's
//                                    # forward rate); element-wise passes use memory_gbps
#pragma once

#include <map>
#include <string>

#include "harness/parallel/link_emulator.h"

namespace optcc {

struct HardwareProfile {
  std::string name;
  std::string description;
  std::string path;                  // the file it came from
  double forward_flops_per_s = 0;    // achieved, per device
  double backward_flops_per_s = 0;
  double memory_bytes_per_s = 0;
  double optimizer_seconds_per_parameter = 0;
  LinkParams links;                  // SI units, scale already applied (emulate = false, skip none)
  std::string emulator_profile;      // "" when the links were given directly
  int devices_per_node = 8;
  std::map<std::string, double> codec_flops_per_s;  // by codec / reducer name
  /// The real transport under emulated links (profile key `transport`); absent in a cluster's
  /// profile, whose links are the transport. Seconds per ring step or message, and bytes/s
  /// (0: latency-bound, no bandwidth term).
  bool has_transport = false;
  double transport_step_latency_s = 0;
  double transport_bytes_per_s = 0;
  /// The transport's time for a message of `bytes`: latency + bytes / bandwidth (0 without one).
  double transport_p2p_seconds(int64_t bytes) const;
  /// The transport's time for a ring collective over n ranks: steps x latency + the bytes one rank
  /// sends (LinkEmulator::ring_send_bytes) / bandwidth; 2(n-1) steps for all-reduce, n-1 otherwise.
  double transport_ring_seconds(CollectiveKind kind, int64_t bytes, int n) const;

  /// Seconds of a compressor's arithmetic: max(flops / its rate, memory_bytes / memory bandwidth)
  /// (roofline; the rate is codec_flops_per_s[codec], else forward_flops_per_s).
  double codec_seconds(const std::string& codec, double flops, double memory_bytes) const;
};

/// Loads `name_or_path`: an existing file, else experiments/profiles/<name>.yaml under the current
/// directory, then under the source tree this binary was built from. Throws ConfigError naming the
/// file, the key, the value and the rule for anything missing, unknown or out of range.
HardwareProfile load_hardware_profile(const std::string& name_or_path);
/// Parses a profile from YAML text (`origin` names it in errors).
HardwareProfile parse_hardware_profile(const std::string& yaml_text, const std::string& origin);

}  // namespace optcc

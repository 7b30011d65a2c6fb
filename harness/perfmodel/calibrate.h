// `optcc calibrate --config X`: measures this machine for the simulator and writes a hardware
// profile (hardware_profile.h), by default experiments/profiles/this-machine.yaml. Measured, each
// as the median of `reps` repetitions in each of `concurrent` processes timing at the same time
// (an emulated run puts all its ranks on this machine, so they share its cores), then the median
// over the processes:
//   device.forward_gflops / backward_gflops  the config's whole model (tp = pp = 1, the config's
//            micro-batch) forward (loss) and backward, with the threads a rank of the run uses
//            (parallel.threads, or cores / local ranks): models/flops.h FLOPs / seconds;
//   device.memory_gbps                       a large fp32 copy (read + write bytes / seconds);
//   device.optimizer_ns_per_parameter        one AdamW step of that model / its parameters;
//   compression.lowrank.gflops               the `cb` scheme's codec (rank 16) encode + decode
//            of one pipeline message slice of the config, FLOPs as the traffic model counts them;
//   compression.powersgd.gflops              PowerSGD rank 128's GEMMs (P = MQ, Q = MᵀP, PQᵀ) on
//            the config's largest DP matrix (fc1 [4h/t, h]);
//   transport.step_latency_us / gbps         the real transport beneath the emulated links: a
//            Gloo all-reduce between processes 2k and 2k+1 of one TP message ([s, b, h] fp32)
//            and of 16x that, each after a GEMM of one layer half (the others compute meanwhile,
//            as in a run), timed from the later of the two posts, fitted as t(S) = 2 x latency
//            + S / bandwidth (hardware_profile.h);
//   network                                  the config's network section as it stands (the
//            emulated links: GB/s, µs, scale), devices_per_node = parallel.ranks_per_node;
//            with network.match_regime, the scale and latencies a run of the config would derive
//            from these rates (regime.h), and a last comment line saying how.
// Uses the CPU heavily for tens of seconds: run it on a quiet machine.
#pragma once

#include <cstdint>
#include <string>

#include "harness/config/config.h"
#include "harness/parallel/distributed.h"

namespace optcc {

struct CalibrateOptions {
  std::string output = "experiments/profiles/this-machine.yaml";
  int64_t concurrent = 0;  // 0: the config's world size (tp·pp·dp)
  int64_t reps = 5;
};

/// network.match_regime's measurement (regime.h), on every rank of a running job at once (so the
/// ranks share the cores as they will in the run): each rank measures what `optcc calibrate`
/// measures (its transport with its neighbour on the same host, local ranks 2k and 2k+1, meeting
/// in the run's store), the world sums a [world, 8] fp64 table in which each rank filled its own row
/// (control traffic), and every rank takes the same medians. Returns the profile as `optcc
/// calibrate` writes it (YAML, named run-start; the config's network section as it stands), so
/// the same parser reads both. Collective over d.world; a world of one measures alone.
std::string measure_machine_in_run(const Config& cfg, Distributed& d, int64_t reps = 5);

/// Measures and writes the profile; prints it. Returns the exit code.
int run_calibrate_command(const Config& cfg, const CalibrateOptions& o);

}  // namespace optcc

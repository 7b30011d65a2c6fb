// `optcc comm-check`: verifies a launch (local, Slurm or torchrun) end to end before a long job:
// rendezvous, every group of the config's layout, a closed-form all-reduce in each, a p2p exchange
// between neighbouring pipeline stages, and the per-rank traffic the checks produced.
#pragma once

#include <chrono>
#include <vector>

#include "harness/config/config.h"

namespace optcc {

struct CommCheckOptions {
  int die_rank = -1;       // test hook: this rank SIGKILLs itself after the rendezvous
  bool quiet = false;
  /// --time-allreduce: after the checks, time a world all-reduce (sum) of one fp32 tensor of each
  /// size, in MB (1e6 bytes), through the run's communicator as dp traffic (so with
  /// network.emulate the link emulator charges it as it would a gradient all-reduce): one warm-up,
  /// then `reps` calls, each from a world barrier; a call's time is the slowest rank's. Rank 0
  /// prints one line per size and the results land in `allreduce_ms` (every rank: mean and median).
  std::vector<double> time_allreduce_mb;
  int reps = 5;
};

/// One timed size of --time-allreduce: milliseconds, the slowest rank per call.
struct AllReduceTiming {
  double mb = 0, mean_ms = 0, median_ms = 0, min_ms = 0;
};

/// Runs on every rank (after the launcher set the environment). Returns 0 on success; throws
/// CommError/ConfigError with a message naming the rank, group and operation on failure.
int run_comm_check(const Config& cfg, const CommCheckOptions& options,
                   std::vector<AllReduceTiming>* allreduce_ms = nullptr);

}  // namespace optcc

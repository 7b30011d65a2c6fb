// `optcc comm-check`: verifies a launch (local, Slurm or torchrun) end to end before a long job:
// rendezvous, every group of the config's layout, a closed-form all-reduce in each, a p2p exchange
// between neighbouring pipeline stages, and the per-rank traffic the checks produced.
#pragma once

#include <chrono>

#include "harness/config/config.h"

namespace optcc {

struct CommCheckOptions {
  int die_rank = -1;       // test hook: this rank SIGKILLs itself after the rendezvous
  bool quiet = false;
};

/// Runs on every rank (after the launcher set the environment). Returns 0 on success; throws
/// CommError/ConfigError with a message naming the rank, group and operation on failure.
int run_comm_check(const Config& cfg, const CommCheckOptions& options);

}  // namespace optcc

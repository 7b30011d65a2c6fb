// Process-level distributed set-up: rendezvous through c10d's TCPStore, then one Communicator per
// group this rank belongs to (TP, DP, PP, model-parallel, embedding, fused embedding), built from the
// pure RankLayout. Also the local launcher that forks + execs N ranks of this binary and supervises
// them (docs/architecture.md §4).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "harness/parallel/communicator.h"
#include "harness/parallel/device.h"
#include "harness/parallel/launch_env.h"
#include "harness/parallel/layout.h"
#include "harness/parallel/link_emulator.h"

namespace optcc {

/// Everything a rank needs to talk to the others. Built once, passed by reference (no globals).
struct Distributed {
  LaunchEnv env;
  RankLayout layout;
  TrafficMeter meter;
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<Communicator> world, tp, dp, pp, model_parallel, embedding, fused_embedding;
  std::vector<std::string> hosts;  // host of every rank (exchanged through the store at start-up)
  std::unique_ptr<LinkEmulator> network;  // link emulation / skipping; null when off (network_setup.h)
  Placement placement;  // this rank's device and the groups' backend (device.h); CPU + Gloo by default
  int rank() const { return env.rank; }
  RankCoord coord() const { return layout.coord(env.rank); }
};

/// Connects to the TCPStore at env.master_addr:master_port (rank 0 hosts it) and creates this
/// rank's groups. Every rank of the world must call it. `timeout` bounds the rendezvous and every
/// later collective. Throws CommError naming the address and the ranks that did not arrive; throws
/// std::invalid_argument when dims.world() != env.world_size (naming both).
/// `store`: use this store instead of a TCPStore (tests: ranks as threads sharing a HashStore).
/// A world of one rank needs no store and creates no process group.
/// `placement`: the rank's device and the backend of every group (resolve_placement); with NCCL
/// every group is a ProcessGroupNCCL on placement.device (a CUDA build's), else Gloo.
std::unique_ptr<Distributed> init_distributed(const ParallelDims& dims, int ranks_per_node, const LaunchEnv& env,
                                              std::chrono::milliseconds timeout,
                                              c10::intrusive_ptr<c10d::Store> store = {}, Placement placement = {});

/// The start-up table: rank -> (tp, dp, pp) -> node -> host, one line per rank.
std::string rank_table(const Distributed& d);

/// Forks + execs this binary (/proc/self/exe) with `argv` (argv[0] as the user typed it) `nproc`
/// times with OPTCC_RANK / OPTCC_WORLD_SIZE / OPTCC_LOCAL_RANK / OPTCC_LOCAL_WORLD_SIZE /
/// MASTER_ADDR=127.0.0.1 / MASTER_PORT (a free port this launcher picked and logs; an exported
/// MASTER_PORT or MASTER_ADDR is replaced, never obeyed) / OPTCC_LAUNCHER_PID set, and waits.
/// Each rank calls die_with_launcher() (stop_signal.h): a launcher killed even by SIGKILL takes
/// its ranks with it. SIGTERM and SIGUSR1 sent to the launcher are forwarded to every rank (a
/// training rank then checkpoints and exits kStoppedExitCode) and the launcher keeps waiting.
/// When a rank exits non-zero (other than kStoppedExitCode) or by a signal, the others get SIGINT,
/// then SIGKILL after `grace`; the message names the rank and its status. Returns 0 when all ranks
/// succeed, else the first failing rank's exit code (or 128 + signal), else kStoppedExitCode when
/// the ranks stopped on a forwarded signal.
int launch_local(int nproc, const std::vector<std::string>& argv, std::chrono::milliseconds grace);

/// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close).
int free_local_port();

}  // namespace optcc

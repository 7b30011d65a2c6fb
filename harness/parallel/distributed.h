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
  std::vector<std::string> hosts;      // hostname of every rank (exchanged through the store at start-up)
  std::vector<std::string> addresses;  // IPv4 address every rank's groups listen on (listen_address);
                                       // hosts are told apart by it: two hosts may share a hostname
  std::unique_ptr<LinkEmulator> network;  // link emulation / skipping; null when off (network_setup.h)
  Placement placement;  // this rank's device and the groups' backend (device.h); CPU + Gloo by default
  int rank() const { return env.rank; }
  RankCoord coord() const { return layout.coord(env.rank); }
};

/// The IPv4 address (dotted quad) this rank's Gloo groups listen on and advertise to the others.
/// env.interface set (GLOO_SOCKET_IFNAME or parallel.interface): that interface's first IPv4
/// address. Else the local end of the route to env.master_addr: 127.0.0.1 when the master is this
/// machine's loopback (one host), else the address of the interface that reaches it, so a hostname
/// that resolves to a loopback address (Debian's /etc/hosts: 127.0.1.1) on the other hosts does not
/// matter; on rank 0's own host it would give a loopback address, which is refused when the job
/// spans more than one node (env.num_nodes > 1), naming parallel.interface as the fix.
/// Throws CommError naming the interface and the ones this host has, or the master address that
/// does not resolve or has no route.
std::string listen_address(const LaunchEnv& env);

/// Why the layout's nodes are not the real hosts, or "" when they are. Hosts are told apart by
/// address; across hosts no rank may listen on a loopback address. One address for every rank is
/// one machine: ranks_per_node then only labels emulated
/// nodes and any value goes. Across hosts, ranks r and s must share an address exactly when
/// layout.node_of(r) == layout.node_of(s) (TP inside a host, PP and DP across, as the layout and
/// the traffic records assume). `hostnames` name the hosts in the message.
std::string node_mismatch(const RankLayout& layout, const std::vector<std::string>& addresses,
                          const std::vector<std::string>& hostnames);

/// Connects to the TCPStore at env.master_addr:master_port (rank 0 hosts it) and creates this
/// rank's groups, listening on listen_address(env). Across hosts, throws std::runtime_error when
/// node_mismatch() finds the layout's nodes are not the hosts (naming both). Every rank of the world must call it. `timeout` bounds the rendezvous and every
/// later collective. Throws CommError naming the address and the ranks that did not arrive; throws
/// std::invalid_argument when dims.world() != env.world_size (naming both).
/// `store`: use this store instead of a TCPStore (tests: ranks as threads sharing a HashStore).
/// A world of one rank needs no store and creates no process group.
/// `placement`: the rank's device and the backend of every group (resolve_placement); with NCCL
/// every group is a ProcessGroupNCCL on placement.device (a CUDA build's), else Gloo.
std::unique_ptr<Distributed> init_distributed(const ParallelDims& dims, int ranks_per_node, const LaunchEnv& env,
                                              std::chrono::milliseconds timeout,
                                              c10::intrusive_ptr<c10d::Store> store = {}, Placement placement = {});

/// The start-up table: rank -> (tp, dp, pp) -> node -> host (address), one line per rank.
std::string rank_table(const Distributed& d);

/// Hostnames that more than one host (address) answers to, e.g. "node (198.18.0.1, 198.18.0.2)";
/// "" when none. Handled (hosts are told apart by address); worth a warning in the log.
std::string shared_hostnames(const Distributed& d);

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
///
/// Several hosts (`nodes`, nnodes > 1): run one launcher per host, each with the same nproc and
/// master and its own node_rank; this host's ranks get global ranks node_rank·nproc + local rank of
/// a world of nnodes·nproc, MASTER_ADDR/MASTER_PORT = nodes.master_addr/master_port (rank 0 runs
/// on the host of node_rank 0, which must be reachable at that address from every host), and the
/// launcher supervises only its own ranks (a rank that dies elsewhere ends these through their
/// collectives' timeout).
struct LaunchNodes {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // nnodes > 1: rank 0's host, as the other hosts reach it
  int master_port = 0;      // nnodes > 1: the rendezvous port, the same on every host
};
int launch_local(int nproc, const std::vector<std::string>& argv, std::chrono::milliseconds grace,
                 const LaunchNodes& nodes = {});

/// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close).
int free_local_port();

}  // namespace optcc

// Who am I in the job: rank, world, local rank, node and rendezvous address, read from the
// environment a launcher left. Pure: the environment and hostname are passed in, so every
// launcher's variables can be tested without setting real ones.
//
// Precedence (first match wins):
//   "local"    OPTCC_RANK or OPTCC_WORLD_SIZE set (our own `optcc train --nproc N` launcher, which
//              also sets OPTCC_LOCAL_RANK, OPTCC_LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
//   "torchrun" RANK or WORLD_SIZE set (also LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
//              GROUP_RANK = node, GROUP_WORLD_SIZE = nodes, TORCHELASTIC_RUN_ID = job id).
//   "slurm"    SLURM_PROCID set (srun starting one process per GPU): SLURM_PROCID, SLURM_NTASKS,
//              SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NUM_NODES or SLURM_NNODES,
//              SLURM_JOB_NODELIST, SLURM_JOB_ID, SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE.
//   "single"   none of the above: rank 0 of 1.
// With every launcher, GLOO_SOCKET_IFNAME sets LaunchEnv::interface (of a list "eth0,eth1", the
// first: optcc's groups listen on one interface).
//
// Slurm (BR-20): MASTER_ADDR in the environment is ignored; the rendezvous host is the first host
// of the expanded SLURM_JOB_NODELIST, and global rank 0 must run there. The port is MASTER_PORT
// when set, else port_from_job_id(SLURM_JOB_ID), the same on every rank without any exchange (a
// random port broadcast from rank 0 races with other jobs; the store side retries its bind).
//
// Consistency checks throw std::runtime_error whose message states the rule broken and lists
// every launcher variable found (NAME=value), e.g. rank >= world, local rank >= tasks per node,
// SLURM_NTASKS != nodes x tasks-per-node, node list length != number of nodes, rank 0 not on the
// first node of the list, torchrun without MASTER_ADDR, a non-integer where a number is due.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace optcc {

struct LaunchEnv {
  int rank = 0;              // global rank, 0 <= rank < world_size
  int world_size = 1;        // number of processes in the job
  int local_rank = 0;        // rank on this node; selects the device
  int local_world_size = 1;  // processes on this node (default ranks_per_node for RankLayout)
  int node_rank = 0;         // 0 <= node_rank < num_nodes
  int num_nodes = 1;
  std::string master_addr = "127.0.0.1";  // host of global rank 0 (TCPStore server)
  int master_port = kDefaultMasterPort;
  std::string source = "single";          // "local" | "torchrun" | "slurm" | "single"
  std::string job_id;                     // SLURM_JOB_ID / TORCHELASTIC_RUN_ID / OPTCC_JOB_ID; may be empty
  std::vector<std::string> hosts;         // the job's node list when the launcher gives one (Slurm);
                                          // empty otherwise. hosts[node_rank] is this rank's node.
  std::string interface;                  // network interface the process groups listen on, from
                                          // GLOO_SOCKET_IFNAME (any launcher; PyTorch's name for it)
                                          // or parallel.interface; "" = the one routed to master_addr
  std::string interface_source;           // where `interface` came from, for error messages

  static constexpr int kDefaultMasterPort = 29500;  // "local" without MASTER_PORT, and "single"
};

/// Looks up one environment variable; nullopt when unset. An empty value counts as set.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// EnvLookup over the real process environment (getenv).
EnvLookup process_env();
/// gethostname(), or "" when it fails.
std::string this_hostname();

/// parallel.interface (`config_value`), when set, wins over GLOO_SOCKET_IFNAME: e.interface.
void use_interface(LaunchEnv& e, const std::string& config_value);

/// Reads the launcher's variables as described at the top of this file. `hostname` is this
/// machine's name; it is compared with the Slurm node list for rank 0 (names compared up to the
/// first '.', so "gpu01.cluster" matches "gpu01"); pass "" to skip that check.
LaunchEnv detect_launch_env(const EnvLookup& env, const std::string& hostname);

/// Expands a Slurm host list: "gpu[01-02,05],cpu3" -> {gpu01, gpu02, gpu05, cpu3}. Zero padding is
/// kept (a range's width is that of its lower bound: "n[08-10]" -> n08 n09 n10); several bracket
/// groups in one name expand as a product ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). "" -> {}.
/// Throws std::runtime_error on unbalanced brackets or a malformed range.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist);

/// Expands SLURM_TASKS_PER_NODE: "4(x2),3" -> {4, 4, 3}. Throws std::runtime_error when malformed.
std::vector<int> expand_slurm_tasks_per_node(const std::string& spec);

/// Rendezvous port in [20000, 60000), a pure function of the job id. An all-digit id maps to
/// 20000 + id % 40000, so jobs submitted close together get different ports; other ids (array
/// jobs "123_4", run ids) are hashed (FNV-1a). Throws std::runtime_error on an empty id.
int port_from_job_id(const std::string& job_id);

}  // namespace optcc

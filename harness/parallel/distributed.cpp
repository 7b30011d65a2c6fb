#include "harness/parallel/distributed.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

#include "harness/parallel/device.h"
#include <thread>

extern char** environ;

namespace optcc {
namespace {

std::string group_name(const char* kind, const std::vector<int>& members) {
  return fmt::format("{}[{}]", kind, fmt::join(members, ","));
}

// One group of the run's backend (d.placement): Gloo, or NCCL on the rank's GPU.
std::unique_ptr<Communicator> make_communicator(Distributed& d, const std::vector<int>& members, int me,
                                                const std::string& name, std::chrono::milliseconds timeout) {
  const bool nccl = d.placement.backend == "nccl";
  const int n = static_cast<int>(members.size());
  ProcessGroupPtr pg;
  if (n > 1) {
    pg = nccl ? make_nccl_group(d.store, name, me, n, d.placement.device.index(), timeout)
              : make_gloo_group(d.store, name, me, n, timeout);
  }
  auto c = std::make_unique<Communicator>(pg, members, d.rank(), name, d.layout.group_link(members), &d.meter, timeout);
  if (nccl) c->set_backend_device(d.placement.device);
  return c;
}

std::unique_ptr<Communicator> make_group(Distributed& d, GroupKind kind, std::chrono::milliseconds timeout) {
  const std::vector<int> members = d.layout.group(kind, d.rank());
  if (members.empty()) return nullptr;  // e.g. embedding groups on middle stages
  const std::string name = group_name(std::string(group_kind_name(kind)).c_str(), members);
  int me = 0;
  while (members[me] != d.rank()) ++me;
  return make_communicator(d, members, me, name, timeout);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "stopped";
}

}  // namespace

std::unique_ptr<Distributed> init_distributed(const ParallelDims& dims, int ranks_per_node, const LaunchEnv& env,
                                              std::chrono::milliseconds timeout,
                                              c10::intrusive_ptr<c10d::Store> store, Placement placement) {
  dims.validate(env.world_size);
  auto d = std::unique_ptr<Distributed>(new Distributed{env, RankLayout(dims, ranks_per_node), {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}});
  d->placement = std::move(placement);
  c10d::TCPStoreOptions opts;
  use_classic_tcpstore(opts);  // compat/torch_compat.h: LibTorch 2.x's libuv default
  opts.port = static_cast<uint16_t>(env.master_port);
  opts.isServer = env.rank == 0;
  opts.numWorkers = env.world_size;
  opts.waitWorkers = true;
  opts.timeout = timeout;
  d->store = store;
  if (!d->store && env.world_size > 1) try {
    d->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: rendezvous at {}:{} ({} ranks expected, {} launcher) failed within {} ms: {}",
                                env.rank, env.master_addr, env.master_port, env.world_size, env.source,
                                timeout.count(), e.what()));
  }
  d->hosts.assign(env.world_size, this_hostname());
  if (d->store) {  // everyone publishes its host name; every rank reads all (blocking, with timeout)
    const std::string mine = this_hostname();
    d->store->set(fmt::format("host/{}", env.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int r = 0; r < env.world_size; ++r) {
      const auto v = d->store->get(fmt::format("host/{}", r));
      d->hosts[r] = std::string(v.begin(), v.end());
    }
  }
  std::vector<int> all(env.world_size);
  for (int i = 0; i < env.world_size; ++i) all[i] = i;
  d->world = make_communicator(*d, all, env.rank, "world", timeout);
  d->tp = make_group(*d, GroupKind::kTensorParallel, timeout);
  d->dp = make_group(*d, GroupKind::kDataParallel, timeout);
  d->pp = make_group(*d, GroupKind::kPipelineParallel, timeout);
  d->model_parallel = make_group(*d, GroupKind::kModelParallel, timeout);
  d->embedding = make_group(*d, GroupKind::kEmbedding, timeout);
  d->fused_embedding = make_group(*d, GroupKind::kFusedEmbedding, timeout);
  return d;
}

std::string rank_table(const Distributed& d) {
  std::string out = fmt::format("  {:>5} {:>4} {:>4} {:>4} {:>5}  host\n", "rank", "tp", "dp", "pp", "node");
  for (int r = 0; r < d.layout.world(); ++r) {
    const RankCoord c = d.layout.coord(r);
    out += fmt::format("  {:>5} {:>4} {:>4} {:>4} {:>5}  {}\n", r, c.tp, c.dp, c.pp, d.layout.node_of(r), d.hosts[r]);
  }
  return out;
}

int free_local_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_local_port: socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error("free_local_port: cannot bind a loopback port");
  }
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

int launch_local(int nproc, const std::vector<std::string>& argv, std::chrono::milliseconds grace) {
  const int port = free_local_port();
  std::map<pid_t, int> rank_of;
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
    for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"OPTCC_RANK", std::to_string(r)}, {"OPTCC_WORLD_SIZE", std::to_string(nproc)},
             {"OPTCC_LOCAL_RANK", std::to_string(r)}, {"OPTCC_LOCAL_WORLD_SIZE", std::to_string(nproc)},
             {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}}) {
      env_s.push_back(k + "=" + v);
    }
    std::vector<std::string> args = argv;  // argv[0] kept as typed (shown in logs and results)
    std::vector<char*> cargv, cenv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env_s) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargv.data(), cenv.data()) != 0) {
      throw std::runtime_error(fmt::format("launch: cannot start rank {}", r));
    }
    rank_of[pid] = r;
  }
  spdlog::info("launched {} local ranks (rendezvous 127.0.0.1:{})", nproc, port);
  int result = 0;
  bool terminating = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (!rank_of.empty()) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, terminating ? WNOHANG : 0);
    if (pid > 0) {
      const int r = rank_of[pid];
      rank_of.erase(pid);
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !terminating) {
        spdlog::error("rank {} {}; stopping the other {} ranks", r, describe_status(status), rank_of.size());
        result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        terminating = true;
        deadline = std::chrono::steady_clock::now() + grace;
        for (auto& [p, _] : rank_of) kill(p, SIGTERM);
      }
      continue;
    }
    if (terminating && std::chrono::steady_clock::now() > deadline) {
      for (auto& [p, _] : rank_of) kill(p, SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace optcc

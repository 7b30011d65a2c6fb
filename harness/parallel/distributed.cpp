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

#include <condition_variable>
#include <map>
#include <mutex>

#include "harness/parallel/device.h"
#include "harness/parallel/stop_signal.h"
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

// Every rank publishes its host name in the store and reads all (blocking, with the store's timeout).
std::vector<std::string> publish_hosts(c10d::Store& store, const LaunchEnv& env) {
  const std::string mine = this_hostname();
  store.set(fmt::format("host/{}", env.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> hosts(env.world_size);
  for (int r = 0; r < env.world_size; ++r) {
    const auto v = store.get(fmt::format("host/{}", r));
    hosts[r] = std::string(v.begin(), v.end());
  }
  return hosts;
}

// The TCPStore rendezvous and the host exchange, on a helper thread that this one waits for at most
// `timeout`: a listener that accepts the connection but never answers as a store (another program on
// MASTER_PORT) would otherwise block the rank forever. The helper touches only state it shares, so
// it may outlive the error (the process then exits).
std::pair<c10::intrusive_ptr<c10d::Store>, std::vector<std::string>> tcp_rendezvous(const LaunchEnv& env,
                                                                                    c10d::TCPStoreOptions opts,
                                                                                    std::chrono::milliseconds timeout) {
  struct Shared {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::string error;
    c10::intrusive_ptr<c10d::Store> store;
    std::vector<std::string> hosts;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, env, opts] {
    std::string error;
    c10::intrusive_ptr<c10d::Store> store;
    std::vector<std::string> hosts;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
      hosts = publish_hosts(*store, env);
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::lock_guard<std::mutex> lock(shared->m);
    shared->error = error;
    shared->store = store;
    shared->hosts = hosts;
    shared->done = true;
    shared->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->m);
  const bool ended = shared->cv.wait_for(lock, timeout + std::chrono::seconds(2), [&] { return shared->done; });
  const std::string where = fmt::format("rank {}: rendezvous at {}:{} ({} ranks expected, {} launcher)", env.rank,
                                        env.master_addr, env.master_port, env.world_size, env.source);
  if (!ended) {
    throw CommError(fmt::format(
        "{}: no answer from a store within {} ms: the connection was accepted but nothing answered as a c10d "
        "store, so another program may be listening on port {} of {}. Fix: pick a free MASTER_PORT, and check "
        "that MASTER_ADDR is rank 0's host",
        where, timeout.count(), env.master_port, env.master_addr));
  }
  if (!shared->error.empty()) {
    throw CommError(fmt::format("{} failed within {} ms: {}", where, timeout.count(), shared->error));
  }
  return {shared->store, shared->hosts};
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
  d->hosts.assign(env.world_size, this_hostname());
  if (!d->store && env.world_size > 1) {
    auto rendezvous = tcp_rendezvous(env, opts, timeout);
    d->store = rendezvous.first;
    d->hosts = rendezvous.second;
  } else if (d->store) {
    d->hosts = publish_hosts(*d->store, env);
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

namespace {

volatile sig_atomic_t g_launcher_signal = 0;  // SIGTERM/SIGUSR1 to forward to the ranks, or 0

extern "C" void record_launcher_signal(int signal) { g_launcher_signal = signal; }

// This process's environment without the variables the launcher sets for its ranks (an exported
// MASTER_PORT must not win over the port the launcher picked: getenv takes the first entry).
std::vector<std::string> rank_environment(const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& [k, v] : set) replaced = replaced || kv.rfind(k + "=", 0) == 0;
    if (!replaced) env.push_back(kv);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

// Forward a batch system's stop signals to the ranks (stop_signal.h) instead of dying of them.
void forward_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = record_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

// Starts the `nproc` ranks (this binary, `argv`) with their launch environment; pid -> rank.
std::map<pid_t, int> spawn_ranks(int nproc, const std::vector<std::string>& argv, int port) {
  std::map<pid_t, int> rank_of;
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string> env_s = rank_environment(
        {{"OPTCC_RANK", std::to_string(r)}, {"OPTCC_WORLD_SIZE", std::to_string(nproc)},
         {"OPTCC_LOCAL_RANK", std::to_string(r)}, {"OPTCC_LOCAL_WORLD_SIZE", std::to_string(nproc)},
         {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
         {"OPTCC_LAUNCHER_PID", std::to_string(getpid())}});  // die_with_launcher (stop_signal.h)
    std::vector<std::string> args = argv;  // argv[0] kept as typed (shown in logs and results)
    std::vector<char*> cargv, cenv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env_s) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargv.data(), cenv.data()) != 0) {
      for (auto& [p, _] : rank_of) kill(p, SIGKILL);
      throw std::runtime_error(fmt::format("launch: cannot start rank {}", r));
    }
    rank_of[pid] = r;
  }
  return rank_of;
}

}  // namespace

int launch_local(int nproc, const std::vector<std::string>& argv, std::chrono::milliseconds grace) {
  const int port = free_local_port();
  forward_stop_signals();
  std::map<pid_t, int> rank_of = spawn_ranks(nproc, argv, port);
  const char* exported = std::getenv("MASTER_PORT");
  spdlog::info("launched {} local ranks (rendezvous 127.0.0.1:{}, a free port this launcher picked{})", nproc, port,
               exported ? fmt::format("; the exported MASTER_PORT={} is not used", exported) : "");
  int result = 0;
  bool terminating = false, stopped = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (!rank_of.empty()) {
    if (const int sig = g_launcher_signal; sig != 0) {
      g_launcher_signal = 0;
      spdlog::warn("launcher: {} received; forwarded to the {} ranks (they stop after the current step, write a "
                   "checkpoint and exit {})", strsignal(sig), rank_of.size(), kStoppedExitCode);
      for (auto& [p, _] : rank_of) kill(p, sig);
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const int r = rank_of[pid];
      rank_of.erase(pid);
      const bool stop = WIFEXITED(status) && WEXITSTATUS(status) == kStoppedExitCode;
      stopped = stopped || stop;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !stop;
      if (failed && terminating) {
        spdlog::info("rank {} {}", r, describe_status(status));  // after the first failure: not the cause
      }
      if (failed && !terminating) {
        spdlog::error("rank {} {} (the first to fail; its error is above); stopping the other {} ranks", r,
                      describe_status(status), rank_of.size());
        result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        terminating = true;
        deadline = std::chrono::steady_clock::now() + grace;
        // SIGINT, not SIGTERM: a training rank would take SIGTERM as "checkpoint and stop" and wait
        // for the dead rank in that step's collectives.
        for (auto& [p, _] : rank_of) kill(p, SIGINT);
      }
      continue;
    }
    if (terminating && std::chrono::steady_clock::now() > deadline) {
      for (auto& [p, _] : rank_of) kill(p, SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result != 0 ? result : (stopped ? kStoppedExitCode : 0);
}

}  // namespace optcc

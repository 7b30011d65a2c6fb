#include "harness/parallel/distributed.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

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
              : make_gloo_group(d.store, name, me, n, timeout, d.addresses.at(d.rank()));
  }
  auto c = std::make_unique<Communicator>(pg, members, d.rank(), name, d.layout.group_link(members), &d.meter, timeout);
  std::vector<std::string> hosts;
  for (int r : members) hosts.push_back(fmt::format("{} ({})", d.hosts.at(r), d.addresses.at(r)));
  c->set_member_hosts(std::move(hosts));
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

struct HostOf {
  std::vector<std::string> hostnames, addresses;
};

// Every rank publishes its hostname and listen address in the store and reads all (blocking, with
// the store's timeout).
HostOf publish_hosts(c10d::Store& store, const LaunchEnv& env, const std::string& address) {
  const std::string mine = this_hostname() + "\n" + address;
  store.set(fmt::format("host/{}", env.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  HostOf all;
  for (int r = 0; r < env.world_size; ++r) {
    const auto v = store.get(fmt::format("host/{}", r));
    const std::string s(v.begin(), v.end());
    const size_t nl = s.find('\n');
    all.hostnames.push_back(s.substr(0, nl));
    all.addresses.push_back(nl == std::string::npos ? "" : s.substr(nl + 1));
  }
  return all;
}

std::string ipv4_text(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return buf;
}

// The first IPv4 address of interface `name`, or "" (and the interfaces with one, in `seen`).
std::string interface_address(const std::string& name, std::vector<std::string>& seen) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const std::string address = ipv4_text(*reinterpret_cast<const sockaddr_in*>(i->ifa_addr));
    seen.push_back(fmt::format("{} ({})", i->ifa_name, address));
    if (found.empty() && name == i->ifa_name) found = address;
  }
  freeifaddrs(list);
  return found;
}

// The TCPStore rendezvous and the host exchange, on a helper thread that this one waits for at most
// `timeout`: a listener that accepts the connection but never answers as a store (another program on
// MASTER_PORT) would otherwise block the rank forever. The helper touches only state it shares, so
// it may outlive the error (the process then exits).
std::pair<c10::intrusive_ptr<c10d::Store>, HostOf> tcp_rendezvous(const LaunchEnv& env, const std::string& address,
                                                                  c10d::TCPStoreOptions opts,
                                                                  std::chrono::milliseconds timeout) {
  struct Shared {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::string error;
    c10::intrusive_ptr<c10d::Store> store;
    HostOf hosts;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, env, address, opts] {
    std::string error;
    c10::intrusive_ptr<c10d::Store> store;
    HostOf hosts;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
      hosts = publish_hosts(*store, env, address);
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

std::string listen_address(const LaunchEnv& env) {
  if (!env.interface.empty()) {
    std::vector<std::string> seen;
    const std::string address = interface_address(env.interface, seen);
    if (address.empty()) {
      throw CommError(fmt::format(
          "rank {}: {} = {}: this host ({}) has no interface of that name with an IPv4 address; it has {}. Fix: "
          "name one of them, or unset it to use the interface routed to MASTER_ADDR {}",
          env.rank, env.interface_source.empty() ? "parallel.interface" : env.interface_source, env.interface,
          this_hostname(), seen.empty() ? "none" : fmt::format("{}", fmt::join(seen, ", ")), env.master_addr));
    }
    return address;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(env.master_addr.c_str(), std::to_string(env.master_port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw CommError(fmt::format("rank {}: MASTER_ADDR {} ({} launcher) does not resolve to an IPv4 address: {}. "
                                "Fix: give rank 0's host name or address",
                                env.rank, env.master_addr, env.source, gai_strerror(rc)));
  }
  // connect() on a UDP socket sends nothing: the kernel picks the route and its source address.
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  std::string address;
  int err = 0;
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) address = ipv4_text(local);
  }
  err = errno;
  const std::string master = ipv4_text(*reinterpret_cast<const sockaddr_in*>(found->ai_addr));
  freeaddrinfo(found);
  if (fd >= 0) close(fd);
  if (address.empty()) {
    throw CommError(fmt::format("rank {}: no route from this host ({}) to MASTER_ADDR {} ({}): {}. Fix: check the "
                                "address of rank 0's host, or name the interface that reaches it in "
                                "parallel.interface (or GLOO_SOCKET_IFNAME)",
                                env.rank, this_hostname(), env.master_addr, master, std::strerror(err)));
  }
  if (address.rfind("127.", 0) == 0 && env.num_nodes > 1) {
    throw CommError(fmt::format(
        "rank {}: MASTER_ADDR {} is {} on this host ({}), a loopback address (Debian's /etc/hosts maps a host's own "
        "name to 127.0.1.1), but the job spans {} nodes: this rank's groups would listen where no other host can "
        "reach them. Fix: set parallel.interface (or GLOO_SOCKET_IFNAME) to the interface the other hosts reach "
        "(e.g. eth0, ib0), or give MASTER_ADDR as that interface's address",
        env.rank, env.master_addr, master, this_hostname(), env.num_nodes));
  }
  return address;
}

std::string node_mismatch(const RankLayout& layout, const std::vector<std::string>& addresses,
                          const std::vector<std::string>& hostnames) {
  const std::set<std::string> distinct(addresses.begin(), addresses.end());
  if (distinct.size() <= 1) return "";
  auto host = [&](int r) { return fmt::format("{} ({})", hostnames.at(r), addresses.at(r)); };
  for (int r = 0; r < static_cast<int>(addresses.size()); ++r) {
    if (addresses[r].rfind("127.", 0) != 0) continue;
    return fmt::format("rank {} listens on a loopback address, {}, but the ranks run on {} hosts: no other host can "
                       "reach it. Fix: set parallel.interface (or GLOO_SOCKET_IFNAME) to the interface the hosts "
                       "reach each other on (e.g. eth0, ib0)",
                       r, host(r), distinct.size());
  }
  std::map<std::string, std::vector<int>> ranks_of;
  for (int r = 0; r < static_cast<int>(addresses.size()); ++r) ranks_of[addresses[r]].push_back(r);
  std::vector<std::string> real;
  for (const auto& [a, ranks] : ranks_of) {
    real.push_back(fmt::format("{}: ranks {}", host(ranks.front()), fmt::join(ranks, ",")));
  }
  for (int r = 0; r < static_cast<int>(addresses.size()); ++r) {
    for (int s = r + 1; s < static_cast<int>(addresses.size()); ++s) {
      const bool same_host = addresses[r] == addresses[s], same_node = layout.node_of(r) == layout.node_of(s);
      if (same_host == same_node) continue;
      return fmt::format(
          "the layout's nodes ({} ranks each, parallel.ranks_per_node or the launcher's local world size) are not "
          "the hosts the ranks run on: ranks {} and {} are {} but on {}. The hosts: {}. Fix: set "
          "parallel.ranks_per_node to the ranks each host runs and start them host by host (ranks 0..n-1 on the "
          "first host, as torchrun and srun's block distribution do)",
          layout.ranks_per_node(), r, s, same_node ? fmt::format("on node {}", layout.node_of(r)) : "on different nodes",
          same_host ? fmt::format("the same host {}", host(r)) : fmt::format("{} and {}", host(r), host(s)),
          fmt::join(real, "; "));
    }
  }
  return "";
}

std::unique_ptr<Distributed> init_distributed(const ParallelDims& dims, int ranks_per_node, const LaunchEnv& env,
                                              std::chrono::milliseconds timeout,
                                              c10::intrusive_ptr<c10d::Store> store, Placement placement) {
  dims.validate(env.world_size);
  auto d = std::unique_ptr<Distributed>(new Distributed{env, RankLayout(dims, ranks_per_node), {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}});
  d->placement = std::move(placement);
  c10d::TCPStoreOptions opts;
  use_classic_tcpstore(opts);  // compat/torch_compat.h: LibTorch 2.x's libuv default
  opts.port = static_cast<uint16_t>(env.master_port);
  opts.isServer = env.rank == 0;
  opts.numWorkers = env.world_size;
  opts.waitWorkers = true;
  opts.timeout = timeout;
  d->store = store;
  const std::string address = env.world_size > 1 ? listen_address(env) : "127.0.0.1";
  d->hosts.assign(env.world_size, this_hostname());
  d->addresses.assign(env.world_size, address);
  HostOf hosts{d->hosts, d->addresses};
  if (!d->store && env.world_size > 1) {
    auto rendezvous = tcp_rendezvous(env, address, opts, timeout);
    d->store = rendezvous.first;
    hosts = rendezvous.second;
  } else if (d->store) {
    hosts = publish_hosts(*d->store, env, address);
  }
  d->hosts = hosts.hostnames;
  d->addresses = hosts.addresses;
  if (const std::string why = node_mismatch(d->layout, d->addresses, d->hosts); !why.empty()) {
    throw std::runtime_error(fmt::format("rank {}: {}", env.rank, why));
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
  std::string out = fmt::format("  {:>5} {:>4} {:>4} {:>4} {:>5}  host (address)\n", "rank", "tp", "dp", "pp", "node");
  for (int r = 0; r < d.layout.world(); ++r) {
    const RankCoord c = d.layout.coord(r);
    out += fmt::format("  {:>5} {:>4} {:>4} {:>4} {:>5}  {} ({})\n", r, c.tp, c.dp, c.pp, d.layout.node_of(r),
                       d.hosts[r], d.addresses[r]);
  }
  return out;
}

std::string shared_hostnames(const Distributed& d) {
  std::map<std::string, std::set<std::string>> addresses_of;
  for (size_t r = 0; r < d.hosts.size(); ++r) addresses_of[d.hosts[r]].insert(d.addresses[r]);
  std::vector<std::string> shared;
  for (const auto& [h, a] : addresses_of) {
    if (a.size() > 1) shared.push_back(fmt::format("{} ({})", h, fmt::join(a, ", ")));
  }
  return fmt::format("{}", fmt::join(shared, "; "));
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

// Starts the `nproc` ranks (this binary, `argv`) with their launch environment; pid -> rank.
std::map<pid_t, int> spawn_ranks(int nproc, const std::vector<std::string>& argv, const std::string& master_addr,
                                 int port, const LaunchNodes& nodes) {
  std::map<pid_t, int> rank_of;
  for (int local = 0; local < nproc; ++local) {
    const int r = nodes.node_rank * nproc + local;
    std::vector<std::string> env_s = rank_environment(
        {{"OPTCC_RANK", std::to_string(r)}, {"OPTCC_WORLD_SIZE", std::to_string(nodes.nnodes * nproc)},
         {"OPTCC_LOCAL_RANK", std::to_string(local)}, {"OPTCC_LOCAL_WORLD_SIZE", std::to_string(nproc)},
         {"MASTER_ADDR", master_addr}, {"MASTER_PORT", std::to_string(port)},
         {"OPTCC_LAUNCHER_PID", std::to_string(getpid())}});  // die_with_launcher (stop_signal.h)
    std::vector<std::string> args = argv;  // argv[0] kept as typed (shown in logs and results)
    std::vector<char*> cargv, cenv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env_s) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    pid_t pid = 0;
    // Default spawn attributes: the rank inherits this launcher's mask, SIGTERM/SIGUSR1 blocked through
    // its exec, and takes them in its own signal thread (stop_signal.h).
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargv.data(), cenv.data()) != 0) {
      for (auto& [p, _] : rank_of) kill(p, SIGKILL);
      throw std::runtime_error(fmt::format("launch: cannot start rank {}", r));
    }
    rank_of[pid] = r;
  }
  return rank_of;
}

}  // namespace

int launch_local(int nproc, const std::vector<std::string>& argv, std::chrono::milliseconds grace,
                 const LaunchNodes& nodes) {
  const bool one_host = nodes.nnodes <= 1;
  const int port = one_host ? free_local_port() : nodes.master_port;
  const std::string master = one_host ? "127.0.0.1" : nodes.master_addr;
  record_stop_signals();  // forwarded to the ranks below, instead of ending the launcher (stop_signal.h)
  std::map<pid_t, int> rank_of = spawn_ranks(nproc, argv, master, port, nodes);
  const char* exported = std::getenv("MASTER_PORT");
  if (one_host) {
    spdlog::info("launched {} local ranks (rendezvous 127.0.0.1:{}, a free port this launcher picked{})", nproc, port,
                 exported ? fmt::format("; the exported MASTER_PORT={} is not used", exported) : "");
  } else {
    spdlog::info("launched ranks {}..{} of {} on this host, node {} of {} (rendezvous {}:{})",
                 nodes.node_rank * nproc, nodes.node_rank * nproc + nproc - 1, nodes.nnodes * nproc, nodes.node_rank,
                 nodes.nnodes, master, port);
  }
  int result = 0;
  bool terminating = false, stopped = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (!rank_of.empty()) {
    if (const int sig = take_stop_signal(); sig != 0) {
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

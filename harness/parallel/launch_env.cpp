#include "harness/parallel/launch_env.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <stdexcept>

namespace optcc {
namespace {

// Every variable any launcher may set; those present are listed in error messages.
const char* const kLauncherVars[] = {
    "OPTCC_RANK", "OPTCC_WORLD_SIZE", "OPTCC_LOCAL_RANK", "OPTCC_LOCAL_WORLD_SIZE", "OPTCC_JOB_ID",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_NODEID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_JOB_ID",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char ch : s) {
    if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
  }
  return true;
}

std::string short_host(const std::string& h) { return h.substr(0, h.find('.')); }

// Reads variables for one launcher and reports errors with everything that was found.
class Reader {
 public:
  Reader(const EnvLookup& env, std::string source) : env_(env), source_(std::move(source)) {}

  std::optional<std::string> get(const std::string& name) const { return env_(name); }
  bool has(const std::string& name) const { return env_(name).has_value(); }

  std::optional<int> opt_int(const std::string& name) const {
    const auto v = get(name);
    if (!v) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const long x = std::strtol(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || errno != 0 || x < INT32_MIN || x > INT32_MAX) {
      fail(fmt::format("{}='{}' is not an integer", name, *v));
    }
    return static_cast<int>(x);
  }
  int req_int(const std::string& name) const {
    const auto v = opt_int(name);
    if (!v) fail(fmt::format("{} is not set", name));
    return *v;
  }
  std::string req_str(const std::string& name, const std::string& why) const {
    const auto v = get(name);
    if (!v || v->empty()) fail(fmt::format("{} is not set; {}", name, why));
    return *v;
  }

  [[noreturn]] void fail(const std::string& rule) const {
    std::string msg = fmt::format("launch environment ({}): {}\nlauncher variables found:", source_, rule);
    for (const char* name : kLauncherVars) {
      if (const auto v = get(name)) msg += fmt::format("\n  {}={}", name, *v);
    }
    throw std::runtime_error(msg);
  }

 private:
  const EnvLookup& env_;
  std::string source_;
};

// Rules every launcher must satisfy.
void check_common(const LaunchEnv& e, const Reader& r) {
  if (e.world_size < 1) r.fail(fmt::format("world size {} must be >= 1", e.world_size));
  if (e.rank < 0 || e.rank >= e.world_size) {
    r.fail(fmt::format("rank {} must be in [0, world size {})", e.rank, e.world_size));
  }
  if (e.local_world_size < 1) r.fail(fmt::format("tasks per node {} must be >= 1", e.local_world_size));
  if (e.local_rank < 0 || e.local_rank >= e.local_world_size) {
    r.fail(fmt::format("local rank {} must be in [0, tasks per node {})", e.local_rank, e.local_world_size));
  }
  if (e.num_nodes < 1 || e.node_rank < 0 || e.node_rank >= e.num_nodes) {
    r.fail(fmt::format("node rank {} must be in [0, number of nodes {})", e.node_rank, e.num_nodes));
  }
  if (e.master_port < 1 || e.master_port > 65535) {
    r.fail(fmt::format("master port {} must be in [1, 65535]", e.master_port));
  }
}

LaunchEnv from_local(const Reader& r) {
  LaunchEnv e;
  e.source = "local";
  e.rank = r.req_int("OPTCC_RANK");
  e.world_size = r.req_int("OPTCC_WORLD_SIZE");
  e.local_world_size = r.opt_int("OPTCC_LOCAL_WORLD_SIZE").value_or(e.world_size);
  if (e.local_world_size < 1) r.fail("OPTCC_LOCAL_WORLD_SIZE must be >= 1");
  e.local_rank = r.opt_int("OPTCC_LOCAL_RANK").value_or(e.rank % e.local_world_size);
  e.node_rank = e.rank / e.local_world_size;
  e.num_nodes = (e.world_size + e.local_world_size - 1) / e.local_world_size;
  e.master_addr = r.get("MASTER_ADDR").value_or("127.0.0.1");
  e.master_port = r.opt_int("MASTER_PORT").value_or(LaunchEnv::kDefaultMasterPort);
  e.job_id = r.get("OPTCC_JOB_ID").value_or("");
  check_common(e, r);
  return e;
}

LaunchEnv from_torchrun(const Reader& r) {
  LaunchEnv e;
  e.source = "torchrun";
  e.rank = r.req_int("RANK");
  e.world_size = r.req_int("WORLD_SIZE");
  e.master_addr = r.req_str("MASTER_ADDR", "torchrun sets it; for a hand-made env:// launch export rank 0's host");
  e.master_port = r.req_int("MASTER_PORT");
  e.local_world_size = r.opt_int("LOCAL_WORLD_SIZE").value_or(e.world_size);
  if (e.local_world_size < 1) r.fail("LOCAL_WORLD_SIZE must be >= 1");
  e.local_rank = r.opt_int("LOCAL_RANK").value_or(e.rank % e.local_world_size);
  const auto group_rank = r.opt_int("GROUP_RANK");
  e.node_rank = group_rank.value_or(e.rank / e.local_world_size);
  e.num_nodes = r.opt_int("GROUP_WORLD_SIZE").value_or((e.world_size + e.local_world_size - 1) / e.local_world_size);
  e.job_id = r.get("TORCHELASTIC_RUN_ID").value_or("");
  check_common(e, r);
  // torchrun hands each node a contiguous block of global ranks; with equal nodes, check it.
  const int lws = e.local_world_size;
  if (group_rank && e.world_size == e.num_nodes * lws && e.rank != e.node_rank * lws + e.local_rank) {
    r.fail(fmt::format("RANK {} is not GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK = {} * {} + {} = {}", e.rank,
                       e.node_rank, lws, e.local_rank, e.node_rank * lws + e.local_rank));
  }
  return e;
}

// Tasks on each node, from SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE, or NTASKS / nodes.
std::vector<int> slurm_tasks_per_node(const Reader& r, int num_nodes, int ntasks) {
  if (const auto n = r.opt_int("SLURM_NTASKS_PER_NODE")) return std::vector<int>(num_nodes, *n);
  if (const auto spec = r.get("SLURM_TASKS_PER_NODE")) {
    std::vector<int> counts;
    try {
      counts = expand_slurm_tasks_per_node(*spec);
    } catch (const std::runtime_error& ex) {
      r.fail(ex.what());
    }
    if (static_cast<int>(counts.size()) != num_nodes) {
      r.fail(fmt::format("SLURM_TASKS_PER_NODE='{}' describes {} node(s) but the job has {}", *spec, counts.size(),
                         num_nodes));
    }
    return counts;
  }
  if (ntasks % num_nodes != 0) {
    r.fail(fmt::format("cannot tell tasks per node: SLURM_NTASKS {} is not a multiple of {} nodes and neither "
                       "SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set; pass --ntasks-per-node",
                       ntasks, num_nodes));
  }
  return std::vector<int>(num_nodes, ntasks / num_nodes);
}

constexpr const char* kRankZeroFix =
    "start one task per GPU with srun over the whole allocation (no --relative, no --nodelist "
    "subset, default block distribution) so that task 0 lands on the first node";

LaunchEnv from_slurm(const Reader& r, const std::string& hostname) {
  LaunchEnv e;
  e.source = "slurm";
  e.rank = r.req_int("SLURM_PROCID");
  e.world_size = r.req_int("SLURM_NTASKS");
  e.local_rank = r.req_int("SLURM_LOCALID");
  e.node_rank = r.req_int("SLURM_NODEID");
  const std::string nodelist = r.req_str("SLURM_JOB_NODELIST", "run inside an allocation (sbatch/salloc + srun)");
  try {
    e.hosts = expand_slurm_nodelist(nodelist);
  } catch (const std::runtime_error& ex) {
    r.fail(ex.what());
  }
  const auto nodes_var = r.opt_int("SLURM_JOB_NUM_NODES");
  e.num_nodes = nodes_var ? *nodes_var : r.opt_int("SLURM_NNODES").value_or(static_cast<int>(e.hosts.size()));
  if (static_cast<int>(e.hosts.size()) != e.num_nodes) {
    r.fail(fmt::format("SLURM_JOB_NODELIST '{}' expands to {} host(s) but the number of nodes is {}", nodelist,
                       e.hosts.size(), e.num_nodes));
  }
  if (e.num_nodes < 1) r.fail(fmt::format("number of nodes {} must be >= 1", e.num_nodes));
  if (e.node_rank < 0 || e.node_rank >= e.num_nodes) {
    r.fail(fmt::format("SLURM_NODEID {} must be in [0, number of nodes {})", e.node_rank, e.num_nodes));
  }
  const std::vector<int> counts = slurm_tasks_per_node(r, e.num_nodes, e.world_size);
  const int total = std::accumulate(counts.begin(), counts.end(), 0);
  const bool uniform = std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts[0]; });
  if (total != e.world_size) {
    const char* fix = "; make sbatch/srun -N, --ntasks and --ntasks-per-node agree";
    r.fail(uniform ? fmt::format("SLURM_NTASKS {} != nodes x tasks-per-node = {} x {} = {}{}", e.world_size,
                                 e.num_nodes, counts[0], total, fix)
                   : fmt::format("SLURM_NTASKS {} != sum of tasks per node {}{}", e.world_size, total, fix));
  }
  e.local_world_size = counts[e.node_rank];
  e.master_addr = e.hosts[0];
  e.job_id = r.get("SLURM_JOB_ID").value_or("");
  if (const auto port = r.opt_int("MASTER_PORT")) {
    e.master_port = *port;
  } else {
    e.master_port = port_from_job_id(r.req_str("SLURM_JOB_ID", "it seeds the rendezvous port; or export MASTER_PORT"));
  }
  check_common(e, r);
  // BR-20: the TCPStore server lives on rank 0, and every rank dials hosts[0].
  if (e.rank == 0 && e.node_rank != 0) {
    r.fail(fmt::format("rank 0 runs on node {} but the rendezvous host is node 0 ({}); {}", e.node_rank, e.hosts[0],
                       kRankZeroFix));
  }
  if (e.rank == 0 && !hostname.empty() && short_host(hostname) != short_host(e.hosts[0])) {
    r.fail(fmt::format("rank 0 runs on host '{}' but the rendezvous host (first of SLURM_JOB_NODELIST) is '{}'; {}",
                       hostname, e.hosts[0], kRankZeroFix));
  }
  return e;
}

// Splits at commas outside brackets.
std::vector<std::string> split_top_level(const std::string& s) {
  std::vector<std::string> parts(1);
  int depth = 0;
  for (char ch : s) {
    if (ch == '[') ++depth;
    if (ch == ']' && --depth < 0) throw std::runtime_error(fmt::format("node list '{}': unmatched ']'", s));
    if (ch == ',' && depth == 0) {
      parts.emplace_back();
    } else if (!std::isspace(static_cast<unsigned char>(ch))) {
      parts.back() += ch;
    }
  }
  if (depth != 0) throw std::runtime_error(fmt::format("node list '{}': unmatched '['", s));
  return parts;
}

// Expands one name that may hold several bracket groups.
std::vector<std::string> expand_name(const std::string& name, const std::string& whole) {
  const size_t open = name.find('[');
  if (open == std::string::npos) return {name};
  const size_t close = name.find(']', open);
  const std::string prefix = name.substr(0, open);
  const std::vector<std::string> tails = expand_name(name.substr(close + 1), whole);
  std::vector<std::string> out;
  for (const std::string& item : split_top_level(name.substr(open + 1, close - open - 1))) {
    const size_t dash = item.find('-');
    const std::string lo = item.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi) || lo.size() > 9 || hi.size() > 9 || std::stol(hi) < std::stol(lo)) {
      throw std::runtime_error(fmt::format("node list '{}': bad range '{}' in '{}'", whole, item, name));
    }
    for (long v = std::stol(lo); v <= std::stol(hi); ++v) {
      const std::string num = fmt::format("{:0{}}", v, lo.size());  // width of the lower bound
      for (const std::string& tail : tails) out.push_back(prefix + num + tail);
    }
  }
  return out;
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::string this_hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

void use_interface(LaunchEnv& e, const std::string& config_value) {
  if (config_value.empty()) return;
  e.interface = config_value;
  e.interface_source = "parallel.interface";
}

LaunchEnv detect_launch_env(const EnvLookup& env, const std::string& hostname) {
  LaunchEnv e;
  if (env("OPTCC_RANK") || env("OPTCC_WORLD_SIZE")) e = from_local(Reader(env, "local"));
  else if (env("RANK") || env("WORLD_SIZE")) e = from_torchrun(Reader(env, "torchrun"));
  else if (env("SLURM_PROCID")) e = from_slurm(Reader(env, "slurm"), hostname);
  if (const auto ifname = env("GLOO_SOCKET_IFNAME"); ifname && !ifname->empty()) {
    e.interface = ifname->substr(0, ifname->find(','));  // PyTorch takes a list: the first one here
    e.interface_source = "GLOO_SOCKET_IFNAME";
  }
  return e;
}

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist) {
  std::vector<std::string> hosts;
  for (const std::string& part : split_top_level(nodelist)) {
    if (part.empty()) continue;
    for (std::string& h : expand_name(part, nodelist)) hosts.push_back(std::move(h));
  }
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& spec) {
  std::vector<int> counts;
  for (const std::string& item : split_top_level(spec)) {
    const size_t paren = item.find('(');
    const std::string n = item.substr(0, paren);
    std::string times = "1";
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') times = "";
      else times = item.substr(paren + 2, item.size() - paren - 3);
    }
    if (!all_digits(n) || !all_digits(times) || n.size() > 6 || times.size() > 6) {
      throw std::runtime_error(
          fmt::format("SLURM_TASKS_PER_NODE '{}': bad item '{}' (expected N or N(xM))", spec, item));
    }
    counts.insert(counts.end(), std::stoi(times), std::stoi(n));
  }
  return counts;
}

int port_from_job_id(const std::string& job_id) {
  constexpr int kBase = 20000, kSpan = 40000;
  if (job_id.empty()) throw std::runtime_error("port_from_job_id: empty job id");
  uint64_t h = 0;
  if (all_digits(job_id)) {
    for (char ch : job_id) h = (h * 10 + static_cast<uint64_t>(ch - '0')) % kSpan;  // = id % kSpan
  } else {
    h = 1469598103934665603ull;  // FNV-1a 64
    for (char ch : job_id) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  }
  return kBase + static_cast<int>(h % kSpan);
}

}  // namespace optcc

// `optcc calibrate` (calibrate.h): timings on this machine, written as a hardware profile.
#include "harness/perfmodel/calibrate.h"

#include <pthread.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <cstdio>

#include "compression/act_codec.h"
#include "harness/parallel/stop_signal.h"
#include "harness/parallel/communicator.h"
#include "harness/parallel/distributed.h"
#include "harness/parallel/threads.h"
#include "harness/perfmodel/regime.h"
#include "harness/perfmodel/traffic_estimate.h"
#include "harness/train/optimizer.h"
#include "harness/train/trainer.h"
#include "models/flops.h"
#include "models/gpt.h"

namespace optcc {
namespace {

using Clock = std::chrono::steady_clock;

// The median of `reps` timings of body() after one warm-up call: the wall time of each call, or
// what body() returns when it returns the seconds of its own timed part.
template <class F>
double median_seconds(int64_t reps, F&& body) {
  body();  // warm-up
  std::vector<double> t;
  for (int64_t i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    if constexpr (std::is_same_v<decltype(body()), double>) {
      t.push_back(body());
    } else {
      body();
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// What one process measures, in SI units.
struct Rates {
  double forward = 0, backward = 0, memory = 0, optimizer = 0, lowrank = 0, powersgd = 0;
  double allreduce_small = 0, allreduce_large = 0;  // seconds: 2-process all-reduce of S and 16 S bytes
  static constexpr int kFields = 8;
  std::array<double, kFields> as_array() const {
    return {forward, backward, memory, optimizer, lowrank, powersgd, allreduce_small, allreduce_large};
  }
  static Rates from(const std::array<double, kFields>& a) { return {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]}; }
};

constexpr int64_t kLargeFactor = 16;  // the transport's second message size, in TP messages

// The real transport (Gloo over loopback between processes of this machine): S = one TP message of
// the config ([s, b, h] fp32) and 16 S, all-reduced by this process and its partner (process i ^ 1), each
// after a GEMM of one layer half as in a run (so the other processes compute meanwhile), timed
// from the later of the two posts to the end; median of max(4 reps, 20). A process without a partner times 0.
// `pair_store(pair)` gives the store the two processes of pair `pair` = index / 2 meet in.
std::pair<double, double> time_transport(const Config& cfg, int64_t reps, int64_t index, int64_t n,
                                         const std::function<c10::intrusive_ptr<c10d::Store>(int64_t)>& pair_store) {
  const int64_t partner = index ^ 1;
  if (partner >= n) return {0.0, 0.0};
  auto store = pair_store(index / 2);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.parallel.timeout_seconds * 1000));
  auto pg = make_gloo_group(store, "transport", static_cast<int>(index & 1), 2, timeout);
  const int64_t rows = cfg.model.seq_len * cfg.train.micro_batch_size, h = cfg.model.hidden_size;
  auto a = torch::randn({rows, h});
  auto w = torch::randn({h, 4 * h / cfg.parallel.tp});
  // fp64 elements of the same bytes, element 0 carrying this process's post time (steady_clock is
  // one clock for the machine): the sum minus its own gives the partner's, and the time counts
  // from the later post, as the simulator's transport term does (waiting for a late partner is
  // the replay's business, not the transport's).
  auto timed = [&](int64_t fp32_elements) {
    std::vector<torch::Tensor> t{torch::zeros({fp32_elements / 2}, torch::kFloat64)};
    return median_seconds(std::max<int64_t>(reps * 4, 20), [&] {
      auto y = torch::mm(a, w);  // the compute between two TP all-reduces
      t[0].zero_();
      const double post = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
      t[0][0] = post;
      pg->allreduce(t)->wait();
      const double end = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
      const double partner_post = t[0][0].item<double>() - post;
      return end - std::max(post, partner_post);
    });
  };
  return {timed(rows * h), timed(kLargeFactor * rows * h)};
}

// Forward and backward of the whole model on one micro-batch, and one AdamW step.
void time_model(const Config& cfg, int64_t reps, Rates& r) {
  const GptOptions o = gpt_options(cfg);
  GptModel model(o);
  model->train();
  auto optimizer = make_adamw(*model, cfg.train);
  const int64_t b = cfg.train.micro_batch_size;
  auto batch = torch::randint(0, o.vocab_size, {b, o.seq_len + 1}, torch::kLong);
  const double fwd_flops = double(o.num_layers) * layer_forward_flops(o.hidden_size, o.seq_len, b) +
                           logits_forward_flops(o.hidden_size, o.seq_len, b, o.vocab_size);
  torch::Tensor loss;
  const double fwd = median_seconds(reps, [&] { loss = model->loss(batch); });
  const double fwd_bwd = median_seconds(reps, [&] {
    optimizer->zero_grad();
    model->loss(batch).backward();
  });
  const double bwd = fwd_bwd - fwd;
  r.forward = fwd_flops / fwd;
  r.backward = backward_flops(fwd_flops) / std::max(bwd, 1e-9);
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  r.optimizer = median_seconds(reps, [&] { optimizer->step(); }) / double(params);
}

// A 64 MiB fp32 copy: read + write bytes per second.
double time_memory(int64_t reps) {
  auto a = torch::rand({16 << 20});
  auto c = torch::empty_like(a);
  return 2.0 * 4.0 * double(a.numel()) / median_seconds(reps, [&] { c.copy_(a); });
}

// The cb scheme's codec on one message slice; FLOPs as the traffic model counts them.
double time_lowrank(const Config& cfg, int64_t reps) {
  Config v = detached_copy(cfg);
  apply_compression_scheme(v.compression, "cb");
  v.parallel.pp = std::max<int64_t>(2, v.parallel.pp);  // a backward message exists
  if (v.model.num_layers < v.parallel.pp) v.model.num_layers = v.parallel.pp;
  const TrafficEstimate e = estimate_traffic(v);
  const auto& g = e.stages.back();
  double flops = 0;
  for (const auto& s : g.cb_encode) flops += s.flops;
  for (const auto& s : g.cb_decode) flops += s.flops;
  auto codec = make_act_codec("lowrank", pipeline_codec_options(v, v.compression.pipeline_backward));
  auto x = torch::randn({e.slice_elements});
  return flops / median_seconds(reps, [&] {
    auto p = codec->encode(x);
    auto err = codec->last_error();
    auto y = codec->decode(p, e.slice_elements);
  });
}

// PowerSGD rank 128's three GEMMs on fc1 [4h/t, h].
double time_powersgd(const Config& cfg, int64_t reps) {
  const int64_t rows = 4 * cfg.model.hidden_size / cfg.parallel.tp, cols = cfg.model.hidden_size;
  const int64_t r = std::min<int64_t>({128, rows, cols});
  auto m = torch::randn({rows, cols});
  auto q = torch::randn({cols, r});
  return 6.0 * double(rows) * double(cols) * double(r) / median_seconds(reps, [&] {
    auto p = torch::mm(m, q);
    auto q2 = torch::mm(m.t(), p);
    auto out = torch::mm(p, q2.t());
  });
}

Rates measure(const Config& cfg, int64_t reps, int64_t index, int64_t local_ranks,
              const std::function<c10::intrusive_ptr<c10d::Store>(int64_t)>& pair_store) {
  set_cpu_threads(threads_for(cfg, local_ranks));
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  Rates r;
  time_model(cfg, reps, r);
  r.memory = time_memory(reps);
  r.lowrank = time_lowrank(cfg, reps);
  r.powersgd = time_powersgd(cfg, reps);
  std::tie(r.allreduce_small, r.allreduce_large) = time_transport(cfg, reps, index, local_ranks, pair_store);
  return r;
}

// The median of each field over the processes (the transport's: over those with a partner).
Rates median_rates(const std::vector<std::array<double, Rates::kFields>>& all) {
  std::array<double, Rates::kFields> med{};
  for (int f = 0; f < Rates::kFields; ++f) {
    std::vector<double> v;
    for (const auto& a : all) {
      if (a[f] > 0 || f < 6) v.push_back(a[f]);  // transport: processes with a partner
    }
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    med[f] = v[v.size() / 2];
  }
  return Rates::from(med);
}

// `n` processes measure at once (forked before this process touches LibTorch's thread pools);
// the median of each field over them.
Rates measure_concurrently(const Config& cfg, int64_t reps, int64_t n) {
  const std::string store_path = fmt::format("/tmp/optcc-calibrate-{}-{}", getuid(), getpid());
  std::vector<std::pair<pid_t, int>> children;
  for (int64_t i = 0; i < n; ++i) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("calibrate: pipe() failed");
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("calibrate: fork() failed");
    if (pid == 0) {
      // No signal thread was forked with us: SIGTERM/SIGUSR1 back to their default here (stop_signal.h).
      const sigset_t stop = stop_signal_set();
      pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
      close(fds[0]);
      int code = 0;
      try {
        const auto a = measure(cfg, reps, i, n, [&](int64_t pair) -> c10::intrusive_ptr<c10d::Store> {
                         return c10::make_intrusive<c10d::FileStore>(fmt::format("{}-pair{}", store_path, pair), 2);
                       }).as_array();
        code = write(fds[1], a.data(), sizeof(a)) == static_cast<ssize_t>(sizeof(a)) ? 0 : 3;
      } catch (const std::exception& e) {
        std::cerr << "calibrate (child): " << e.what() << "\n";
        code = 2;
      }
      _exit(code);
    }
    close(fds[1]);
    children.push_back({pid, fds[0]});
  }
  std::vector<std::array<double, Rates::kFields>> all;
  for (auto [pid, fd] : children) {
    std::array<double, Rates::kFields> a{};
    const bool ok = read(fd, a.data(), sizeof(a)) == static_cast<ssize_t>(sizeof(a));
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("calibrate: a measuring process failed");
    all.push_back(a);
  }
  for (int64_t pair = 0; pair < n / 2; ++pair) std::remove(fmt::format("{}-pair{}", store_path, pair).c_str());
  return median_rates(all);
}

std::string profile_yaml(const Config& cfg, const Rates& r, int64_t n, int64_t reps, double load,
                         const std::string& name) {
  const auto& net = cfg.network;
  const int64_t world = cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp;
  const int64_t rpn = cfg.parallel.ranks_per_node > 0 ? cfg.parallel.ranks_per_node : world;
  // The transport fit: a 2-rank all-reduce takes 2 steps and sends S bytes per rank, so
  // t(S) = 2 L + S / bw; from t(S) and t(16 S): S / bw = (t(16 S) - t(S)) / 15. When the larger
  // message was not slower (latency-bound: scheduling of processes sharing cores dominates),
  // bandwidth is left out (gbps 0) and L = the mean of both / 2.
  const double s_bytes = 4.0 * double(cfg.model.seq_len * cfg.train.micro_batch_size * cfg.model.hidden_size);
  const bool size_matters = r.allreduce_large > r.allreduce_small;
  const double transfer = size_matters ? (r.allreduce_large - r.allreduce_small) / double(kLargeFactor - 1) : 0.0;
  const double transport_gbps = size_matters ? s_bytes / transfer / 1e9 : 0.0;
  const double step_latency_us =
      (size_matters ? std::max(0.0, (r.allreduce_small - transfer) / 2.0)
                    : (r.allreduce_small + r.allreduce_large) / 4.0) * 1e6;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M", std::localtime(&now));
  const std::string src = fmt::format("measured by `optcc calibrate --config {}` ({} processes at once, median of {}; "
                                      "load {:.1f} at the start; {})",
                                      cfg.source_path, n, reps, load, date);
  return fmt::format(
      "# This machine, for the simulator (harness/perfmodel/hardware_profile.h), written by `optcc calibrate`\n"
      "# (harness/perfmodel/calibrate.h says what each number measures). Every measured number: {}\n"
      "name: {}\n"
      "description: \"this machine ({} processes at once), links of {} (network section)\"\n"
      "device:\n"
      "  forward_gflops: {:.4g}     # measured: model forward FLOPs (models/flops.h) / seconds, model {} b={}\n"
      "  backward_gflops: {:.4g}    # measured: 2 x forward FLOPs / backward seconds\n"
      "  memory_gbps: {:.4g}        # measured: 64 MiB fp32 copy, (read + write) bytes / seconds\n"
      "  optimizer_ns_per_parameter: {:.4g}  # measured: one AdamW step / parameters\n"
      "network:                     # the config's network section (what its emulated run declares)\n"
      "  intra_node_gbps: {}\n  inter_node_gbps: {}\n  intra_node_latency_us: {}\n  inter_node_latency_us: {}\n"
      "  scale: {}\n"
      "  devices_per_node: {}        # parallel.ranks_per_node\n"
      "  nics_per_node: 1            # the emulator's model: one NIC per node\n"
      "transport:                   # measured: Gloo all-reduce of 2 processes at once in pairs, each after a GEMM,\n"
      "                             # of {:.0f} and {:.0f} bytes (one TP message and 16x): {:.3f} and {:.3f} ms\n"
      "  step_latency_us: {:.4g}      # fit: t(S) = 2 x latency + S / bandwidth\n"
      "  gbps: {:.4g}                 # (0 = latency-bound: the larger message was not slower)\n"
      "compression:\n"
      "  lowrank: {{gflops: {:.4g}}}    # measured: cb codec (rank 16) encode + error + decode of one slice\n"
      "  powersgd: {{gflops: {:.4g}}}   # measured: rank-128 GEMMs P = MQ, Q = MᵀP, PQᵀ on fc1 [4h/t, h]\n",
      src, name, n, cfg.source_path, r.forward / 1e9, cfg.model.preset, cfg.train.micro_batch_size, r.backward / 1e9,
      r.memory / 1e9, r.optimizer * 1e9, net.intra_node_gbps, net.inter_node_gbps, net.intra_node_latency_us,
      net.inter_node_latency_us, net.scale, rpn, s_bytes, double(kLargeFactor) * s_bytes, r.allreduce_small * 1e3,
      r.allreduce_large * 1e3, step_latency_us, transport_gbps, r.lowrank / 1e9, r.powersgd / 1e9);
}

double load_average() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}

}  // namespace

std::string measure_machine_in_run(const Config& cfg, Distributed& d, int64_t reps) {
  const int world = d.env.world_size, rank = d.rank();
  const std::string host = d.addresses.empty() ? std::string("local") : d.addresses.at(rank);
  const double load = load_average();
  Rates mine;
  if (world == 1) {
    mine = measure(cfg, reps, 0, 1, nullptr);
  } else {
    // Pairs of ranks of one host (local ranks 2k, 2k+1) meet under a key of their own in the run's store.
    mine = measure(cfg, reps, d.env.local_rank, d.env.local_world_size, [&](int64_t pair) {
      return c10::make_intrusive<c10d::PrefixStore>(fmt::format("optcc/regime/{}/pair{}", host, pair), d.store);
    });
  }
  auto rows = torch::zeros({world, Rates::kFields}, torch::kFloat64);
  const auto a = mine.as_array();
  for (int f = 0; f < Rates::kFields; ++f) rows[rank][f] = a[f];
  if (d.world) d.world->all_reduce(rows, Traffic::kControl);  // each rank fills its own row: the sum gathers
  std::vector<std::array<double, Rates::kFields>> all(world);
  auto acc = rows.accessor<double, 2>();
  for (int r = 0; r < world; ++r) {
    for (int f = 0; f < Rates::kFields; ++f) all[r][f] = acc[r][f];
  }
  return profile_yaml(cfg, median_rates(all), world, reps, load, "run-start");
}

int run_calibrate_command(const Config& cfg, const CalibrateOptions& o) {
  cfg.validate(cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp);
  if (!(cfg.network.intra_node_gbps > 0 && cfg.network.inter_node_gbps > 0)) {
    throw ConfigError(fmt::format("config error: network.intra_node_gbps = {}, inter_node_gbps = {}: calibrate "
                                  "writes the config's links into the profile and needs both > 0. Fix: use the "
                                  "emulation experiment's config, or --set network.profile=paper-a100-ib200.",
                                  cfg.network.intra_node_gbps, cfg.network.inter_node_gbps));
  }
  if (o.reps < 1) throw ConfigError(fmt::format("--reps {}: must be >= 1", o.reps));
  const int64_t world = cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp;
  const int64_t n = o.concurrent > 0 ? o.concurrent : world;
  const double load = load_average();
  std::cerr << fmt::format("calibrate: {} processes, {} repetitions each (load {:.1f})\n", n, o.reps, load);
  const Rates r = measure_concurrently(cfg, o.reps, n);
  const std::string name = std::filesystem::path(o.output).stem().string();
  std::string yaml = profile_yaml(cfg, r, n, o.reps, load, name);
  if (!cfg.network.match_regime.empty()) {  // the links a run of this config would derive (regime.h)
    const HardwareProfile machine = parse_hardware_profile(yaml, o.output);
    const RegimeMatch m = rounded(match_regime(cfg, machine, cfg.network.match_regime, cfg.network.profile));
    Config derived = detached_copy(cfg);
    apply_regime(derived.network, m);
    yaml = profile_yaml(derived, r, n, o.reps, load, name) +
           "# network: derived from these rates as network.match_regime does at a run's start: " +
           regime_summary(m, machine) + "\n";
  }
  std::ofstream out(o.output);
  if (!out) throw std::runtime_error(fmt::format("calibrate: cannot write {}", o.output));
  out << yaml;
  std::cout << yaml << fmt::format("# written to {}\n", o.output);
  return 0;
}

}  // namespace optcc

#include "harness/tools/comm_check.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "harness/parallel/distributed.h"
#include "harness/train/network_setup.h"

namespace optcc {
namespace {

// Sum over a group of (global rank + 1) = sum of its members + size: checkable on every member.
void check_group(Communicator* comm, const char* kind, int rank) {
  if (!comm) return;
  auto t = torch::full({1024}, static_cast<float>(rank + 1));
  comm->all_reduce(t, Traffic::kControl);
  double expect = 0;
  for (int r : comm->global_ranks()) expect += r + 1;
  if (t[0].item<double>() != expect || t[1023].item<double>() != expect) {
    throw CommError(fmt::format("rank {}: {} group {} all-reduce gave {} instead of {}", rank, kind, comm->name(),
                                t[0].item<double>(), expect));
  }
}

// --time-allreduce (comm_check.h): each size's calls, timed from a world barrier, the slowest rank's.
std::vector<AllReduceTiming> time_allreduce(Distributed& d, const CommCheckOptions& o) {
  std::vector<AllReduceTiming> out;
  if (d.env.world_size < 2 || !d.world) {
    throw ConfigError("--time-allreduce: a world of one rank has no all-reduce to time. Fix: --nproc 2 or more");
  }
  for (double mb : o.time_allreduce_mb) {
    if (!(mb > 0)) throw ConfigError(fmt::format("--time-allreduce {}: sizes must be > 0 MB", mb));
    auto t = torch::ones({std::max<int64_t>(1, static_cast<int64_t>(mb * 1e6 / 4))});
    std::vector<double> ms;
    for (int i = 0; i <= o.reps; ++i) {
      d.world->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      d.world->all_reduce(t, Traffic::kDataParallel);
      auto took = torch::full({1}, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                              torch::kFloat64);
      d.world->all_reduce(took, Traffic::kControl, /*max=*/true);
      if (i > 0) ms.push_back(took.item<double>());  // call 0: the warm-up
    }
    AllReduceTiming r;
    r.mb = mb;
    std::sort(ms.begin(), ms.end());
    r.min_ms = ms.front();
    r.median_ms = ms[ms.size() / 2];
    for (double v : ms) r.mean_ms += v / double(ms.size());
    out.push_back(r);
  }
  return out;
}

}  // namespace

int run_comm_check(const Config& cfg, const CommCheckOptions& options, std::vector<AllReduceTiming>* allreduce_ms) {
  LaunchEnv env = detect_launch_env(process_env(), this_hostname());
  use_interface(env, cfg.parallel.interface);
  const ParallelDims dims{static_cast<int>(cfg.parallel.tp), static_cast<int>(cfg.parallel.pp),
                          static_cast<int>(cfg.parallel.dp)};
  const int per_node = cfg.parallel.ranks_per_node > 0 ? static_cast<int>(cfg.parallel.ranks_per_node)
                                                       : env.local_world_size;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.parallel.timeout_seconds * 1000));
  // The run's own backend (NCCL groups on GPUs); the checks' host tensors are staged to it.
  Placement placement = this_rank_placement(cfg.parallel.device, cfg.parallel.backend, env.local_rank,
                                            env.local_world_size);
  use_device(placement.device);
  const std::string decided = placement.decided;
  auto d = init_distributed(dims, per_node, env, timeout, {}, std::move(placement));
  if (env.rank == 0 && !options.quiet) {
    spdlog::info("layout ({} launcher; {}):\n{}", env.source, decided, rank_table(*d));
  }
  if (env.rank == options.die_rank) raise(SIGKILL);
  setup_network(*d, cfg);  // network.emulate: the checks and --time-allreduce cross the declared links

  check_group(d->world.get(), "world", env.rank);
  check_group(d->tp.get(), "tp", env.rank);
  check_group(d->dp.get(), "dp", env.rank);
  check_group(d->pp.get(), "pp", env.rank);
  check_group(d->model_parallel.get(), "model-parallel", env.rank);
  check_group(d->embedding.get(), "embedding", env.rank);
  check_group(d->fused_embedding.get(), "fused-embedding", env.rank);

  // Pipeline neighbours exchange their global rank (forward to next, backward to previous).
  const int stage = d->coord().pp, stages = dims.pp;
  std::vector<CommHandle> hs;
  auto from_prev = torch::empty({4}), from_next = torch::empty({4});
  auto mine = torch::full({4}, static_cast<float>(env.rank));
  if (stage + 1 < stages) {
    hs.push_back(d->pp->send(mine, stage + 1, Traffic::kPipelineForward));
    hs.push_back(d->pp->recv(from_next, stage + 1, Traffic::kPipelineBackward));
  }
  if (stage > 0) {
    hs.push_back(d->pp->recv(from_prev, stage - 1, Traffic::kPipelineForward));
    hs.push_back(d->pp->send(mine, stage - 1, Traffic::kPipelineBackward));
  }
  for (auto& h : hs) h.wait();
  if (stage > 0 && from_prev[0].item<int>() != d->layout.prev_stage_rank(env.rank)) {
    throw CommError(fmt::format("rank {}: pipeline recv from the previous stage gave rank {}, expected {}", env.rank,
                                from_prev[0].item<int>(), d->layout.prev_stage_rank(env.rank)));
  }
  d->world->barrier();  // every rank passed its checks
  if (env.rank == 0 && !options.quiet) {
    spdlog::info("comm-check OK: {} ranks, layout tp={} pp={} dp={}, every group and pipeline p2p verified",
                 env.world_size, dims.tp, dims.pp, dims.dp);
  }
  if (!options.time_allreduce_mb.empty()) {
    if (options.reps < 1) throw ConfigError(fmt::format("--reps {}: must be >= 1", options.reps));
    const auto timings = time_allreduce(*d, options);
    if (env.rank == 0) {
      for (const auto& r : timings) {
        spdlog::info("all-reduce of {} MB (fp32, sum) over {} ranks on {} node(s): median {:.1f} ms, mean {:.1f} ms, min "
                     "{:.1f} ms (slowest rank per call; {} calls after a warm-up)",
                     r.mb, env.world_size, d->layout.num_nodes(), r.median_ms, r.mean_ms, r.min_ms, options.reps);
      }
    }
    if (allreduce_ms) *allreduce_ms = timings;
  }
  const auto total = d->meter.total();
  if (!options.quiet) {
    spdlog::info("rank {} on {} (node {}): all groups OK; sent {} bytes in {} calls", env.rank, this_hostname(),
                 d->layout.node_of(env.rank), total.bytes, total.calls);
  }
  return 0;
}

}  // namespace optcc

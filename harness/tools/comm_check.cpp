#include "harness/tools/comm_check.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include "harness/parallel/distributed.h"

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

}  // namespace

int run_comm_check(const Config& cfg, const CommCheckOptions& options) {
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
  const auto total = d->meter.total();
  if (!options.quiet) {
    spdlog::info("rank {} on {} (node {}): all groups OK; sent {} bytes in {} calls", env.rank, this_hostname(),
                 d->layout.node_of(env.rank), total.bytes, total.calls);
  }
  return 0;
}

}  // namespace optcc

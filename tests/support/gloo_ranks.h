// Multi-rank tests without processes: N threads, one Gloo process group each, sharing a HashStore
// over loopback (the c10d test idiom). Exceptions on any rank are rethrown on the caller.
//
// Teardown: a rank that finishes early must not close its Gloo sockets while a peer is still
// connecting the same group (the peer's handshake then reads EOF and throws "Connection closed by
// peer", a flake seen under load). So every Gloo group a rank creates through RankContext is kept
// alive until all ranks of the run have returned from fn (a store barrier; a rank that returns
// early, as a "dead" rank in a timeout test, waits there for the others).
#pragma once

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "harness/parallel/communicator.h"

namespace optcc::testing {

/// Shared by the threads of one run_ranks call.
struct RankContext {
  int rank = 0, world = 1;
  c10::intrusive_ptr<c10d::Store> store;
  std::chrono::milliseconds timeout{20000};
  /// Every Gloo group this rank created; released only after the exit barrier of run_ranks.
  std::shared_ptr<std::vector<ProcessGroupPtr>> keep_alive = std::make_shared<std::vector<ProcessGroupPtr>>();
  /// A group over `members` (global ranks, sorted; must contain `rank`) named `name`.
  std::unique_ptr<Communicator> group(const std::vector<int>& members, const std::string& name,
                                      TrafficMeter* meter = nullptr, Link link = Link::kIntraNode) const {
    int me = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] == rank) me = static_cast<int>(i);
    }
    ProcessGroupPtr pg;
    if (members.size() > 1) {
      pg = make_gloo_group(store, name, me, static_cast<int>(members.size()), timeout);
      keep_alive->push_back(pg);
    }
    return std::make_unique<Communicator>(pg, members, rank, name, link, meter, timeout);
  }
  std::unique_ptr<Communicator> world_group(TrafficMeter* meter = nullptr) const {
    std::vector<int> all(world);
    for (int i = 0; i < world; ++i) all[i] = i;
    return group(all, "world", meter);
  }
};

/// Blocks until all `world` ranks have called it with the same `key` (a store barrier, no Gloo);
/// throws c10::Error after `timeout`. Every rank must call it, also a rank whose work failed.
inline void store_barrier(c10d::Store& store, const std::string& key, int rank, int world,
                          std::chrono::milliseconds timeout) {
  store.set(fmt::format("{}/{}", key, rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(fmt::format("{}/{}", key, r));
  store.wait(keys, timeout);
}

/// Runs fn(ctx) on `world` threads; LibTorch intra-op threads are set to 1 for the duration.
/// Gloo groups made through ctx live until every rank has returned (see the note at the top).
template <class F>
void run_ranks(int world, F fn, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  at::set_num_threads(1);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankContext ctx{r, world, store, timeout};
      try {
        fn(ctx);
      } catch (...) {
        errors[r] = std::current_exception();
      }
      try {  // as long as join() would wait anyway: only ranks still inside fn are waited for
        store_barrier(*store, "optcc-test-exit", r, world, std::chrono::minutes(10));
      } catch (...) {
        if (!errors[r]) errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace optcc::testing

#include "harness/parallel/distributed.h"

namespace optcc::testing {

/// Runs fn(rank, Distributed&) on tp*pp*dp threads, each with a full Distributed (all layout groups)
/// over the shared HashStore, all ranks on one node. `timeout`: the rendezvous and per-collective
/// timeout (a test whose ranks are expected to wait for a failed peer passes a short one).
template <class F>
void run_layout(ParallelDims dims, F fn, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  const int world = dims.world();
  run_ranks(world, [&](const RankContext& ctx) {
    LaunchEnv env;
    env.rank = ctx.rank, env.world_size = world, env.local_rank = ctx.rank, env.local_world_size = world;
    env.source = "threads";
    auto dist = init_distributed(dims, world, env, ctx.timeout, ctx.store);
    for (auto* c : {dist->world.get(), dist->tp.get(), dist->dp.get(), dist->pp.get(), dist->model_parallel.get(),
                    dist->embedding.get(), dist->fused_embedding.get()}) {
      if (c && c->process_group()) ctx.keep_alive->push_back(c->process_group());
    }
    fn(ctx.rank, *dist);
  }, timeout);
}

}  // namespace optcc::testing

// Helpers shared by the DP reducer tests (grad_reducer_test, reducer_state_test, sparse_reducer_test): seeded inputs
// and the cross-rank checks every reducer must pass.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "compression/grad_reducer.h"
#include "harness/parallel/communicator.h"

namespace optcc::testing {

/// fp32 normal values from a generator of its own (ranks are threads: never the global one).
inline torch::Tensor seeded_randn(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(shape, gen, torch::kFloat);
}

/// A stage's gradients on process rank `rank` at `step`: two compressible matrices ([32, 16] and
/// [64, 48]), a bias [16] and a 3-D tensor [8, 4, 3] that reducers send raw; seeded by (rank, step).
inline std::vector<torch::Tensor> make_grads(int rank, int64_t step) {
  const uint64_t s = 1000 * rank + 10 * step;
  return {seeded_randn({32, 16}, s + 1), seeded_randn({16}, s + 2), seeded_randn({8, 4, 3}, s + 3),
          seeded_randn({64, 48}, s + 4)};
}

inline std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.clone());
  return out;
}

/// Every rank's flattened gradients, [world, Σ numel] fp32 (Traffic::kControl: not counted as DP).
inline torch::Tensor gather_all(Communicator& comm, const std::vector<torch::Tensor>& grads) {
  return comm.all_gather(flatten_fp32(grads).unsqueeze(0), Traffic::kControl, 0);
}

/// The DP contract: after reduce() every rank holds the same bits.
inline void expect_identical_on_all_ranks(Communicator& comm, const std::vector<torch::Tensor>& grads) {
  auto all = gather_all(comm, grads);
  for (int r = 1; r < comm.size(); ++r) EXPECT_TRUE(torch::equal(all[r], all[0])) << "rank " << r << " differs";
}

}  // namespace optcc::testing

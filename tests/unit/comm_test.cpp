// Communicator on Gloo with ranks as threads: closed-form collectives, p2p ordering, byte
// accounting by the ring formulas, and failures that end in an error instead of a hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "harness/parallel/communicator.h"
#include "tests/support/gloo_ranks.h"

namespace optcc {
namespace {

using testing::RankContext;
using testing::run_ranks;

class CommWorld : public ::testing::TestWithParam<int> {};

TEST_P(CommWorld, AllReduceSumAndMaxClosedForm) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    auto t = torch::full({3, 5}, static_cast<float>(ctx.rank + 1));
    comm->all_reduce(t, Traffic::kDataParallel);
    EXPECT_TRUE(torch::equal(t, torch::full({3, 5}, n * (n + 1) / 2.0f)));
    auto m = torch::full({2}, static_cast<float>(ctx.rank));
    comm->all_reduce(m, Traffic::kDataParallel, /*max=*/true);
    EXPECT_EQ(m[0].item<float>(), n - 1);
  });
}

TEST_P(CommWorld, AllGatherInRankOrderAndReduceScatter) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    auto local = torch::full({2, 3}, static_cast<float>(ctx.rank));
    auto g = comm->all_gather(local, Traffic::kTensorParallel, 0);
    ASSERT_EQ(g.sizes(), (std::vector<int64_t>{2 * n, 3}));
    for (int r = 0; r < n; ++r) EXPECT_TRUE(torch::equal(g.narrow(0, 2 * r, 2), torch::full({2, 3}, float(r))));
    auto g1 = comm->all_gather(local, Traffic::kTensorParallel, 1);
    ASSERT_EQ(g1.sizes(), (std::vector<int64_t>{2, 3 * n}));
    // reduce_scatter: input arange(4n) * (rank+1) on every rank; sum = arange * n(n+1)/2.
    auto in = torch::arange(4 * n, torch::kFloat) * float(ctx.rank + 1);
    auto out = comm->reduce_scatter(in, Traffic::kDataParallel);
    auto expect = torch::arange(4 * ctx.rank, 4 * ctx.rank + 4, torch::kFloat) * float(n * (n + 1) / 2);
    EXPECT_TRUE(torch::equal(out, expect));
  });
}

TEST_P(CommWorld, BroadcastFromLastRank) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    auto t = torch::full({4}, static_cast<float>(ctx.rank * 10));
    comm->broadcast(t, n - 1, Traffic::kEmbedding);
    EXPECT_EQ(t[3].item<float>(), 10.0f * (n - 1));
  });
}

TEST_P(CommWorld, RingOfAsymmetricMessagesKeepsOrderAndShapes) {  // BR-11, BR-13
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "p2p needs two ranks";
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    const int next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
    // Two messages of different shapes to the same peer, posted together with two receives.
    auto p = torch::full({6, 4}, float(ctx.rank));  // like a CB P factor [s*b, r]
    auto q = torch::full({3, 4}, float(-ctx.rank));  // like Q [h, r]
    auto rp = torch::empty({6, 4}), rq = torch::empty({3, 4});
    std::vector<CommHandle> hs;
    hs.push_back(comm->send(p, next, Traffic::kPipelineBackward));
    hs.push_back(comm->send(q, next, Traffic::kPipelineBackward));
    hs.push_back(comm->recv(rp, prev, Traffic::kPipelineBackward));
    hs.push_back(comm->recv(rq, prev, Traffic::kPipelineBackward));
    for (auto& h : hs) h.wait();
    EXPECT_TRUE(torch::equal(rp, torch::full({6, 4}, float(prev))));
    EXPECT_TRUE(torch::equal(rq, torch::full({3, 4}, float(-prev))));
  });
}

TEST_P(CommWorld, BytesFollowRingFormulas) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    TrafficMeter meter;
    auto comm = ctx.group([&] { std::vector<int> a(n); for (int i = 0; i < n; ++i) a[i] = i; return a; }(),
                          "world", &meter, Link::kInterNode);
    auto t = torch::ones({1000});  // 4000 bytes
    comm->all_reduce(t, Traffic::kDataParallel);
    comm->all_gather(torch::ones({250}), Traffic::kTensorParallel);
    comm->reduce_scatter(torch::ones({4 * n}), Traffic::kEmbedding);
    const auto& dp = meter.at(Traffic::kDataParallel, Link::kInterNode);
    EXPECT_EQ(dp.bytes, 2 * (n - 1) * 4000 / n);
    EXPECT_EQ(dp.calls, n > 1 ? 1 : 0);
    EXPECT_EQ(meter.at(Traffic::kTensorParallel, Link::kInterNode).bytes, (n - 1) * 1000);
    EXPECT_EQ(meter.at(Traffic::kEmbedding, Link::kInterNode).bytes, (n - 1) * 16 * n / n);
    EXPECT_EQ(meter.at(Traffic::kDataParallel, Link::kIntraNode).bytes, 0);
  });
}

// A bf16 sum on Gloo: bf16 on the wire, summed in fp32 and rounded once, the same bits on every
// rank, and the bytes of a bf16 ring all-reduce. The values are chosen so that summing in bf16
// would lose them: 256 + 1 + 1 + ... is 256 in bf16 at every partial sum (8 mantissa bits), while
// the fp32 sum is 256 + (n-1) before the one rounding. An odd length exercises the padding.
TEST_P(CommWorld, Bf16AllReduceSumsInFp32AndSendsBf16) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    TrafficMeter meter;
    auto comm = ctx.group([&] { std::vector<int> a(n); for (int i = 0; i < n; ++i) a[i] = i; return a; }(),
                          "world", &meter, Link::kInterNode);
    const int64_t len = 1001;
    auto x = (torch::arange(len, torch::kFloat) * 0.01f + float(ctx.rank)).to(torch::kBFloat16);
    x[0] = ctx.rank == 0 ? 256.0f : 1.0f;
    const auto expect = [&] {
      auto sum = torch::zeros({len}, torch::kFloat);
      for (int r = 0; r < n; ++r) {
        auto xr = (torch::arange(len, torch::kFloat) * 0.01f + float(r)).to(torch::kBFloat16);
        xr[0] = r == 0 ? 256.0f : 1.0f;
        sum += xr.to(torch::kFloat);
      }
      return sum.to(torch::kBFloat16);
    }();
    comm->all_reduce(x, Traffic::kTensorParallel);
    EXPECT_EQ(x.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(x, expect));
    if (n == 4) {
      EXPECT_EQ(x[0].item<float>(), 260.0f);  // 259 rounded once; a bf16 ring gives 256
    }
    const int64_t chunk = (len + n - 1) / n;
    EXPECT_EQ(meter.at(Traffic::kTensorParallel, Link::kInterNode).bytes, 2 * (n - 1) * chunk * 2);
    EXPECT_EQ(meter.at(Traffic::kTensorParallel, Link::kInterNode).calls, n > 1 ? 1 : 0);
  });
}

// all_reduce_summing_in_fp32 (the 16-bit DP wire of parallel.grad_reduce_dtype: compute): for fp16
// and bf16 the result is the fp32 sum of the addends rounded once, the same bits on every rank, and
// the bytes are Communicator::summing_in_fp32_sent_bytes. Element 0 holds 40000, 40000, -30000,
// -30000 on ranks 0-3 (fp16): a sum in fp16 overflows at the first partial sum (80000 > 65504),
// the fp32 sum is 20000. Element 1: 2048 + 1 + 1 + 1 is 2048 at every fp16 partial sum (spacing 2
// there); summed in fp32 it is 2051, rounded once to 2052.
TEST_P(CommWorld, SummingInFp32RoundsOnceAndSurvivesOverflowingPartialSums) {
  const int n = GetParam();
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    run_ranks(n, [&](const RankContext& ctx) {
      TrafficMeter meter;
      auto comm = ctx.group([&] { std::vector<int> a(n); for (int i = 0; i < n; ++i) a[i] = i; return a; }(),
                            "world", &meter, Link::kInterNode);
      const int64_t len = 1003;  // not a multiple of 2 or 4: padded chunks
      auto addend = [&](int r) {
        auto x = torch::arange(len, torch::kFloat).mul(0.37f).sin().mul(float(r + 1));
        x[0] = r < 2 ? 40000.0f : -30000.0f;
        x[1] = r == 0 ? 2048.0f : 1.0f;
        return x.to(dtype);
      };
      auto x = addend(ctx.rank);
      auto expect = torch::zeros({len}, torch::kFloat);
      for (int r = 0; r < n; ++r) expect += addend(r).to(torch::kFloat);
      comm->all_reduce_summing_in_fp32(x, Traffic::kDataParallel);
      ASSERT_EQ(x.scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(x, expect.to(dtype))) << c10::toString(dtype) << " world " << n;
      if (n == 4 && dtype == torch::kHalf) {
        EXPECT_EQ(x[0].item<float>(), 20000.0f);
        EXPECT_EQ(x[1].item<float>(), 2052.0f);
      }
      EXPECT_EQ(meter.at(Traffic::kDataParallel, Link::kInterNode).bytes,
                Communicator::summing_in_fp32_sent_bytes(n, len, 2));
      EXPECT_EQ(Communicator::summing_in_fp32_sent_bytes(n, len, 2), n == 1 ? 0 : 2 * (n - 1) * ((len + n - 1) / n) * 2);
    });
  }
}

// Moving bf16 on Gloo (no bf16 type there): all_gather, broadcast and p2p carry the exact bits.
TEST_P(CommWorld, Bf16MovesBitExactlyOnGloo) {
  const int n = GetParam();
  run_ranks(n, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    auto mine = [](int r) { return (torch::arange(7, torch::kFloat) / 3.0f + float(r) * 1000.5f).to(torch::kBFloat16); };
    const auto g = comm->all_gather(mine(ctx.rank), Traffic::kTensorParallel);
    ASSERT_EQ(g.scalar_type(), torch::kBFloat16);
    for (int r = 0; r < n; ++r) EXPECT_TRUE(torch::equal(g.narrow(0, 7 * r, 7), mine(r))) << r;
    auto b = mine(ctx.rank);
    comm->broadcast(b, n - 1, Traffic::kEmbedding);
    EXPECT_TRUE(torch::equal(b, mine(n - 1)));
    if (n == 1) return;
    const int next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
    auto in = torch::empty({7}, torch::kBFloat16);
    auto hs = std::vector<CommHandle>{comm->send(mine(ctx.rank), next, Traffic::kPipelineForward),
                                      comm->recv(in, prev, Traffic::kPipelineForward)};
    for (auto& h : hs) h.wait();
    EXPECT_TRUE(torch::equal(in, mine(prev)));
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, CommWorld, ::testing::Values(1, 2, 4));

TEST(Comm, SubGroupsOverlapWithoutCrossTalk) {
  run_ranks(4, [&](const RankContext& ctx) {
    // Two "TP" pairs {0,1},{2,3} and two "DP" pairs {0,2},{1,3}, created in the same order everywhere.
    std::vector<int> tp = ctx.rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    std::vector<int> dp = ctx.rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    auto tpc = ctx.group(tp, fmt::format("tp{}", tp[0]));
    auto dpc = ctx.group(dp, fmt::format("dp{}", dp[0]));
    auto a = torch::full({1}, float(ctx.rank));
    tpc->all_reduce(a, Traffic::kTensorParallel);
    auto b = torch::full({1}, float(ctx.rank));
    dpc->all_reduce(b, Traffic::kDataParallel);
    EXPECT_EQ(a.item<float>(), float(tp[0] + tp[1]));
    EXPECT_EQ(b.item<float>(), float(dp[0] + dp[1]));
  });
}

TEST(Comm, MissingPeerTimesOutWithNamedError) {
  std::string message;
  run_ranks(2, [&](const RankContext& ctx) {
    auto comm = ctx.world_group();
    if (ctx.rank == 1) return;  // rank 1 "dies": never joins the collective
    auto t = torch::ones({8});
    try {
      comm->all_reduce(t, Traffic::kDataParallel);
    } catch (const CommError& e) {
      message = e.what();
    }
  }, std::chrono::milliseconds(1500));
  EXPECT_THAT(message, ::testing::HasSubstr("rank 0 (group world, group rank 0 of 2): all_reduce of 32 bytes failed"));
}

}  // namespace
}  // namespace optcc

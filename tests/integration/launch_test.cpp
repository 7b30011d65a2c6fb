// The local launcher end to end: 8 forked ranks (TP2 x PP2 x DP2) rendezvous, build every group and
// pass the closed-form checks; when one rank dies, every rank ends within the timeout, the run
// exits non-zero and the launcher names the dead rank. Also `optcc config show`'s check.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <regex>
#include <string>

#include "tests/support/paths.h"

namespace {

struct Result {
  int exit_code;
  std::string output;
  double seconds;
};

Result run(const std::string& args) {
  const std::string cmd = std::string(optcc::testing::binary_dir()) + "/optcc " + args + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  const int status = pclose(pipe);
  return {WEXITSTATUS(status), out,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

const std::string kConfig = std::string(" --config ") + optcc::testing::source_dir() + "/experiments/comm-check-2x2x2.yaml";

TEST(LocalLaunch, EightRanksBuildEveryGroup) {
  auto r = run("comm-check --nproc 8" + kConfig);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("launched 8 local ranks"));
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_THAT(r.output, ::testing::HasSubstr("rank " + std::to_string(rank) + " on ")) << r.output;
  }
}

TEST(LocalLaunch, DeadRankEndsTheRunNamingIt) {
  auto r = run("comm-check --nproc 8 --die-rank 5 --set parallel.timeout_seconds=10" + kConfig);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("rank 5 was killed by signal 9"));
  EXPECT_LT(r.seconds, 10.0 + 5.0 + 5.0) << "timeout + grace + start-up exceeded";
}

// --time-allreduce through the link emulator has a closed form: 2 ranks on 2 nodes, links of
// 10 MB/s and no latency: a 1 MB all-reduce sends 2(n-1)/n x 1 MB = 1 MB per rank, 100 ms; 2 MB,
// 200 ms. The real transport (loopback) is far faster, so the emulated time is what is measured.
TEST(LocalLaunch, CommCheckTimesAnAllReduceAcrossTheDeclaredLinks) {
  auto r = run("comm-check --nproc 2 --set parallel.tp=1 --set parallel.pp=1 --set parallel.dp=2 --set "
               "parallel.ranks_per_node=1 --set network.emulate=true --set network.intra_node_gbps=1 --set "
               "network.inter_node_gbps=0.01 --time-allreduce 1,2 --reps 3" + kConfig);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (auto [mb, ms] : {std::pair{1, 100.0}, std::pair{2, 200.0}}) {
    std::smatch m;
    const std::regex line("all-reduce of " + std::to_string(mb) + " MB \\(fp32, sum\\) over 2 ranks on 2 node\\(s\\): "
                          "median ([0-9.]+) ms");
    ASSERT_TRUE(std::regex_search(r.output, m, line)) << r.output;
    EXPECT_GE(std::stod(m[1]), ms * 0.99) << m[0];
    EXPECT_LE(std::stod(m[1]), ms * 1.5) << m[0];
  }
  auto one = run("comm-check --nproc 1 --set parallel.tp=1 --set parallel.pp=1 --set parallel.dp=1 --time-allreduce 1" + kConfig);
  EXPECT_NE(one.exit_code, 0);
  EXPECT_THAT(one.output, ::testing::HasSubstr("a world of one rank has no all-reduce to time"));
}

TEST(LocalLaunch, LayoutMustMatchRanks) {
  auto r = run("comm-check --nproc 4" + kConfig);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("parallel.tp*pp*dp = 2*2*2 = 8: must equal the number of ranks, 4"));
}

// `config show` on a config whose corpus is not prepared yet: a note, not an error, and the rest
// is still validated (exit 0, "config OK").
TEST(ConfigShow, UnpreparedCorpusIsANoteNotAnError) {
  auto r = run(std::string("config show --config ") + optcc::testing::source_dir() +
               "/experiments/demo.yaml --set data.prefix=/nonexistent/optcc-corpus");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("note (not an error for `config show`"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("/nonexistent/optcc-corpus.json does not exist"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("model.vocab_size = data.vocab_size = 8000"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("config OK for 1 ranks"));
  EXPECT_THAT(r.output, ::testing::Not(::testing::HasSubstr("config error")));
}

// A real config error still fails `config show`, naming the key.
TEST(ConfigShow, InvalidValueFails) {
  auto r = run(std::string("config show --config ") + optcc::testing::source_dir() +
               "/experiments/demo.yaml --set data.prefix=/nonexistent/optcc-corpus --set parallel.tp=0");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("parallel.tp"));
}

// `config label` labels only what a run would accept: a bad value fails there too, naming the key,
// and a good config prints its label.
TEST(ConfigLabel, ValidatesBeforeLabelling) {
  const std::string config = std::string(" --config ") + optcc::testing::source_dir() + "/experiments/demo.yaml";
  auto bad = run("config label" + config + " --set compression.dp_strategy=diloco --set diloco.mix=1.5");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_THAT(bad.output, ::testing::HasSubstr("diloco.mix = 1.5"));
  auto good = run("config label" + config + " --set compression.scheme=cb");
  EXPECT_EQ(good.exit_code, 0) << good.output;
  EXPECT_THAT(good.output, ::testing::HasSubstr("cb"));
}

}  // namespace

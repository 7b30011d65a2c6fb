// Ranks on several hosts: the address a rank's groups listen on, and the rule that the layout's
// nodes are the real hosts (harness/parallel/distributed.h). The runs across real hosts (network
// namespaces) are in tests/integration/hosts_test.sh.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/parallel/distributed.h"

namespace optcc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string listen_error(const LaunchEnv& env) {
  try {
    listen_address(env);
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

TEST(ListenAddress, LoopbackMasterListensOnLoopback) {
  LaunchEnv env;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  EXPECT_EQ(listen_address(env), "127.0.0.1");
  env.master_addr = "localhost";
  EXPECT_EQ(listen_address(env), "127.0.0.1");
}

TEST(ListenAddress, LoopbackIsRefusedWhenTheJobSpansNodes) {
  LaunchEnv env;
  env.world_size = 4;
  env.num_nodes = 2;
  env.master_addr = "127.0.0.1";  // as on rank 0's host when its name resolves to 127.0.1.1
  EXPECT_THAT(listen_error(env), AllOf(HasSubstr("a loopback address"), HasSubstr("the job spans 2 nodes"),
                                       HasSubstr("Fix: set parallel.interface")));
  env.interface = "lo";  // named by the user: taken as given
  EXPECT_EQ(listen_address(env), "127.0.0.1");
}

TEST(ListenAddress, NamedInterfaceGivesItsAddressOrAnErrorListingTheInterfaces) {
  LaunchEnv env;
  env.world_size = 2;
  env.interface = "lo";
  env.interface_source = "GLOO_SOCKET_IFNAME";
  EXPECT_EQ(listen_address(env), "127.0.0.1");
  env.interface = "nosuchif9";
  EXPECT_THAT(listen_error(env), AllOf(HasSubstr("GLOO_SOCKET_IFNAME = nosuchif9"), HasSubstr("lo (127.0.0.1)"),
                                       HasSubstr("Fix:")));
  env.interface_source = "parallel.interface";
  EXPECT_THAT(listen_error(env), HasSubstr("parallel.interface = nosuchif9"));
}

TEST(ListenAddress, MasterThatDoesNotResolveIsNamed) {
  LaunchEnv env;
  env.world_size = 2;
  env.master_addr = "no-such-host.invalid";  // RFC 2606: never resolves
  env.source = "torchrun";
  EXPECT_THAT(listen_error(env), AllOf(HasSubstr("MASTER_ADDR no-such-host.invalid (torchrun launcher) does not "
                                                 "resolve"),
                                       HasSubstr("Fix:")));
}

std::vector<std::string> repeat(const std::vector<std::string>& each, int times) {
  std::vector<std::string> out;
  for (const auto& s : each) out.insert(out.end(), times, s);
  return out;
}

TEST(NodeMismatch, OneHostTakesAnyRanksPerNode) {
  const std::vector<std::string> one(8, "127.0.0.1"), names(8, "box");
  for (int per_node : {1, 2, 4, 8}) EXPECT_EQ(node_mismatch(RankLayout({2, 2, 2}, per_node), one, names), "");
}

TEST(NodeMismatch, NodesMustBeTheHostsAcrossHosts) {
  const auto addresses = repeat({"198.18.0.1", "198.18.0.2"}, 4);  // ranks 0-3 on host 1, 4-7 on host 2
  const auto names = repeat({"h1", "h2"}, 4);
  EXPECT_EQ(node_mismatch(RankLayout({2, 2, 2}, 4), addresses, names), "");
  // Nodes of 2 ranks on hosts of 4: ranks 0 and 2 are on different nodes but share host 1.
  EXPECT_THAT(node_mismatch(RankLayout({2, 2, 2}, 2), addresses, names),
              AllOf(HasSubstr("(2 ranks each"), HasSubstr("ranks 0 and 2 are on different nodes but on the same host "
                                                          "h1 (198.18.0.1)"),
                    HasSubstr("h2 (198.18.0.2): ranks 4,5,6,7"), HasSubstr("Fix: set parallel.ranks_per_node")));
  // Nodes of 8 ranks: ranks 0 and 4 share node 0 but not a host.
  EXPECT_THAT(node_mismatch(RankLayout({2, 2, 2}, 8), addresses, names),
              HasSubstr("ranks 0 and 4 are on node 0 but on h1 (198.18.0.1) and h2 (198.18.0.2)"));
  // Ranks not placed host by host (round robin): found too.
  std::vector<std::string> round_robin;
  for (int r = 0; r < 8; ++r) round_robin.push_back(r % 2 ? "198.18.0.2" : "198.18.0.1");
  EXPECT_THAT(node_mismatch(RankLayout({2, 2, 2}, 4), round_robin, std::vector<std::string>(8, "node")),
              HasSubstr("ranks 0 and 1 are on node 0 but on node (198.18.0.1) and node (198.18.0.2)"));
}

TEST(NodeMismatch, NoRankMayListenOnLoopbackAcrossHosts) {
  const std::vector<std::string> addresses = {"127.0.0.1", "127.0.0.1", "198.18.0.2", "198.18.0.2"};
  EXPECT_THAT(node_mismatch(RankLayout({2, 1, 2}, 2), addresses, {"h1", "h1", "h2", "h2"}),
              AllOf(HasSubstr("rank 0 listens on a loopback address, h1 (127.0.0.1), but the ranks run on 2 hosts"),
                    HasSubstr("Fix: set parallel.interface")));
}

TEST(NodeMismatch, HostsSharingAHostnameAreToldApartByAddress) {
  const auto addresses = repeat({"198.18.0.1", "198.18.0.2"}, 2);
  EXPECT_EQ(node_mismatch(RankLayout({2, 1, 2}, 2), addresses, std::vector<std::string>(4, "localhost")), "");
  EXPECT_NE(node_mismatch(RankLayout({2, 1, 2}, 4), addresses, std::vector<std::string>(4, "localhost")), "");
}

}  // namespace
}  // namespace optcc

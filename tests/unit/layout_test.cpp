// Rank arithmetic (docs/design.md §1.1) and launch-environment detection (BR-20 in docs/faults.md): pure, no process groups.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "harness/parallel/launch_env.h"
#include "harness/parallel/layout.h"

namespace optcc {

// gtest's name for a parameter in test listings (else it prints the struct's bytes).
void PrintTo(const ParallelDims& d, std::ostream* os) { *os << "tp" << d.tp << "_pp" << d.pp << "_dp" << d.dp; }

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Groups = std::vector<std::vector<int>>;

const GroupKind kPartitionKinds[] = {GroupKind::kTensorParallel, GroupKind::kDataParallel,
                                     GroupKind::kPipelineParallel, GroupKind::kModelParallel};
const GroupKind kEndStageKinds[] = {GroupKind::kEmbedding, GroupKind::kFusedEmbedding};

// ---------------------------------------------------------------------------------------------
// RankLayout over the four shapes (t, p, d) of the brief.

class LayoutShapes : public ::testing::TestWithParam<ParallelDims> {};

TEST_P(LayoutShapes, RankCoordBijectionInMegatronOrder) {
  const ParallelDims d = GetParam();
  const RankLayout layout(d, 8);
  std::set<std::tuple<int, int, int>> seen;
  for (int r = 0; r < layout.world(); ++r) {
    const RankCoord c = layout.coord(r);
    EXPECT_EQ(r, c.tp + d.tp * (c.dp + d.dp * c.pp));  // TP fastest, then DP, then PP
    EXPECT_EQ(layout.rank(c), r);
    seen.insert({c.tp, c.dp, c.pp});
  }
  EXPECT_EQ(static_cast<int>(seen.size()), d.tp * d.pp * d.dp);
}

TEST_P(LayoutShapes, PartitioningGroupsCoverEveryRankOnceAndAgreeOnAllMembers) {
  const ParallelDims d = GetParam();
  const RankLayout layout(d, 8);
  const std::map<GroupKind, int> size = {{GroupKind::kTensorParallel, d.tp},
                                         {GroupKind::kDataParallel, d.dp},
                                         {GroupKind::kPipelineParallel, d.pp},
                                         {GroupKind::kModelParallel, d.tp * d.pp}};
  for (GroupKind kind : kPartitionKinds) {
    SCOPED_TRACE(std::string(group_kind_name(kind)));
    std::vector<int> count(layout.world(), 0);
    const Groups groups = layout.all_groups(kind);
    EXPECT_EQ(static_cast<int>(groups.size()), layout.world() / size.at(kind));
    for (const auto& g : groups) {
      EXPECT_EQ(static_cast<int>(g.size()), size.at(kind));
      EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
      for (int r : g) {
        ++count[r];
        EXPECT_EQ(layout.group(kind, r), g);  // the same list on every member
      }
    }
    EXPECT_EQ(count, std::vector<int>(layout.world(), 1));
  }
}

TEST_P(LayoutShapes, EmbeddingGroupsCoverFirstAndLastStagesOnly) {
  const ParallelDims d = GetParam();
  const RankLayout layout(d, 8);
  const int end_stages = d.pp == 1 ? 1 : 2;
  const std::map<GroupKind, int> size = {{GroupKind::kEmbedding, end_stages},
                                         {GroupKind::kFusedEmbedding, end_stages * d.dp}};
  for (GroupKind kind : kEndStageKinds) {
    SCOPED_TRACE(std::string(group_kind_name(kind)));
    std::vector<int> count(layout.world(), 0);
    for (const auto& g : layout.all_groups(kind)) {
      EXPECT_EQ(static_cast<int>(g.size()), size.at(kind));
      for (int r : g) {
        ++count[r];
        EXPECT_EQ(layout.group(kind, r), g);
        if (kind == GroupKind::kFusedEmbedding) {
          EXPECT_EQ(layout.coord(r).tp, layout.coord(g[0]).tp);
        }
      }
    }
    for (int r = 0; r < layout.world(); ++r) {
      const bool end = layout.is_first_stage(r) || layout.is_last_stage(r);
      EXPECT_EQ(count[r], end ? 1 : 0) << "rank " << r;
      EXPECT_EQ(layout.group(kind, r).empty(), !end);
    }
  }
  EXPECT_EQ(static_cast<int>(layout.all_groups(GroupKind::kFusedEmbedding).size()), d.tp);  // one per tp
}

TEST_P(LayoutShapes, StageNeighboursDoNotWrap) {
  const RankLayout layout(GetParam(), 8);
  for (int r = 0; r < layout.world(); ++r) {
    const std::vector<int> pp = layout.pp_group(r);
    const int s = layout.coord(r).pp;
    EXPECT_EQ(layout.prev_stage_rank(r), s == 0 ? -1 : pp[s - 1]);
    EXPECT_EQ(layout.next_stage_rank(r), s + 1 == static_cast<int>(pp.size()) ? -1 : pp[s + 1]);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayoutShapes,
                         ::testing::Values(ParallelDims{8, 4, 4}, ParallelDims{2, 2, 2}, ParallelDims{1, 1, 1},
                                           ParallelDims{2, 1, 3}));

// ---------------------------------------------------------------------------------------------
// Exact member lists.

TEST(Layout, ExactGroupsFor2x2x2) {
  const RankLayout layout({2, 2, 2}, 4);
  EXPECT_EQ(layout.all_groups(GroupKind::kTensorParallel), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::kDataParallel), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::kPipelineParallel), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::kModelParallel), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::kEmbedding), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::kFusedEmbedding), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_THAT(layout.embedding_group(1), ElementsAre(1, 5));
  EXPECT_THAT(layout.fused_embedding_group(6), ElementsAre(0, 2, 4, 6));  // tp 0
  EXPECT_THAT(layout.fused_embedding_group(3), ElementsAre(1, 3, 5, 7));  // tp 1
  EXPECT_EQ(layout.coord(6), (RankCoord{0, 1, 1}));
  EXPECT_EQ(layout.next_stage_rank(1), 5);
  EXPECT_EQ(layout.prev_stage_rank(7), 3);
  EXPECT_EQ(layout.prev_stage_rank(1), -1);
  EXPECT_EQ(layout.next_stage_rank(5), -1);
}

TEST(Layout, SpecFormulasFor8x4x4) {
  const int t = 8, p = 4, d = 4;  // R = k*t*d + j*t + i (docs/design.md §1.1)
  const RankLayout layout({t, p, d}, 8);
  for (int k = 0; k < p; ++k) {
    for (int j = 0; j < d; ++j) {
      for (int i = 0; i < t; ++i) {
        const int R = k * t * d + j * t + i;
        ASSERT_EQ(layout.coord(R), (RankCoord{i, j, k}));
        std::vector<int> tp, dp, pp, mp, emb, fe;
        for (int x = 0; x < t; ++x) tp.push_back(k * t * d + j * t + x);
        for (int x = 0; x < d; ++x) dp.push_back(k * t * d + i + x * t);
        for (int x = 0; x < p; ++x) pp.push_back(i + j * t + x * t * d);
        for (int y = 0; y < p; ++y) {
          for (int x = 0; x < t; ++x) mp.push_back(y * t * d + j * t + x);
        }
        if (k == 0 || k == p - 1) {
          emb = {i + j * t, i + j * t + (p - 1) * t * d};
          for (int x = 0; x < d; ++x) fe.push_back(i + x * t);
          for (int x = 0; x < d; ++x) fe.push_back(i + x * t + (p - 1) * t * d);
        }
        EXPECT_EQ(layout.tp_group(R), tp);
        EXPECT_EQ(layout.dp_group(R), dp);
        EXPECT_EQ(layout.pp_group(R), pp);
        EXPECT_EQ(layout.model_parallel_group(R), mp);
        EXPECT_EQ(layout.embedding_group(R), emb);
        EXPECT_EQ(layout.fused_embedding_group(R), fe);
      }
    }
  }
  EXPECT_EQ(layout.fused_embedding_group(0).size(), 8u);  // 2d, not the reference's 2td = 64
}

TEST(Layout, EightRanksPerNodeKeepEachTp8GroupOnOneNode) {
  const RankLayout layout({8, 4, 4}, 8);
  EXPECT_EQ(layout.num_nodes(), 16);
  for (const auto& g : layout.all_groups(GroupKind::kTensorParallel)) {
    EXPECT_EQ(layout.group_link(g), Link::kIntraNode);
    for (int r : g) EXPECT_EQ(layout.node_of(r), layout.node_of(g[0]));
  }
  for (GroupKind kind : {GroupKind::kDataParallel, GroupKind::kPipelineParallel, GroupKind::kFusedEmbedding}) {
    for (const auto& g : layout.all_groups(kind)) EXPECT_EQ(layout.group_link(g), Link::kInterNode);
  }
  EXPECT_EQ(layout.node_of(127), 15);
}

TEST(Layout, LinkClassification) {
  const RankLayout layout({2, 2, 2}, 4);  // nodes {0..3}, {4..7}: DP inside a node, PP across
  EXPECT_EQ(layout.link(0, 3), Link::kIntraNode);
  EXPECT_EQ(layout.link(2, 2), Link::kIntraNode);
  EXPECT_EQ(layout.link(3, 4), Link::kInterNode);
  EXPECT_EQ(layout.group_link(layout.dp_group(1)), Link::kIntraNode);
  EXPECT_EQ(layout.group_link(layout.pp_group(1)), Link::kInterNode);
  EXPECT_EQ(layout.group_link({}), Link::kIntraNode);
  EXPECT_EQ(layout.group_link({5}), Link::kIntraNode);
}

TEST(Layout, PartialLastNodeAndSingleStage) {
  const RankLayout layout({2, 1, 3}, 4);  // world 6: nodes {0..3}, {4, 5}
  EXPECT_EQ(layout.num_nodes(), 2);
  EXPECT_EQ(layout.node_of(3), 0);
  EXPECT_EQ(layout.node_of(5), 1);
  EXPECT_THAT(layout.embedding_group(3), ElementsAre(3));                // p == 1: itself
  EXPECT_THAT(layout.fused_embedding_group(4), ElementsAre(0, 2, 4));    // p == 1: d ranks
  EXPECT_EQ(layout.prev_stage_rank(0), -1);
  EXPECT_EQ(layout.next_stage_rank(0), -1);
  EXPECT_EQ(RankLayout({1, 1, 1}, 8).num_nodes(), 1);
}

TEST(Layout, ErrorsNameTheValues) {
  EXPECT_THROW(RankLayout({0, 1, 1}, 1), std::invalid_argument);
  EXPECT_THROW(RankLayout({1, 1, 1}, 0), std::invalid_argument);
  const RankLayout layout({2, 2, 2}, 4);
  EXPECT_THROW(layout.coord(8), std::out_of_range);
  EXPECT_THROW(layout.coord(-1), std::out_of_range);
  EXPECT_THROW(layout.rank(RankCoord{2, 0, 0}), std::out_of_range);
  EXPECT_NO_THROW((ParallelDims{2, 2, 2}.validate(8)));
  try {
    ParallelDims{2, 2, 3}.validate(8);
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("tp*pp*dp = 2*2*3 = 12 but world size is 8"));
    EXPECT_THAT(e.what(), HasSubstr("dp = 8 / (2*2) = 2"));
  }
}

TEST(Layout, DescribeListsEveryRank) {
  const std::string s = RankLayout({2, 2, 2}, 4).describe();
  EXPECT_THAT(s, HasSubstr("tp=2 pp=2 dp=2 world=8, 4 ranks per node, 2 node(s)"));
  EXPECT_THAT(s, HasSubstr("     6    0    1    1     1\n"));  // rank tp dp pp node
}

// ---------------------------------------------------------------------------------------------
// Launch environments.

using Vars = std::map<std::string, std::string>;

EnvLookup lookup(const Vars& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// BR-20: sbatch -N2 --ntasks-per-node=4, srun starting one process per GPU.
Vars slurm_vars(int procid) {
  return {{"SLURM_PROCID", std::to_string(procid)}, {"SLURM_LOCALID", std::to_string(procid % 4)},
          {"SLURM_NODEID", std::to_string(procid / 4)}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_JOB_NODELIST", "gpu[01-02]"}, {"SLURM_JOB_ID", "123456"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}};
}

std::string launch_error(const Vars& vars, const std::string& hostname) {
  try {
    detect_launch_env(lookup(vars), hostname);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnv, SlurmTwoNodesFourTasksEach) {
  for (int procid = 0; procid < 8; ++procid) {
    const LaunchEnv e = detect_launch_env(lookup(slurm_vars(procid)), procid < 4 ? "gpu01" : "gpu02");
    EXPECT_EQ(e.source, "slurm");
    EXPECT_EQ(e.rank, procid);
    EXPECT_EQ(e.world_size, 8);
    EXPECT_EQ(e.local_rank, procid % 4);
    EXPECT_EQ(e.local_world_size, 4);
    EXPECT_EQ(e.node_rank, procid / 4);
    EXPECT_EQ(e.num_nodes, 2);
    EXPECT_EQ(e.master_addr, "gpu01");
    EXPECT_EQ(e.master_port, 23456);  // 20000 + 123456 % 40000, identical on every rank
    EXPECT_EQ(e.job_id, "123456");
    EXPECT_THAT(e.hosts, ElementsAre("gpu01", "gpu02"));
  }
}

TEST(LaunchEnv, SlurmVariants) {
  Vars v = slurm_vars(5);
  v["MASTER_PORT"] = "31000";
  EXPECT_EQ(detect_launch_env(lookup(v), "gpu02").master_port, 31000);
  v = slurm_vars(0);  // --ntasks-per-node and SLURM_NNODES instead
  v.erase("SLURM_TASKS_PER_NODE");
  v.erase("SLURM_JOB_NUM_NODES");
  v["SLURM_NTASKS_PER_NODE"] = "4";
  v["SLURM_NNODES"] = "2";
  EXPECT_EQ(detect_launch_env(lookup(v), "gpu01.cluster.local").local_world_size, 4);  // FQDN accepted
  v = slurm_vars(5);  // uneven nodes: 4 + 2 tasks
  v["SLURM_NTASKS"] = "6";
  v["SLURM_TASKS_PER_NODE"] = "4,2";
  EXPECT_EQ(detect_launch_env(lookup(v), "gpu02").local_world_size, 2);
}

TEST(LaunchEnv, SlurmInconsistentNtasksListsTheVariables) {
  Vars v = slurm_vars(3);
  v["SLURM_NTASKS"] = "6";
  const std::string msg = launch_error(v, "gpu01");
  EXPECT_THAT(msg, HasSubstr("SLURM_NTASKS 6 != nodes x tasks-per-node = 2 x 4 = 8"));
  for (const char* var : {"SLURM_PROCID=3", "SLURM_LOCALID=3", "SLURM_NODEID=0", "SLURM_NTASKS=6",
                          "SLURM_JOB_NODELIST=gpu[01-02]", "SLURM_JOB_ID=123456", "SLURM_TASKS_PER_NODE=4(x2)"}) {
    EXPECT_THAT(msg, HasSubstr(var));
  }
}

TEST(LaunchEnv, SlurmRankZeroMustRunOnTheFirstNode) {
  const std::string msg = launch_error(slurm_vars(0), "gpu02");
  EXPECT_THAT(msg, HasSubstr("rank 0 runs on host 'gpu02'"));
  EXPECT_THAT(msg, HasSubstr("'gpu01'"));
  Vars v = slurm_vars(0);
  v["SLURM_NODEID"] = "1";
  EXPECT_THAT(launch_error(v, ""), HasSubstr("rank 0 runs on node 1"));
}

TEST(LaunchEnv, SlurmOtherBrokenRules) {
  Vars v = slurm_vars(2);
  v["SLURM_JOB_NUM_NODES"] = "3";
  EXPECT_THAT(launch_error(v, "gpu01"), HasSubstr("expands to 2 host(s) but the number of nodes is 3"));
  v = slurm_vars(2);
  v["SLURM_LOCALID"] = "4";
  EXPECT_THAT(launch_error(v, "gpu01"), HasSubstr("local rank 4 must be in [0, tasks per node 4)"));
  v = slurm_vars(2);
  v["SLURM_PROCID"] = "8";
  EXPECT_THAT(launch_error(v, "gpu01"), HasSubstr("rank 8 must be in [0, world size 8)"));
  v = slurm_vars(2);
  v["SLURM_PROCID"] = "two";
  EXPECT_THAT(launch_error(v, "gpu01"), HasSubstr("SLURM_PROCID='two' is not an integer"));
  v = slurm_vars(2);
  v.erase("SLURM_JOB_ID");
  EXPECT_THAT(launch_error(v, "gpu01"), HasSubstr("SLURM_JOB_ID is not set"));
}

TEST(LaunchEnv, GlooSocketIfnameNamesTheInterfaceUnderEveryLauncherAndTheConfigWins) {
  Vars v = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}};
  EXPECT_EQ(detect_launch_env(lookup(v), "").interface, "");
  v["GLOO_SOCKET_IFNAME"] = "ib0";
  LaunchEnv e = detect_launch_env(lookup(v), "");
  EXPECT_EQ(e.interface, "ib0");
  EXPECT_EQ(e.interface_source, "GLOO_SOCKET_IFNAME");
  use_interface(e, "");  // parallel.interface unset: the environment's stands
  EXPECT_EQ(e.interface, "ib0");
  use_interface(e, "eth1");
  EXPECT_EQ(e.interface, "eth1");
  EXPECT_EQ(e.interface_source, "parallel.interface");
  Vars slurm = slurm_vars(4);
  slurm["GLOO_SOCKET_IFNAME"] = "e0";
  EXPECT_EQ(detect_launch_env(lookup(slurm), "gpu02").interface, "e0");
  EXPECT_EQ(detect_launch_env(lookup({{"GLOO_SOCKET_IFNAME", "e0"}}), "").interface, "e0");  // one rank
  EXPECT_EQ(detect_launch_env(lookup({{"GLOO_SOCKET_IFNAME", "ib0,eth0"}}), "").interface, "ib0");  // a list
}

TEST(LaunchEnv, Torchrun) {
  Vars v = {{"RANK", "5"},        {"WORLD_SIZE", "8"},      {"LOCAL_RANK", "1"},        {"LOCAL_WORLD_SIZE", "4"},
            {"GROUP_RANK", "1"},  {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}, {"SLURM_PROCID", "0"}};
  const LaunchEnv e = detect_launch_env(lookup(v), "node1");  // torchrun under srun: torchrun wins
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.num_nodes, 2);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29400);
  v["GROUP_RANK"] = "0";
  EXPECT_THAT(launch_error(v, ""), HasSubstr("RANK 5 is not GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK"));
  v["GROUP_RANK"] = "1";
  v.erase("MASTER_ADDR");
  const std::string msg = launch_error(v, "");
  EXPECT_THAT(msg, HasSubstr("MASTER_ADDR is not set"));
  EXPECT_THAT(msg, HasSubstr("RANK=5"));
}

TEST(LaunchEnv, LocalLauncherWinsAndSingleIsTheFallback) {
  const Vars v = {{"OPTCC_RANK", "2"},  {"OPTCC_WORLD_SIZE", "4"},    {"OPTCC_LOCAL_RANK", "2"},
                  {"OPTCC_LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "40000"},
                  {"RANK", "7"},        {"WORLD_SIZE", "9"}};
  const LaunchEnv e = detect_launch_env(lookup(v), "host");
  EXPECT_EQ(e.source, "local");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.num_nodes, 1);
  EXPECT_EQ(e.master_port, 40000);
  EXPECT_THAT(launch_error({{"OPTCC_RANK", "4"}, {"OPTCC_WORLD_SIZE", "4"}}, ""),
              HasSubstr("rank 4 must be in [0, world size 4)"));
  const LaunchEnv s = detect_launch_env(lookup({}), "host");
  EXPECT_EQ(s.source, "single");
  EXPECT_EQ(s.rank, 0);
  EXPECT_EQ(s.world_size, 1);
  EXPECT_EQ(s.local_world_size, 1);
  EXPECT_EQ(s.num_nodes, 1);
}

TEST(LaunchEnv, ExpandNodelist) {
  EXPECT_THAT(expand_slurm_nodelist("gpu[01-02,05],cpu3"), ElementsAre("gpu01", "gpu02", "gpu05", "cpu3"));
  EXPECT_THAT(expand_slurm_nodelist("n[08-10]"), ElementsAre("n08", "n09", "n10"));
  EXPECT_THAT(expand_slurm_nodelist("n[8-10]"), ElementsAre("n8", "n9", "n10"));
  EXPECT_THAT(expand_slurm_nodelist("node7"), ElementsAre("node7"));
  EXPECT_THAT(expand_slurm_nodelist("r[1-2]n[1-2]"), ElementsAre("r1n1", "r1n2", "r2n1", "r2n2"));
  EXPECT_THAT(expand_slurm_nodelist("a[3],b-x[0-1].ib"), ElementsAre("a3", "b-x0.ib", "b-x1.ib"));
  EXPECT_TRUE(expand_slurm_nodelist("").empty());
  for (const char* bad : {"gpu[01-02", "gpu01]", "gpu[2-1]", "gpu[a-b]", "gpu[]"}) {
    EXPECT_THROW(expand_slurm_nodelist(bad), std::runtime_error) << bad;
  }
}

TEST(LaunchEnv, ExpandTasksPerNode) {
  EXPECT_THAT(expand_slurm_tasks_per_node("4(x2)"), ElementsAre(4, 4));
  EXPECT_THAT(expand_slurm_tasks_per_node("4(x2),3"), ElementsAre(4, 4, 3));
  EXPECT_THAT(expand_slurm_tasks_per_node("8"), ElementsAre(8));
  for (const char* bad : {"", "4(2)", "x", "4(x)"}) {
    EXPECT_THROW(expand_slurm_tasks_per_node(bad), std::runtime_error) << bad;
  }
}

TEST(LaunchEnv, PortFromJobId) {
  EXPECT_EQ(port_from_job_id("123456"), 23456);
  EXPECT_NE(port_from_job_id("123456"), port_from_job_id("123457"));
  for (const char* id : {"0", "39999", "123456_7", "torchelastic-run", "99999999999999999999999"}) {
    const int p = port_from_job_id(id);
    EXPECT_EQ(p, port_from_job_id(id));
    EXPECT_GE(p, 20000);
    EXPECT_LT(p, 60000);
  }
  EXPECT_THROW(port_from_job_id(""), std::runtime_error);
}

}  // namespace
}  // namespace optcc

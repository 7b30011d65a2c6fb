// The `network:` section (config.h, config_network.cpp) and its set-up on a rank
// (network_setup.h): profile override order, validation messages, and that emulation off builds
// nothing while emulation on attaches one emulator to every group.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <H5Cpp.h>

#include "harness/config/config.h"
#include "harness/records/results_reader.h"
#include "harness/train/network_setup.h"
#include "harness/train/trainer.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/paths.h"
#include "tests/support/small_training.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

Config load(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  testing::TempDir dir;
  const std::string path = dir / "exp.yaml";
  std::ofstream(path) << yaml;
  return load_config(path, sets);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(NetworkConfig, ProfileFillsLinksAndExplicitKeysWinInAnyOrder) {
  const Config p = load("network:\n  profile: paper-a100-ib200\n");
  EXPECT_DOUBLE_EQ(p.network.inter_node_gbps, 25.0);  // 200 Gb/s per node
  EXPECT_DOUBLE_EQ(p.network.intra_node_gbps, 300.0);
  EXPECT_DOUBLE_EQ(p.network.inter_node_latency_us, 9.6);
  const Config before = load("network:\n  inter_node_gbps: 1.5\n  profile: paper-a100-ib200\n");
  const Config after = load("network:\n  profile: paper-a100-ib200\n  inter_node_gbps: 1.5\n");
  for (const Config* c : {&before, &after}) {
    EXPECT_DOUBLE_EQ(c->network.inter_node_gbps, 1.5);   // explicit key wins
    EXPECT_DOUBLE_EQ(c->network.intra_node_gbps, 300.0);  // the rest from the profile
  }
  // --set after the file, either way round.
  EXPECT_DOUBLE_EQ(load("network:\n  inter_node_gbps: 2\n", {"network.profile=paper-a100-ib200"}).network.inter_node_gbps, 2.0);
  EXPECT_DOUBLE_EQ(load("network:\n  profile: paper-a100-ib200\n", {"network.inter_node_gbps=3"}).network.inter_node_gbps, 3.0);
  // An empty profile resets what the profile filled, never an explicit key.
  const Config reset = load("network:\n  profile: paper-a100-ib200\n  intra_node_gbps: 100\n", {"network.profile="});
  EXPECT_DOUBLE_EQ(reset.network.inter_node_gbps, 0.0);
  EXPECT_DOUBLE_EQ(reset.network.intra_node_gbps, 100.0);
}

TEST(NetworkConfig, EffectiveYamlRoundTripsWithAProfile) {
  const Config c = load("network:\n  emulate: true\n  profile: paper-a100-ib200\n  scale: 20\n  skip: [dp]\n");
  testing::TempDir dir;
  std::ofstream(dir / "effective.yaml") << to_yaml(c);
  const Config again = load_config(dir / "effective.yaml");
  EXPECT_EQ(to_yaml(again), to_yaml(c));
  EXPECT_DOUBLE_EQ(again.network.scale, 20.0);
  EXPECT_EQ(again.network.skip, std::vector<std::string>{"dp"});
}

TEST(NetworkConfig, RulesNameKeyValueRuleAndFix) {
  // emulate without bandwidths (and no profile) stays an error.
  EXPECT_THAT(error_of([] { load("network:\n  emulate: true\n").validate(); }),
              AllOf(HasSubstr("network.emulate = true"), HasSubstr("intra_node_gbps and inter_node_gbps > 0"),
                    HasSubstr("paper-a100-ib200"), HasSubstr("Fix:")));
  EXPECT_EQ(error_of([] { load("network:\n  emulate: true\n  profile: paper-a100-ib200\n").validate(); }), "");
  EXPECT_THAT(error_of([] { load("network:\n  emulate: true\n  inter_node_gbps: 1\n").validate(); }),
              HasSubstr("have 0 and 1"));
  EXPECT_THAT(error_of([] { load("network:\n  profile: dgx-h100\n"); }),
              AllOf(HasSubstr("'dgx-h100' is not a known profile"), HasSubstr("paper-a100-ib200")));
  EXPECT_THAT(error_of([] { load("network:\n  scale: 0\n").validate(); }),
              AllOf(HasSubstr("network.scale = 0"), HasSubstr("must be > 0")));
  EXPECT_THAT(error_of([] { load("network:\n  scale: -2\n").validate(); }), HasSubstr("network.scale = -2"));
  EXPECT_THAT(error_of([] { load("network:\n  skip: [pp_bwd, pp_backward]\n").validate(); }),
              AllOf(HasSubstr("network.skip[1] = 'pp_backward'"), HasSubstr("tp, pp_fwd, pp_bwd, dp, embedding")));
  EXPECT_THAT(error_of([] { load("network:\n  skip: [dp, dp]\n").validate(); }), HasSubstr("lists 'dp' twice"));
  EXPECT_THAT(error_of([] { load("network:\n  skip: [control]\n").validate(); }), HasSubstr("'control'"));
  EXPECT_THAT(error_of([] { load("network:\n  inter_node_latency_us: -1\n").validate(); }), HasSubstr("must be >= 0"));
  EXPECT_THAT(error_of([] { load("log:\n  timeline_steps: [0]\n").validate(); }),
              AllOf(HasSubstr("log.timeline_steps = 0"), HasSubstr("1..train.train_steps = 100")));
  EXPECT_THAT(error_of([] { load("log:\n  timeline_steps: [101]\n").validate(); }), HasSubstr("= 101"));
  EXPECT_EQ(error_of([] { load("log:\n  timeline_steps: [5, 6]\n").validate(); }), "");
}

TEST(NetworkConfig, MatchRegimeNeedsEmulationAProfileAndNoScaleOfItsOwn) {
  const std::string paper = std::string(optcc::testing::source_dir()) + "/experiments/paper/gpt-2.5b.yaml";
  const std::string on = "network:\n  emulate: true\n  profile: paper-a100-ib200\n  match_regime: " + paper + "\n";
  EXPECT_EQ(error_of([&] { load(on).validate(); }), "");
  EXPECT_THAT(error_of([&] { load(on, {"network.emulate=false"}).validate(); }),
              AllOf(HasSubstr("network.match_regime = '" + paper + "'"), HasSubstr("network.emulate is false"),
                    HasSubstr("Fix:")));
  // Links declared by hand (no profile): nothing names the cluster whose regime is matched.
  EXPECT_THAT(error_of([&] {
                load(on, {"network.profile=", "network.intra_node_gbps=1", "network.inter_node_gbps=1"}).validate();
              }),
              AllOf(HasSubstr("needs network.profile"), HasSubstr("paper-a100-ib200")));
  for (const char* key : {"scale=290", "inter_node_latency_us=0.03", "intra_node_latency_us=0.01"}) {
    const std::string name = std::string(key).substr(0, std::string(key).find('='));
    EXPECT_THAT(error_of([&] { load(on, {std::string("network.") + key}).validate(); }),
                AllOf(HasSubstr("derives network." + name), HasSubstr("remove network." + name))) << key;
  }
  EXPECT_THAT(error_of([&] { load(on, {"network.match_regime=experiments/paper/no-such.yaml"}).validate(); }),
              AllOf(HasSubstr("'experiments/paper/no-such.yaml'"), HasSubstr("is not a file")));
  // Off (""), a scale of one's own is fine; the effective YAML round-trips the key.
  EXPECT_EQ(error_of([&] { load(on, {"network.match_regime=", "network.scale=290"}).validate(); }), "");
  testing::TempDir dir;
  std::ofstream(dir / "effective.yaml") << to_yaml(load(on));
  EXPECT_EQ(load_config(dir / "effective.yaml").network.match_regime, paper);
}

// network.match_regime: from:<results file> reuses the links a run derived (its recorded scale and
// latencies, same profile), measuring nothing; a file without a derived regime, a missing file and
// another profile are refused naming the key.
TEST(NetworkRegime, FromAResultsFileReusesItsDerivedLinks) {
  testing::TempDir dir;
  testing::write_synthetic_corpus(dir / "corpus", 64, 200);
  Config first = testing::small_training_config(dir, {1, 1, 1}, "first");
  first.train.train_steps = 2;
  for (const char* kv : {"network.emulate=true", "network.profile=paper-a100-ib200", "network.scale=37.5",
                         "network.inter_node_latency_us=0.256", "network.intra_node_latency_us=0.0907"}) {
    apply_override(first, kv);
  }
  const std::string file = testing::train_small(first, {1, 1, 1}).results;
  Config second = testing::small_training_config(dir, {1, 1, 1}, "second");
  second.train.train_steps = 2;
  for (const std::string& kv : {std::string("network.emulate=true"), std::string("network.profile=paper-a100-ib200"),
                                "network.match_regime=from:" + file}) {
    apply_override(second, kv);
  }
  EXPECT_EQ(error_of([&] { second.validate(); }), "");
  // `first` set its links by hand: no derived regime to reuse.
  std::string refused;
  try {
    testing::train_small(second, {1, 1, 1});
  } catch (const std::exception& e) {
    refused = e.what();
  }
  EXPECT_THAT(refused, AllOf(HasSubstr("network.match_regime = 'from:" + file + "'"),
                             HasSubstr("records no derived regime"), HasSubstr("Fix:")));
  {  // as a run that derived them records it (trainer.cpp: root attribute network_regime)
    H5::H5File f(file, H5F_ACC_RDWR);
    const H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
    f.createAttribute("network_regime", type, H5::DataSpace(H5S_SCALAR))
        .write(type, std::string("scale 37.5 from experiments/paper/gpt-2.5b.yaml on paper-a100-ib200"));
  }
  second.log.run_name = "second-ok";
  const std::string reused = testing::train_small(second, {1, 1, 1}).results;
  EXPECT_THAT(read_root_attribute(reused, "network_regime"),
              AllOf(HasSubstr("scale 37.5 from experiments/paper/gpt-2.5b.yaml"), HasSubstr("(reused from " + file)));
  const YAML::Node net = YAML::Load(read_root_attribute(reused, "config"))["network"];
  EXPECT_EQ(net["scale"].as<double>(), 37.5);
  EXPECT_EQ(net["inter_node_latency_us"].as<double>(), 0.256);
  EXPECT_EQ(net["intra_node_latency_us"].as<double>(), 0.0907);
  EXPECT_EQ(net["match_regime"].as<std::string>(), "");
  // A missing file is refused at load; another profile at the start.
  EXPECT_THAT(error_of([&] {
                load("network:\n  emulate: true\n  profile: paper-a100-ib200\n  match_regime: from:no-such.h5\n")
                    .validate();
              }),
              AllOf(HasSubstr("'from:no-such.h5'"), HasSubstr("names no file after from:")));
  {  // as if `first` had run on another cluster's profile
    H5::H5File f(file, H5F_ACC_RDWR);
    std::string config;
    H5::Attribute a = f.openAttribute("config");
    a.read(a.getStrType(), config);
    a.close();
    f.removeAttr("config");
    const std::string from = "profile: \"paper-a100-ib200\"", to = "profile: \"another-cluster\"";
    ASSERT_NE(config.find(from), std::string::npos) << config;
    config.replace(config.find(from), from.size(), to);
    const H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
    f.createAttribute("config", type, H5::DataSpace(H5S_SCALAR)).write(type, config);
  }
  Config other = second;
  other.log.run_name = "other";
  refused.clear();
  try {
    testing::train_small(other, {1, 1, 1});
  } catch (const std::exception& e) {
    refused = e.what();
  }
  EXPECT_THAT(refused, HasSubstr("derived its scale for network.profile 'another-cluster', and this run's profile is "
                                 "'paper-a100-ib200'"));
}

TEST(NetworkConfig, LinkParamsInSiUnits) {
  const Config c = load("network:\n  profile: paper-a100-ib200\n  scale: 4\n  skip: [pp_bwd, embedding]\n");
  const LinkParams p = link_params(c.network);
  EXPECT_DOUBLE_EQ(p.inter_bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(p.intra_latency_s, 3.4e-6);
  EXPECT_DOUBLE_EQ(p.scale, 4.0);
  EXPECT_TRUE(p.skip[static_cast<int>(Traffic::kPipelineBackward)]);
  EXPECT_TRUE(p.skip[static_cast<int>(Traffic::kEmbedding)]);
  EXPECT_FALSE(p.skip[static_cast<int>(Traffic::kDataParallel)]);
  EXPECT_THAT(network_summary(c.network), AllOf(HasSubstr("profile=paper-a100-ib200"), HasSubstr("inter_node_gbps=25"),
                                                HasSubstr("skip=[pp_bwd, embedding]")));
}

std::vector<std::string> nic_segments_of_this_process() {
  std::vector<std::string> out;
  const std::string mine = nic_segment_name("");  // "/optcc-nic-<uid>-<pid>-"
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (("/" + e.path().filename().string()).rfind(mine, 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

TEST(NetworkSetup, OffBuildsNothingAndTouchesNoSharedMemory) {
  const int64_t emulators = LinkEmulator::instances_created(), tables = NicTable::instances_created();
  Config cfg;  // emulate false, skip empty; links declared but not enforced
  cfg.network.inter_node_gbps = 0.1;
  cfg.network.intra_node_gbps = 1.0;
  testing::run_layout({2, 2, 1}, [&](int, Distributed& d) {
    setup_network(d, cfg);
    EXPECT_EQ(d.network, nullptr);
    for (auto* c : {d.world.get(), d.tp.get(), d.dp.get(), d.pp.get(), d.model_parallel.get()}) {
      ASSERT_NE(c, nullptr);
      EXPECT_EQ(c->emulator(), nullptr) << c->name();  // the hot path's one branch sees null
    }
  });
  EXPECT_EQ(LinkEmulator::instances_created(), emulators);
  EXPECT_EQ(NicTable::instances_created(), tables);
  EXPECT_TRUE(nic_segments_of_this_process().empty());
}

TEST(NetworkSetup, OnAttachesOneEmulatorPerRankAndCleansUpTheSegment) {
  Config cfg;
  cfg.network.emulate = true;
  apply_network_profile(cfg.network, "paper-a100-ib200");
  cfg.parallel.ranks_per_node = 2;
  const int64_t tables = NicTable::instances_created();
  testing::run_layout({2, 2, 1}, [&](int, Distributed& d) {
    d.layout = RankLayout({2, 2, 1}, 2);  // two nodes of two ranks (run_layout puts all on one)
    setup_network(d, cfg);
    ASSERT_NE(d.network, nullptr);
    EXPECT_TRUE(d.network->emulates(Traffic::kPipelineForward));
    EXPECT_FALSE(d.network->emulates(Traffic::kControl));
    for (auto* c : {d.world.get(), d.tp.get(), d.dp.get(), d.pp.get()}) EXPECT_EQ(c->emulator(), d.network.get());
    setup_network(d, Config{});  // and off again: detached
    EXPECT_EQ(d.network, nullptr);
    EXPECT_EQ(d.pp->emulator(), nullptr);
  });
  EXPECT_EQ(NicTable::instances_created(), tables + 4);  // one mapping per rank
  EXPECT_TRUE(nic_segments_of_this_process().empty());  // rank 0 unlinked it once all had mapped it
}

TEST(NetworkSetup, RefusesEmulationAcrossHosts) {
  Config cfg;
  cfg.network.emulate = true;
  apply_network_profile(cfg.network, "paper-a100-ib200");
  testing::run_layout({1, 2, 1}, [&](int rank, Distributed& d) {
    d.hosts = {"node-a", "node-b"};  // as a two-node Slurm job reports them
    d.addresses = {"198.18.0.1", "198.18.0.2"};
    EXPECT_THAT(error_of([&] { setup_network(d, cfg); }),
                AllOf(HasSubstr("network.emulate = true"),
                      HasSubstr("2 hosts (node-a (198.18.0.1), node-b (198.18.0.2))"), HasSubstr("Fix:")));
    d.hosts = {"node", "node"};  // two hosts that share a hostname are still two hosts
    EXPECT_THAT(error_of([&] { setup_network(d, cfg); }), HasSubstr("2 hosts (node (198.18.0.1), node (198.18.0.2))"));
    EXPECT_EQ(d.network, nullptr);
  });
}

}  // namespace
}  // namespace optcc

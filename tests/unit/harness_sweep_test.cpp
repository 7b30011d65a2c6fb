// Experiment files and their expansion (harness/experiments/experiment_file.h, sweep.h): the exact run
// list of a small grid, the index/JSON/listing agreement, every error of the format with the key,
// the value and the fix, the per-run config check, and every experiments/**/*.yaml at both scales.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "compat/torch_compat.h"
#include "harness/experiments/sweep.h"
#include "tests/support/paths.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc {
namespace {
namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const char* kHeader =
    "# Question: does it work?\n"
    "# Paper's claim: it does.\n"
    "# Expected: it does,\n"
    "#   mostly.\n";

// A repository root in a temporary directory with one base config (tiny preset, 2 ranks by dp).
class SweepTest : public ::testing::Test {
 protected:
  SweepTest() {
    fs::create_directories(root_ / "experiments");
    write("experiments/base.yaml", "model: {preset: tiny, vocab_size: 64}\nparallel: {dp: 2}\n"
                                   "train: {micro_batch_size: 2, global_batch_size: 8}\n");
  }
  void write(const std::string& rel, const std::string& text) { std::ofstream(root_ / rel) << text; }
  // An experiment file from `body` (everything after the header), loaded from the temporary root.
  Experiment load(const std::string& body, const std::string& header = kHeader) {
    write("experiments/exp.yaml", header + body);
    return load_experiment(root_ / "experiments/exp.yaml", root_.str());
  }
  std::string error_of(const std::string& body, const std::string& header = kHeader) {
    try {
      load(body, header);
    } catch (const ExperimentError& e) {
      return e.what();
    }
    return "(no error)";
  }
  testing::TempDir root_;
};

// Both scales; the paper scale replaces the seed axis by one seed.
const std::string kPlainScales =
    "scales:\n"
    "  cpu:\n"
    "    base: experiments/base.yaml\n"
    "    set: [train.train_steps=5]\n"
    "    slurm: {nodes: 1, tasks_per_node: 2, gpus_per_node: 0, cpus_per_task: 1, time: \"00:10:00\"}\n"
    "  paper:\n"
    "    base: experiments/base.yaml\n"
    "    slurm: {nodes: 2, tasks_per_node: 1, gpus_per_node: 8, gpus_per_task: 8, cpus_per_task: 4, time: \"48:00:00\",\n"
    "            array_limit: 3, exclusive: true}\n";
const std::string kScales = kPlainScales +
    "    grid:\n"
    "      - {name: seed, key: train.seed, values: [7]}\n";

const std::string kGrid =
    "grid:\n"
    "  - name: scheme\n"
    "    variants:\n"
    "      baseline: [compression.scheme=baseline]\n"
    "      cb: [compression.scheme=cb, \"compression.dp={name: powersgd, rank: 4}\"]\n"
    "  - {name: seed, key: train.seed, values: [1, 2]}\n";

TEST_F(SweepTest, ExpandsTheCartesianProductFirstAxisOutermost) {
  const Experiment e = load("experiment: {name: demo, feeds: [table2]}\n" + kScales + kGrid);
  EXPECT_EQ(e.name, "demo");
  EXPECT_EQ(e.question, "does it work?");
  EXPECT_EQ(e.expected, "it does, mostly.");
  const SweepPlan p = expand_experiment(e, "cpu");
  ASSERT_EQ(p.runs.size(), 4u);
  std::vector<std::string> names;
  for (const auto& r : p.runs) names.push_back(r.run);
  EXPECT_THAT(names, ElementsAre("baseline-seed1", "baseline-seed2", "cb-seed1", "cb-seed2"));
  const SweepRun& r = p.runs[3];
  EXPECT_EQ(r.index, 3);
  EXPECT_THAT(r.overrides, ElementsAre("compression.scheme=cb", "compression.dp={name: powersgd, rank: 4}", "train.seed=2"));
  EXPECT_EQ(r.results, "results/demo/cb-seed2.h5");
  EXPECT_EQ(r.checkpoint_dir, "results/demo/ckpt/cb-seed2");
  EXPECT_EQ(r.world_size, 2);
  EXPECT_THAT(r.args, ElementsAre("train", "--config", "experiments/base.yaml", "--set", "train.train_steps=5",
                                  "--set", "compression.scheme=cb", "--set", "compression.dp={name: powersgd, rank: 4}",
                                  "--set", "train.seed=2", "--set", "log.dir=results/demo", "--set",
                                  "log.run_name=cb-seed2", "--set", "checkpoint.dir=results/demo/ckpt/cb-seed2"));
  EXPECT_EQ(r.axes, (std::vector<std::pair<std::string, std::string>>{{"scheme", "cb"}, {"seed", "seed2"}}));
}

TEST_F(SweepTest, AScaleGridReplacesTheAxisOfThatNameInPlace) {
  const SweepPlan p = expand_experiment(load("experiment:\n" + kScales + kGrid), "paper");
  ASSERT_EQ(p.runs.size(), 2u);
  EXPECT_EQ(p.experiment, "exp");  // the file stem
  EXPECT_EQ(p.runs[0].run, "baseline-seed7");
  EXPECT_EQ(p.runs[1].run, "cb-seed7");
  EXPECT_EQ(p.runs[1].world_size, 2);
  EXPECT_EQ(p.slurm.gpus_per_node, 8);
  EXPECT_EQ(p.slurm.time, "48:00:00");
  EXPECT_THAT(p.runs[1].args, ElementsAre("train", "--config", "experiments/base.yaml", "--set", "compression.scheme=cb",
                                          "--set", "compression.dp={name: powersgd, rank: 4}", "--set", "train.seed=7",
                                          "--set", "log.dir=results/exp", "--set", "log.run_name=cb-seed7", "--set",
                                          "checkpoint.dir=results/exp/ckpt/cb-seed7"));
}

TEST_F(SweepTest, ListingJsonAndIndexAgree) {
  load("experiment: {name: demo}\n" + kScales + kGrid);
  SweepOptions o;
  o.file = root_ / "experiments/exp.yaml";
  o.scale = "cpu";
  o.root = root_.str();
  ::testing::internal::CaptureStdout();
  ASSERT_EQ(run_sweep_command(o), 0);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(),
            "0\tbaseline-seed1\tcompression.scheme=baseline train.seed=1\n"
            "1\tbaseline-seed2\tcompression.scheme=baseline train.seed=2\n"
            "2\tcb-seed1\tcompression.scheme=cb 'compression.dp={name: powersgd, rank: 4}' train.seed=1\n"
            "3\tcb-seed2\tcompression.scheme=cb 'compression.dp={name: powersgd, rank: 4}' train.seed=2\n");
  o.json = true;
  ::testing::internal::CaptureStdout();
  ASSERT_EQ(run_sweep_command(o), 0);
  const auto j = nlohmann::json::parse(::testing::internal::GetCapturedStdout());
  EXPECT_EQ(j["experiment"], "demo");
  EXPECT_EQ(j["scale"], "cpu");
  EXPECT_EQ(j["kind"], "train");
  EXPECT_EQ(j["results_dir"], "results/demo");
  EXPECT_EQ(j["slurm"], nlohmann::json::parse(R"({"nodes": 1, "tasks_per_node": 2, "gpus_per_node": 0,
                                                   "cpus_per_task": 1, "time": "00:10:00", "array_limit": null,
                                                   "mem": null, "exclusive": false, "gpus_per_task": 0, "stop_signal_seconds": 300})"));
  EXPECT_EQ(j["needs_gpus"], false);
  EXPECT_TRUE(j["gpus"].is_null());
  EXPECT_EQ(j["build"], (nlohmann::json{{"cuda", kBuiltWithCuda}, {"description", build_description()}}));
  ASSERT_EQ(j["runs"].size(), 4u);
  o.json = false;
  for (int64_t i = 0; i < 4; ++i) {
    const auto& run = j["runs"][static_cast<size_t>(i)];
    EXPECT_EQ(run["index"], i);
    EXPECT_EQ(run["results"], "results/demo/" + run["run"].get<std::string>() + ".h5");
    o.index = i;
    ::testing::internal::CaptureStdout();
    ASSERT_EQ(run_sweep_command(o), 0);
    std::istringstream lines(::testing::internal::GetCapturedStdout());
    std::vector<std::string> args;
    for (std::string line; std::getline(lines, line);) args.push_back(line);
    EXPECT_EQ(args, run["args"].get<std::vector<std::string>>()) << "run " << i;
  }
}

TEST_F(SweepTest, AnIndexOutOfRangeIsRefused) {
  load("experiment:\n" + kScales + kGrid);
  SweepOptions o;
  o.file = root_ / "experiments/exp.yaml";
  o.scale = "cpu";
  o.root = root_.str();
  for (int64_t bad : {int64_t{4}, int64_t{-1}}) {
    o.index = bad;
    try {
      run_sweep_command(o);
      ADD_FAILURE() << "--index " << bad << " of 4 runs accepted";
    } catch (const ExperimentError& e) {
      EXPECT_THAT(e.what(), HasSubstr("--index " + std::to_string(bad) + ": the cpu scale has 4 runs, 0..3"));
    }
  }
}

// A key written twice in an experiment file is refused with its path and both lines.
TEST_F(SweepTest, RepeatedKeyIsRefusedNamingBothLines) {
  const std::string body = "scales:\n  cpu:\n    base: experiments/base.yaml\n    base: experiments/other.yaml\n";
  const std::string msg = error_of(body);
  EXPECT_THAT(msg, HasSubstr("scales.cpu.base (lines"));
  EXPECT_THAT(msg, HasSubstr("written twice"));
}

TEST_F(SweepTest, BenchmarkRunsAreTheProgramsCommandLine) {
  const std::string body =
      "experiment: {kind: benchmark}\n"
      "scales:\n"
      "  cpu:\n"
      "    program: build/tests/bench/bench_compression\n"
      "    args: [--benchmark_min_time=0.1]\n"
      "    slurm: {nodes: 1, tasks_per_node: 1, gpus_per_node: 0, cpus_per_task: 1, time: \"00:20:00\"}\n"
      "  paper:\n"
      "    program: build/tests/bench/bench_compression\n"
      "    slurm: {nodes: 1, tasks_per_node: 1, gpus_per_node: 1, gpus_per_task: 1, cpus_per_task: 8, time: \"01:00:00\",\n"
      "            array_limit: 1, mem: 64G}\n"
      "grid:\n"
      "  - name: part\n"
      "    variants: {codecs: [--benchmark_filter=codec/lowrank/.*/fig14], reducers: [--benchmark_filter=reducer/]}\n"
      "  - {name: reps, key: --benchmark_repetitions, label: x, values: [3]}\n";
  const SweepPlan p = expand_experiment(load(body), "cpu");
  ASSERT_EQ(p.runs.size(), 2u);
  EXPECT_EQ(p.kind, "benchmark");
  EXPECT_EQ(p.runs[1].run, "reducers-x3");
  EXPECT_EQ(p.runs[1].results, "results/exp/reducers-x3.json");
  EXPECT_EQ(p.runs[1].checkpoint_dir, "");
  EXPECT_THAT(p.runs[1].args, ElementsAre("build/tests/bench/bench_compression", "--benchmark_min_time=0.1",
                                          "--benchmark_filter=reducer/", "--benchmark_repetitions=3",
                                          "--benchmark_out=results/exp/reducers-x3.json", "--benchmark_out_format=json"));
  EXPECT_TRUE(check_sweep(p, root_.str()).problems.empty());
  std::string bad = body;
  bad.replace(bad.find("--benchmark_min_time=0.1"), 24, "--threads=2");
  EXPECT_THAT(error_of(bad), HasSubstr("scales.cpu.args[0] = '--threads=2': a benchmark run takes Google Benchmark "
                                       "options"));
  bad = body;
  bad.replace(bad.find("--benchmark_min_time=0.1"), 24, "--benchmark_out=a.json");
  EXPECT_THAT(error_of(bad), HasSubstr("the sweep sets --benchmark_out"));
  bad = body;
  bad.replace(bad.find("tasks_per_node: 1"), 17, "tasks_per_node: 2");
  EXPECT_THAT(error_of(bad), HasSubstr("a benchmark run is one process. Fix: set nodes: 1 and tasks_per_node: 1"));
}

// The optional slurm keys: what they parse to, and how --json carries them with the build's facts.
TEST_F(SweepTest, SlurmThrottleMemoryExclusiveAndGpusPerTask) {
  const Experiment e = load("experiment: {name: demo}\n" + kScales + kGrid);
  const SweepPlan cpu = expand_experiment(e, "cpu");
  EXPECT_FALSE(cpu.slurm.needs_gpus());
  EXPECT_EQ(cpu.slurm.array_limit, 0);
  EXPECT_EQ(cpu.slurm.mem, "");
  EXPECT_FALSE(cpu.slurm.exclusive);
  const SweepPlan paper = expand_experiment(e, "paper");
  EXPECT_TRUE(paper.slurm.needs_gpus());
  EXPECT_EQ(paper.slurm.array_limit, 3);
  EXPECT_TRUE(paper.slurm.exclusive);
  EXPECT_EQ(paper.slurm.gpus_per_task, 8);
  EXPECT_EQ(paper.slurm.gpu_text(), "2 nodes x 8 GPUs");
  const nlohmann::json j = sweep_json(paper);
  EXPECT_EQ(j["slurm"], nlohmann::json::parse(R"({"nodes": 2, "tasks_per_node": 1, "gpus_per_node": 8,
                                                   "cpus_per_task": 4, "time": "48:00:00", "array_limit": 3,
                                                   "mem": null, "exclusive": true, "gpus_per_task": 8, "stop_signal_seconds": 300})"));
  EXPECT_EQ(j["needs_gpus"], true);
  EXPECT_EQ(j["gpus"], "2 nodes x 8 GPUs");
  EXPECT_EQ(j["build"]["cuda"], kBuiltWithCuda);
  EXPECT_EQ(j["build"]["description"], build_description());
  // mem: a Slurm size; YAML's 0 and 480G are both scalars; exclusive may stay off when mem is given.
  for (const std::string mem : {"0", "480G", "\"512000\"", "2T"}) {
    std::string body = kScales;
    body.replace(body.find("exclusive: true"), 15, "mem: " + mem);
    const SweepPlan q = expand_experiment(load("experiment:\n" + body + kGrid), "paper");
    EXPECT_EQ(q.slurm.mem, mem[0] == '"' ? mem.substr(1, mem.size() - 2) : mem);
    EXPECT_FALSE(q.slurm.exclusive);
    EXPECT_EQ(sweep_json(q)["slurm"]["mem"], q.slurm.mem);
  }
}

// Each rule of the format: the message names the file, the key, the value and the fix.
class SweepErrorTest : public SweepTest {
 protected:
  void expect_error(const std::string& body, const std::string& fragment) {
    const std::string msg = error_of(body);
    EXPECT_THAT(msg, HasSubstr("experiment error (" + root_ / "experiments/exp.yaml" + ")")) << body;
    EXPECT_THAT(msg, HasSubstr(fragment)) << body;
    EXPECT_THAT(msg, HasSubstr("Fix: ")) << body;
  }
  const std::string exp_ = "experiment:\n";
};

TEST_F(SweepErrorTest, ExperimentAndScaleKeys) {
  const std::string& exp = exp_;
  const std::string& s = kScales;
  expect_error(exp + s + kGrid + "colour: blue\n", "colour = 'blue': unknown key (known here: experiment, scales, grid)");
  expect_error("experiment: {nmae: x}\n" + s + kGrid, "experiment.nmae = 'x': unknown key");
  expect_error("experiment: {kind: eval}\n" + s + kGrid, "experiment.kind = 'eval': must be train or benchmark");
  expect_error("experiment: {name: a/b}\n" + s + kGrid, "experiment.name = 'a/b'");
  expect_error("grid: []\n", "experiment: missing: this is not an experiment file");
  expect_error(exp + s.substr(0, s.find("  paper:")) + kGrid, "scales: lacks the scale `paper`");
  expect_error(exp + s + "  gpu: {}\n" + kGrid, "scales.gpu");
  expect_error(exp + std::string(s).replace(s.find("experiments/base.yaml"), 21, "experiments/nope.yaml") + kGrid,
               "scales.cpu.base = 'experiments/nope.yaml': no such config file under the repository root");
  expect_error(exp + std::string(s).replace(s.find("set: [train"), 4, "sett:") + kGrid, "scales.cpu.sett");
  expect_error(exp + std::string(s).replace(s.find("cpus_per_task: 1"), 16, "cpus: 1") + kGrid,
               "scales.cpu.slurm.cpus = '1': unknown key");
  expect_error(exp + std::string(s).replace(s.find("\"00:10:00\""), 10, "\"10 min\"") + kGrid,
               "scales.cpu.slurm.time = '10 min': must be a positive wall-clock limit HH:MM:SS");
  expect_error(exp + std::string(s).replace(s.find("nodes: 1"), 8, "nodes: 0") + kGrid,
               "scales.cpu.slurm.nodes = '0': must be >= 1");
  expect_error(exp + std::string(s).replace(s.find("train.train_steps=5"), 19, "train.train_step=5") + kGrid,
               "scales.cpu.set[0] = 'train.train_step=5': not a valid config override");
  expect_error(exp + std::string(s).replace(s.find("train.train_steps=5"), 19, "log.dir=elsewhere") + kGrid,
               "scales.cpu.set[0] = 'log.dir=elsewhere': log.dir, log.run_name and checkpoint.dir are set by the sweep");
  expect_error(exp + std::string(s).replace(s.find("name: seed, key"), 4, "nam") + kGrid, "scales.paper.grid[0].nam");
  expect_error(exp + std::string(s).replace(s.find("name: seed, key"), 10, "name: sed") + kGrid,
               "scales.paper.grid = axis 'sed': a scale's grid replaces top-level axes by name");
}

// The slurm block's optional keys and the rules of a scale that asks for GPUs.
TEST_F(SweepErrorTest, SlurmGpuRules) {
  const std::string& exp = exp_;
  const auto with = [](std::string from, const std::string& to) {
    std::string s = kScales;
    return s.replace(s.find(from), from.size(), to);
  };
  expect_error(exp + with("array_limit: 3", "array_limit: 0") + kGrid, "scales.paper.slurm.array_limit = '0': must be >= 1");
  expect_error(exp + with("array_limit: 3, ", "") + kGrid,
               "scales.paper.slurm.array_limit = (not set): a scale that asks for GPUs (2 nodes x 8 GPUs per task) "
               "must limit how many of its array tasks run at once");
  expect_error(exp + with("array_limit: 3, ", "") + kGrid, "Fix: add array_limit: N");
  expect_error(exp + with("exclusive: true", "exclusive: false") + kGrid,
               "scales.paper.slurm = mem and exclusive not set: a scale that asks for GPUs must say its memory per "
               "node (`mem`) or take whole nodes (`exclusive: true`)");
  expect_error(exp + with("exclusive: true", "exclusive: yes") + kGrid, "scales.paper.slurm.exclusive = 'yes': must be "
               "true or false");
  for (const std::string bad : {"480GB", "-1", "1.5G", "lots", "g"}) {
    expect_error(exp + with("exclusive: true", "mem: " + bad) + kGrid,
                 "scales.paper.slurm.mem = '" + bad + "': must be a Slurm memory size per node");
  }
  expect_error(exp + with("gpus_per_task: 8, ", "") + kGrid,
               "scales.paper.slurm.gpus_per_task = (not set): a scale that asks for GPUs (gpus_per_node 8, "
               "gpus_per_task 0) binds them per task");
  expect_error(exp + with("gpus_per_task: 8, ", "") + kGrid, "Fix: add gpus_per_task: 8 (= gpus_per_node 8 / "
               "tasks_per_node 1)");
  expect_error(exp + with("gpus_per_task: 8", "gpus_per_task: 4") + kGrid,
               "scales.paper.slurm = gpus_per_node 8, gpus_per_task 4, tasks_per_node 1: gpus_per_task * "
               "tasks_per_node = 4 must equal gpus_per_node");
  expect_error(exp + with("gpus_per_task: 8", "gpus_per_task: -1") + kGrid,
               "scales.paper.slurm.gpus_per_task = '-1': must be >= 0");
  // GPUs per task without GPUs per node (cpu scale: 2 tasks of 1 GPU = 2 GPUs a node).
  expect_error(exp + with("gpus_per_node: 0,", "gpus_per_node: 0, gpus_per_task: 1,") + kGrid,
               "scales.cpu.slurm = gpus_per_node 0, gpus_per_task 1, tasks_per_node 2: gpus_per_task * "
               "tasks_per_node = 2 must equal gpus_per_node");
  expect_error(exp + with("array_limit: 3", "throttle: 3") + kGrid,
               "scales.paper.slurm.throttle = '3': unknown key (known here: nodes, tasks_per_node, gpus_per_node, "
               "cpus_per_task, time, array_limit, mem, exclusive, gpus_per_task, stop_signal_seconds)");
  expect_error(exp + with("array_limit: 3", "array_limit: 3, stop_signal_seconds: 70000") + kGrid,
               "scales.paper.slurm.stop_signal_seconds = '70000': must be at most 65535");
  // Without GPUs the optional keys are optional; with them they are accepted as well.
  EXPECT_NO_THROW(load(exp + with("gpus_per_node: 0,", "gpus_per_node: 0, array_limit: 1, mem: 4G, exclusive: false,")
                       + kGrid));
}

TEST_F(SweepErrorTest, GridAxes) {
  const std::string head = exp_ + kScales;
  expect_error(head, "grid: missing");
  expect_error(head + "grid: []\n", "grid = []: must be a non-empty list of axes");
  expect_error(head + "grid:\n  - {name: seed, key: train.sed, values: [1]}\n",
               "grid[0].values[0] = 'train.sed=1': not a valid config override: config error (--set train.sed=1): "
               "unknown key 'train.sed' (did you mean 'seed'?)");
  expect_error(head + "grid:\n  - {name: seed, key: train.seed, values: [one]}\n", "'one' is not an integer");
  expect_error(head + "grid:\n  - {name: seed, key: train.seed, values: []}\n",
               "grid[0] = axis 'seed': is empty: it would expand to no run");
  expect_error(head + "grid:\n  - {name: scheme, variants: {}}\n", "is empty: it would expand to no run");
  expect_error(head + "grid:\n  - {name: seed, key: train.seed, values: [1, 1]}\n",
               "grid[0].values[1] = 'seed1': appears twice in axis 'seed'");
  // A variant name written twice is a repeated YAML key: refused with its path and line.
  expect_error(head + "grid:\n  - {name: s, variants: {a: [train.seed=1], a: [train.seed=2]}}\n",
               "grid[0].variants.a (lines 18 and 18): written twice");
  expect_error(head + "grid:\n  - {name: dp, key: compression.dp, values: [{name: topk}]}\n",
               "a values axis takes scalars");
  expect_error(head + "grid:\n  - {name: seed, key: train.seed, values: [-1], label: \"\"}\n",
               "grid[0].values[0] = '-1': a run-name part uses only");
  expect_error(head + "grid:\n  - {name: seed, key: train.seed, valeus: [1]}\n",
               "grid[0].valeus = [1]: unknown key (known here: name, key, values, label)");
  expect_error(head + "grid:\n  - {name: s, variants: {a: [train.seed=1]}, key: train.seed}\n",
               "grid[0].key = 'train.seed': unknown key (known here: name, variants)");
  expect_error(head + kGrid + "  - {name: seed, key: train.lr, values: [1]}\n", "axis 'seed': is defined twice");
}

TEST_F(SweepTest, TheHeaderMustStateQuestionClaimAndExpectation) {
  const std::string body = "experiment:\n" + kScales + kGrid;
  EXPECT_NO_THROW(load(body));
  EXPECT_THAT(error_of(body, "# Question: q?\n# Paper's claim: c.\n"), HasSubstr("lacks `# Expected:`"));
  EXPECT_THAT(error_of(body, "# Question: q?\n# Expected: e.\n"), HasSubstr("lacks `# Paper's claim:`"));
  EXPECT_THAT(error_of(body, "# Paper's claim:\n# Question: q?\n# Expected: e.\n"), HasSubstr("lacks `# Paper's claim:` "
                                                                                              "or its text"));
  // Statements after the first key are not the header.
  EXPECT_THAT(error_of(body + "# Question: late\n", "# Paper's claim: c.\n# Expected: e.\n"),
              HasSubstr("lacks `# Question:`"));
}

TEST_F(SweepTest, CollidingRunNamesAreRefused) {
  const Experiment e = load("experiment:\n" + kScales +
                            "grid:\n"
                            "  - {name: a, variants: {x-y: [train.lr=1e-3], x: [train.lr=2e-3]}}\n"
                            "  - {name: b, variants: {z: [train.seed=1], y-z: [train.seed=2]}}\n"
                            "  - {name: seed, key: train.seed, values: [1]}\n");
  try {
    expand_experiment(e, "cpu");
    FAIL() << "x-y + z and x + y-z both expand to x-y-z-seed1";
  } catch (const ExperimentError& err) {
    EXPECT_THAT(err.what(), HasSubstr("runs 0 (a x-y, b z, seed seed1) and 3 (a x, b y-z, seed seed1) are both named "
                                      "'x-y-z-seed1'"));
    EXPECT_THAT(err.what(), HasSubstr("Fix: rename a variant or a label"));
  }
}

// --check loads every run and reports each bad one, not only the first.
TEST_F(SweepTest, CheckReportsEveryBadRun) {
  const Experiment e = load("experiment:\n" + kPlainScales +
                            "grid:\n"
                            "  - name: v\n"
                            "    variants:\n"
                            "      good: []\n"
                            "      layout: [parallel.dp=4]\n"
                            "      batch: [train.global_batch_size=7]\n"
                            "      codec: [\"compression.pipeline_backward={name: lowrank, rnak: 4}\"]\n");
  const SweepCheck c = check_sweep(expand_experiment(e, "cpu"), root_.str());
  EXPECT_EQ(c.checked, 4);
  ASSERT_EQ(c.problems.size(), 3u);
  EXPECT_EQ(c.problems[0].index, 1);
  EXPECT_EQ(c.problems[0].run, "layout");
  EXPECT_THAT(c.problems[0].error, HasSubstr("parallel.tp*pp*dp = 1*1*4 = 4: must equal the number of ranks, 2"));
  EXPECT_EQ(c.problems[1].run, "batch");
  EXPECT_THAT(c.problems[1].error, HasSubstr("global_batch_size = 7"));
  EXPECT_EQ(c.problems[2].run, "codec");
  EXPECT_THAT(c.problems[2].error, HasSubstr("rnak"));
  EXPECT_EQ(c.vocab_from_data_config, 0);  // model.vocab_size is set in the base
}

TEST_F(SweepTest, CheckFallsBackToTheDataVocabularyWhenTheDatasetIsMissing) {
  write("experiments/base.yaml", "model: {preset: tiny, vocab_size: 0}\nparallel: {dp: 2}\n"
                                 "train: {micro_batch_size: 2, global_batch_size: 8}\ndata: {prefix: data/none}\n");
  const SweepCheck c = check_sweep(expand_experiment(load("experiment:\n" + kScales + kGrid), "cpu"), root_.str());
  EXPECT_TRUE(c.problems.empty()) << c.problems[0].error;
  EXPECT_EQ(c.vocab_from_data_config, 4);
}

// A scale that asks for GPUs cannot run with a build without CUDA: --check says so first, before
// any run's config is looked at, naming the experiment, the scale, the GPUs, the build and the fix.
TEST_F(SweepTest, CheckRefusesAGpuScaleWithABuildWithoutCuda) {
  load("experiment:\n" + kPlainScales +
       "grid:\n"
       "  - name: v\n"
       "    variants:\n"
       "      good: []\n"
       "      layout: [parallel.dp=4]\n");  // a bad run: the refusal comes before it is reported
  const Experiment e = load_experiment(root_ / "experiments/exp.yaml", root_.str());
  const SweepPlan paper = expand_experiment(e, "paper");
  const std::string refusal = gpu_build_refusal(paper, false, "LibTorch 1.13.1, CPU only (built without CUDA)");
  EXPECT_THAT(refusal, HasSubstr("experiment error (" + root_ / "experiments/exp.yaml" + "): experiment exp, --scale "
                                 "paper: its slurm block asks for 2 nodes x 8 GPUs (8 GPUs per task, 2 tasks per run), "
                                 "but this optcc is LibTorch 1.13.1, CPU only (built without CUDA): it cannot use a GPU"));
  EXPECT_THAT(refusal, HasSubstr("Fix: build optcc against a CUDA LibTorch"));
  EXPECT_THAT(refusal, HasSubstr("or use the cpu scale (--scale cpu)"));
  EXPECT_EQ(gpu_build_refusal(paper, true, "LibTorch 2.6.0, CUDA"), "");
  EXPECT_EQ(gpu_build_refusal(expand_experiment(e, "cpu"), false, "LibTorch 1.13.1, CPU only"), "");

  SweepOptions o;
  o.file = root_ / "experiments/exp.yaml";
  o.root = root_.str();
  o.check = true;
  o.scale = "paper";
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = run_sweep_command(o);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 2);
  if (!kBuiltWithCuda) {
    EXPECT_EQ(err, gpu_build_refusal(paper, false, build_description()) + "\n");
    EXPECT_THAT(err, HasSubstr(build_description()));
  } else {  // a CUDA build checks the configs and finds the bad run
    EXPECT_THAT(err, HasSubstr("run 1 (layout)"));
  }
  EXPECT_EQ(out, "");
  o.scale = "cpu";  // no GPUs: the configs are checked as before, in any build
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(run_sweep_command(o), 2);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("run 1 (layout)"));
}

// The issue's requirement: every experiment file of the repository expands and validates at both
// scales (a file that stops loading, a run whose config no longer validates, fails here).
TEST(ExperimentFiles, EveryFileExpandsAndValidatesAtBothScales) {
  const fs::path root = optcc::testing::source_dir();
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(root / "experiments")) {
    const std::string rel = fs::relative(entry.path(), root).string();
    if (entry.path().extension() == ".yaml" && is_experiment_file(entry.path().string())) files.push_back(rel);
  }
  std::sort(files.begin(), files.end());
  EXPECT_THAT(files, ::testing::IsSupersetOf({"experiments/table2.yaml", "experiments/testing/slurm-smoke.yaml"}));
  std::map<std::string, std::string> names;  // experiment name -> file: results/<name>/ must not be shared
  // The runs are checked from a root that holds the experiments but no data/: a developer's prepared
  // demo corpus (8000 pieces) is not the paper configs' 50257-piece vocabulary and is refused for them
  // (Config.DatasetOfAnotherTokenizerIsRefusedThoughItsIdsFit), which says nothing of the files.
  testing::TempDir tmp;
  const fs::path unprepared = tmp / "repo";
  fs::create_directories(unprepared);
  fs::create_directory_symlink(root / "experiments", unprepared / "experiments");
  for (const auto& rel : files) {
    SCOPED_TRACE(rel);
    Experiment e;
    ASSERT_NO_THROW(e = load_experiment((root / rel).string(), root.string())) << [&] {
      try { load_experiment((root / rel).string(), root.string()); } catch (const std::exception& x) { return std::string(x.what()); }
      return std::string();
    }();
    EXPECT_TRUE(names.emplace(e.name, rel).second) << "experiment name " << e.name << " also in " << names[e.name];
    for (const auto& scale : experiment_scale_names()) {
      const SweepPlan p = expand_experiment(e, scale);
      EXPECT_FALSE(p.runs.empty());
      const SweepCheck c = check_sweep(p, unprepared.string());
      for (const auto& bad : c.problems) ADD_FAILURE() << rel << " --scale " << scale << " run " << bad.index << " ("
                                                       << bad.run << "): " << bad.error;
    }
  }
}

}  // namespace
}  // namespace optcc

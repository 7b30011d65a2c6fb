// Reading and checking experiment files (experiment_file.h, experiments/README.md).
#include "harness/experiments/experiment_file.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "compression/options.h"

namespace optcc {
namespace {
namespace fs = std::filesystem;

// Keys each level accepts.
const std::vector<std::string> kTopKeys = {"experiment", "scales", "grid"};
const std::vector<std::string> kExperimentKeys = {"name", "kind", "feeds"};
const std::vector<std::string> kTrainScaleKeys = {"base", "set", "slurm", "grid"};
const std::vector<std::string> kBenchScaleKeys = {"program", "args", "slurm", "grid"};
const std::vector<std::string> kSlurmKeys = {"nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "time"};
// Optional `slurm:` keys (a scale that asks for GPUs needs them: read_gpu_rules).
const std::vector<std::string> kSlurmOptionalKeys = {"array_limit", "mem", "exclusive", "gpus_per_task",
                                                     "stop_signal_seconds"};
const std::vector<std::string> kVariantAxisKeys = {"name", "variants"};
const std::vector<std::string> kValuesAxisKeys = {"name", "key", "values", "label"};
// Set by the sweep for every run (sweep.h); a file that set them would be silently overridden.
const std::vector<std::string> kSweepOwnedKeys = {"log.dir", "log.run_name", "checkpoint.dir"};

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string text_of(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "(empty)";
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

// Every message: "experiment error (FILE): WHERE = VALUE: RULE. Fix: FIX."
class Reader {
 public:
  Reader(std::string file, std::string root, std::string kind = "train")
      : file_(std::move(file)), root_(std::move(root)), kind_(std::move(kind)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& value, const std::string& rule,
                         const std::string& fix) const {
    const std::string what = where.empty() ? "" : where + (value.empty() ? "" : " = " + value) + ": ";
    throw ExperimentError(fmt::format("experiment error ({}): {}{}. Fix: {}.", file_, what, rule, fix));
  }

  void check_keys(const YAML::Node& n, const std::vector<std::string>& known, const std::string& where) const {
    if (!n.IsMap()) fail(where, text_of(n), "must be a mapping of key: value", "write it as `key: value` lines");
    for (const auto& kv : n) {
      const std::string key = kv.first.Scalar();
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        fail(where.empty() ? key : where + "." + key, text_of(kv.second), "unknown key (known here: " + join(known) + ")",
             "remove it or rename it to one of the known keys");
      }
    }
  }

  std::string string_at(const YAML::Node& n, const std::string& where) const {
    if (!n.IsScalar()) fail(where, text_of(n), "must be a string", "give a single value, e.g. `" + where + ": x`");
    return n.Scalar();
  }

  std::vector<std::string> strings_at(const YAML::Node& n, const std::string& where) const {
    if (!n.IsSequence()) fail(where, text_of(n), "must be a list of strings", "write it as `[a, b]`");
    std::vector<std::string> out;
    for (size_t i = 0; i < n.size(); ++i) out.push_back(string_at(n[i], fmt::format("{}[{}]", where, i)));
    return out;
  }

  int64_t integer_at(const YAML::Node& n, const std::string& where, int64_t min) const {
    int64_t v = 0;
    std::string why;
    if (!read_scalar(n, v, why)) fail(where, text_of(n), "must be an integer" + (why.empty() ? "" : " (" + why + ")"),
                                      fmt::format("give an integer >= {}", min));
    if (v < min) fail(where, text_of(n), fmt::format("must be >= {}", min), fmt::format("give an integer >= {}", min));
    return v;
  }

  // One override of a run: `section.key=value` for train (key and value type checked against the
  // config), a `--benchmark_*=value` option for a benchmark.
  void check_item(const std::string& item, const std::string& where) const {
    if (item.find_first_of("\t\n\r") != std::string::npos) {
      fail(where, "'" + item + "'", "holds a tab or a line break", "write it on one line without tabs");
    }
    if (kind_ == "benchmark") return check_benchmark_option(item, where);
    const std::string key = item.substr(0, item.find('='));
    if (std::find(kSweepOwnedKeys.begin(), kSweepOwnedKeys.end(), key) != kSweepOwnedKeys.end()) {
      fail(where, "'" + item + "'", "log.dir, log.run_name and checkpoint.dir are set by the sweep for every run "
           "(results/<experiment>/<run>.h5, results/<experiment>/ckpt/<run>)", "remove it");
    }
    try {
      Config scratch;
      apply_override(scratch, item);
    } catch (const ConfigError& e) {
      fail(where, "'" + item + "'", std::string("not a valid config override: ") + e.what(),
           "give `section.key=value` with a key of harness/config/config.h and a value of its type");
    }
  }

  void check_benchmark_option(const std::string& item, const std::string& where) const {
    static const std::regex option("--benchmark_[a-z_]+=.+");
    if (!std::regex_match(item, option)) {
      fail(where, "'" + item + "'", "a benchmark run takes Google Benchmark options `--benchmark_<name>=<value>`",
           "e.g. --benchmark_filter=fig14 or --benchmark_repetitions=3");
    }
    if (item.rfind("--benchmark_out=", 0) == 0 || item.rfind("--benchmark_out_format=", 0) == 0) {
      fail(where, "'" + item + "'", "the sweep sets --benchmark_out=results/<experiment>/<run>.json and its format",
           "remove it");
    }
  }

  std::vector<std::string> items_at(const YAML::Node& n, const std::string& where) const {
    auto items = strings_at(n, where);
    for (size_t i = 0; i < items.size(); ++i) check_item(items[i], fmt::format("{}[{}]", where, i));
    return items;
  }

  const std::string& file() const { return file_; }
  const std::string& root() const { return root_; }
  const std::string& kind() const { return kind_; }
  void set_kind(const std::string& k) { kind_ = k; }

 private:
  std::string file_, root_, kind_;
};

// ---- header comment ---------------------------------------------------------------------------

// The text of the statement labelled `label` in the leading comment block: the rest of its line
// and the following comment lines indented by two spaces or more after '#'.
std::string statement(const std::vector<std::string>& header, const std::string& label) {
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i].rfind("# " + label, 0) != 0) continue;
    std::string text = header[i].substr(label.size() + 2);
    for (size_t j = i + 1; j < header.size() && header[j].rfind("#  ", 0) == 0; ++j) {
      text += " " + header[j].substr(header[j].find_first_not_of("# "));
    }
    text.erase(0, text.find_first_not_of(' '));
    return text;
  }
  return "";
}

void read_header(const Reader& r, Experiment& e) {
  std::ifstream in(e.file);
  std::vector<std::string> header;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') break;
    header.push_back(line);
  }
  const std::vector<std::pair<std::string, std::string*>> wanted = {
      {"Question:", &e.question}, {"Paper's claim:", &e.claim}, {"Expected:", &e.expected}};
  for (const auto& [label, out] : wanted) {
    *out = statement(header, label);
    if (out->empty()) {
      r.fail("header comment", "", "the comment lines before the first key must state `# Question:`, `# Paper's "
             "claim:` and `# Expected:` (this one lacks `# " + label + "` or its text)",
             "start the file with the three lines, e.g. `# " + label + " ...`");
    }
  }
}

// ---- slurm and grid ---------------------------------------------------------------------------

// The optional keys of `slurm:`: array throttle, memory, exclusive nodes, GPUs per task.
void read_slurm_options(const Reader& r, const YAML::Node& n, const std::string& where, SlurmResources& s) {
  if (n["array_limit"]) s.array_limit = r.integer_at(n["array_limit"], where + ".array_limit", 1);
  if (n["gpus_per_task"]) s.gpus_per_task = r.integer_at(n["gpus_per_task"], where + ".gpus_per_task", 0);
  if (n["stop_signal_seconds"]) {
    s.stop_signal_seconds = r.integer_at(n["stop_signal_seconds"], where + ".stop_signal_seconds", 0);
    if (s.stop_signal_seconds > 65535) {  // sbatch --signal's limit
      r.fail(where + ".stop_signal_seconds", text_of(n["stop_signal_seconds"]), "must be at most 65535 (sbatch "
             "--signal's limit)", "e.g. stop_signal_seconds: 600 (0 = no signal before the time limit)");
    }
  }
  if (n["exclusive"]) {
    std::string why;
    if (!read_scalar(n["exclusive"], s.exclusive, why)) {
      r.fail(where + ".exclusive", text_of(n["exclusive"]), "must be true or false" + (why.empty() ? "" : " (" + why + ")"),
             "write exclusive: true (whole nodes, sbatch --exclusive) or exclusive: false");
    }
  }
  if (n["mem"]) {
    s.mem = r.string_at(n["mem"], where + ".mem");
    static const std::regex size("[0-9]{1,9}[KMGT]?");
    if (!std::regex_match(s.mem, size)) {
      r.fail(where + ".mem", "'" + s.mem + "'", "must be a Slurm memory size per node: digits and an optional unit "
             "K, M, G or T (no unit = megabytes; 0 = all of each node's memory), as sbatch --mem takes it",
             "e.g. mem: 480G, or mem: \"0\" for all of each node's memory");
    }
  }
}

// What a scale that asks for GPUs must say: how many of its tasks may run at once, the memory (or
// whole nodes), and one GPU binding per task that covers the node's GPUs exactly.
void check_gpu_rules(const Reader& r, const std::string& where, const SlurmResources& s) {
  if (!s.needs_gpus()) return;
  const std::string asks = fmt::format("gpus_per_node {}, gpus_per_task {}", s.gpus_per_node, s.gpus_per_task);
  if (s.gpus_per_task == 0) {
    r.fail(where + ".gpus_per_task", "(not set)", fmt::format("a scale that asks for GPUs ({}) binds them per task: "
           "each of the {} tasks of a node (one rank each) gets its own GPUs", asks, s.tasks_per_node),
           s.gpus_per_node % s.tasks_per_node == 0
               ? fmt::format("add gpus_per_task: {} (= gpus_per_node {} / tasks_per_node {})",
                             s.gpus_per_node / s.tasks_per_node, s.gpus_per_node, s.tasks_per_node)
               : "add gpus_per_task: N with N * tasks_per_node == gpus_per_node");
  }
  if (s.gpus_per_task * s.tasks_per_node != s.gpus_per_node) {
    r.fail(where, asks + fmt::format(", tasks_per_node {}", s.tasks_per_node),
           fmt::format("gpus_per_task * tasks_per_node = {} must equal gpus_per_node (every GPU a node gives the "
                       "job is bound to one of its tasks)", s.gpus_per_task * s.tasks_per_node),
           fmt::format("set gpus_per_node: {}, or change gpus_per_task or tasks_per_node to match it",
                       s.gpus_per_task * s.tasks_per_node));
  }
  if (s.array_limit == 0) {
    r.fail(where + ".array_limit", "(not set)", fmt::format("a scale that asks for GPUs ({} per task) must limit "
           "how many of its array tasks run at once, or every task starts together", s.gpu_text()), "add array_limit: N (at most N tasks at once, sbatch --array=...%N), e.g. array_limit: 2");
  }
  if (s.mem.empty() && !s.exclusive) {
    r.fail(where, "mem and exclusive not set", "a scale that asks for GPUs must say its memory per node (`mem`) or "
           "take whole nodes (`exclusive: true`), else Slurm's default memory (often a few GB per CPU) applies",
           "add exclusive: true (and mem: \"0\" for all of each node's memory), or mem: 480G");
  }
}

SlurmResources read_slurm(const Reader& r, const YAML::Node& n, const std::string& where) {
  std::vector<std::string> known = kSlurmKeys;
  known.insert(known.end(), kSlurmOptionalKeys.begin(), kSlurmOptionalKeys.end());
  r.check_keys(n, known, where);
  for (const auto& k : kSlurmKeys) {
    if (!n[k]) r.fail(where, text_of(n), "lacks `" + k + "` (needs " + join(kSlurmKeys) + ")", "add `" + k + ": ...`");
  }
  SlurmResources s;
  s.nodes = r.integer_at(n["nodes"], where + ".nodes", 1);
  s.tasks_per_node = r.integer_at(n["tasks_per_node"], where + ".tasks_per_node", 1);
  s.gpus_per_node = r.integer_at(n["gpus_per_node"], where + ".gpus_per_node", 0);
  s.cpus_per_task = r.integer_at(n["cpus_per_task"], where + ".cpus_per_task", 1);
  s.time = r.string_at(n["time"], where + ".time");
  static const std::regex hms("([0-9]{1,4}):([0-5][0-9]):([0-5][0-9])");
  std::smatch m;
  const bool ok = std::regex_match(s.time, m, hms) &&
                  std::stoi(m[1].str()) * 3600 + std::stoi(m[2].str()) * 60 + std::stoi(m[3].str()) > 0;
  if (!ok) {
    r.fail(where + ".time", "'" + s.time + "'", "must be a positive wall-clock limit HH:MM:SS (minutes and seconds "
           "below 60; hours may exceed 24)", "e.g. time: \"01:30:00\" (quoted)");
  }
  if (r.kind() == "benchmark" && (s.nodes != 1 || s.tasks_per_node != 1)) {
    r.fail(where, fmt::format("nodes {}, tasks_per_node {}", s.nodes, s.tasks_per_node),
           "a benchmark run is one process", "set nodes: 1 and tasks_per_node: 1");
  }
  read_slurm_options(r, n, where, s);
  check_gpu_rules(r, where, s);
  return s;
}

void add_choice(const Reader& r, GridAxis& axis, AxisChoice c, const std::string& where) {
  if (!is_safe_name(c.part)) {
    r.fail(where, "'" + c.part + "'", "a run-name part uses only A-Z a-z 0-9 . _ + - , does not start with '.' or "
           "'-' and has at most 100 characters", "rename it (a values axis: change `label`, or name the values "
           "with `variants:`)");
  }
  for (const auto& other : axis.choices) {
    if (other.part == c.part) r.fail(where, "'" + c.part + "'", "appears twice in axis '" + axis.name + "'",
                                     "give every value of an axis its own name");
  }
  axis.choices.push_back(std::move(c));
}

GridAxis read_variants_axis(const Reader& r, const YAML::Node& n, GridAxis axis, const std::string& where) {
  const YAML::Node v = n["variants"];
  if (!v.IsMap()) r.fail(where + ".variants", text_of(v), "must map a variant name to its list of overrides",
                         "e.g. `variants: {baseline: [compression.scheme=baseline]}`");
  for (const auto& kv : v) {
    const std::string name = kv.first.Scalar();
    const std::string w = where + ".variants." + name;
    add_choice(r, axis, AxisChoice{name, r.items_at(kv.second, w)}, w);
  }
  return axis;
}

GridAxis read_values_axis(const Reader& r, const YAML::Node& n, GridAxis axis, const std::string& where) {
  if (!n["key"] || !n["values"]) r.fail(where, text_of(n), "a values axis needs both `key` and `values`",
                                        "add them, e.g. `{name: seed, key: train.seed, values: [1, 2, 3]}`");
  const std::string key = r.string_at(n["key"], where + ".key");
  const std::string label = n["label"] ? r.string_at(n["label"], where + ".label") : axis.name;
  const YAML::Node values = n["values"];
  if (!values.IsSequence()) r.fail(where + ".values", text_of(values), "must be a list of scalars", "e.g. [1, 2, 3]");
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string w = fmt::format("{}.values[{}]", where, i);
    if (!values[i].IsScalar()) r.fail(w, text_of(values[i]), "a values axis takes scalars (its run-name part is "
                                      "label + value)", "name map values with `variants:` instead");
    const std::string item = key + "=" + values[i].Scalar();
    r.check_item(item, w);
    add_choice(r, axis, AxisChoice{label + values[i].Scalar(), {item}}, w);
  }
  return axis;
}

GridAxis read_axis(const Reader& r, const YAML::Node& n, const std::string& where) {
  const bool variants = n.IsMap() && n["variants"];
  r.check_keys(n, variants ? kVariantAxisKeys : kValuesAxisKeys, where);
  if (!n["name"]) r.fail(where, text_of(n), "an axis needs a `name`", "add `name: <axis>` (e.g. scheme, seed)");
  GridAxis axis;
  axis.name = r.string_at(n["name"], where + ".name");
  static const std::regex ident("[A-Za-z_][A-Za-z0-9_]*");
  if (!std::regex_match(axis.name, ident)) {
    r.fail(where + ".name", "'" + axis.name + "'", "an axis name is an identifier", "e.g. name: seed");
  }
  axis = variants ? read_variants_axis(r, n, std::move(axis), where) : read_values_axis(r, n, std::move(axis), where);
  if (axis.choices.empty()) r.fail(where, "axis '" + axis.name + "'", "is empty: it would expand to no run",
                                   "give it at least one value or variant, or remove the axis");
  return axis;
}

std::vector<GridAxis> read_grid(const Reader& r, const YAML::Node& n, const std::string& where) {
  if (!n.IsSequence() || n.size() == 0) {
    r.fail(where, text_of(n), "must be a non-empty list of axes", "e.g. `- {name: seed, key: train.seed, values: [1, 2, 3]}`");
  }
  std::vector<GridAxis> axes;
  for (size_t i = 0; i < n.size(); ++i) {
    GridAxis a = read_axis(r, n[i], fmt::format("{}[{}]", where, i));
    for (const auto& other : axes) {
      if (other.name == a.name) r.fail(where, "axis '" + a.name + "'", "is defined twice", "give each axis its own name");
    }
    axes.push_back(std::move(a));
  }
  return axes;
}

// ---- scales -----------------------------------------------------------------------------------

void read_base(const Reader& r, const YAML::Node& n, ExperimentScale& s, const std::string& where) {
  const bool bench = r.kind() == "benchmark";
  const std::string key = bench ? "program" : "base";
  if (!n[key]) r.fail(where, "", "lacks `" + key + "`", bench ? "add `program: build/tests/bench/<program>`"
                                                             : "add `base: experiments/<config>.yaml`");
  s.base = r.string_at(n[key], where + "." + key);
  const fs::path p(s.base);
  if (p.is_absolute() || s.base.find("..") != std::string::npos) {
    r.fail(where + "." + key, "'" + s.base + "'", "must be relative to the repository root, without '..'",
           "e.g. experiments/schemes/mini-3d.yaml");
  }
  if (!bench && !fs::is_regular_file(fs::path(r.root()) / p)) {
    r.fail(where + "." + key, "'" + s.base + "'", "no such config file under the repository root '" + r.root() + "'",
           "give the path of an existing config relative to the repository root, and run optcc sweep from there");
  }
}

ExperimentScale read_scale(const Reader& r, const YAML::Node& n, const std::string& name,
                           const std::vector<GridAxis>& grid) {
  const std::string where = "scales." + name;
  const bool bench = r.kind() == "benchmark";
  r.check_keys(n, bench ? kBenchScaleKeys : kTrainScaleKeys, where);
  ExperimentScale s;
  s.name = name;
  read_base(r, n, s, where);
  const std::string items_key = bench ? "args" : "set";
  if (n[items_key]) s.items = r.items_at(n[items_key], where + "." + items_key);
  if (!n["slurm"]) r.fail(where, "", "lacks `slurm`", "add `slurm: {nodes: 1, tasks_per_node: 1, gpus_per_node: 0, "
                          "cpus_per_task: 1, time: \"00:30:00\"}`");
  s.slurm = read_slurm(r, n["slurm"], where + ".slurm");
  s.grid = grid;
  if (!n["grid"]) return s;
  for (GridAxis& replacement : read_grid(r, n["grid"], where + ".grid")) {
    auto it = std::find_if(s.grid.begin(), s.grid.end(), [&](const GridAxis& a) { return a.name == replacement.name; });
    if (it == s.grid.end()) {
      r.fail(where + ".grid", "axis '" + replacement.name + "'", "a scale's grid replaces top-level axes by name, "
             "and the top-level grid has no such axis", "name one of the top-level axes, or add the axis there");
    }
    *it = std::move(replacement);
  }
  return s;
}

void read_scales(const Reader& r, const YAML::Node& n, const std::vector<GridAxis>& grid, Experiment& e) {
  r.check_keys(n, experiment_scale_names(), "scales");
  for (const auto& name : experiment_scale_names()) {
    if (!n[name]) {
      r.fail("scales", "", "lacks the scale `" + name + "`: every experiment file defines " +
             join(experiment_scale_names()) + " (docs/design.md §8 sizes and layout; the same structure shrunk to one CPU "
             "machine)", "add `scales: {" + name + ": {base: ..., slurm: ...}}`");
    }
    e.scales.push_back(read_scale(r, n[name], name, grid));
  }
}

void read_experiment_block(Reader& r, const YAML::Node& n, Experiment& e) {
  if (n.IsNull()) return;
  r.check_keys(n, kExperimentKeys, "experiment");
  if (n["name"]) e.name = r.string_at(n["name"], "experiment.name");
  if (!is_safe_name(e.name)) {
    r.fail("experiment.name", "'" + e.name + "'", "names the results folder: A-Z a-z 0-9 . _ + - only, not starting "
           "with '.' or '-'", "set `experiment: {name: ...}` (the default is the file stem)");
  }
  if (n["kind"]) e.kind = r.string_at(n["kind"], "experiment.kind");
  if (e.kind != "train" && e.kind != "benchmark") {
    r.fail("experiment.kind", "'" + e.kind + "'", "must be train or benchmark", "use `kind: train` (optcc train "
           "runs) or `kind: benchmark` (a Google Benchmark program)");
  }
  r.set_kind(e.kind);
  if (n["feeds"]) e.feeds = r.strings_at(n["feeds"], "experiment.feeds");
}

}  // namespace

std::string SlurmResources::gpu_text() const {
  const int64_t per_node = gpus_per_node > 0 ? gpus_per_node : gpus_per_task * tasks_per_node;
  return fmt::format("{} node{} x {} GPU{}", nodes, nodes == 1 ? "" : "s", per_node, per_node == 1 ? "" : "s");
}

const std::vector<std::string>& experiment_scale_names() {
  static const std::vector<std::string> names = {"cpu", "paper"};
  return names;
}

const ExperimentScale& Experiment::scale(const std::string& name) const {
  for (const auto& s : scales) {
    if (s.name == name) return s;
  }
  throw ExperimentError(fmt::format("experiment error ({}): --scale {}: no such scale. Fix: pass --scale {}.", file,
                                    name, join(experiment_scale_names(), " or --scale ")));
}

bool is_safe_name(const std::string& s) {
  static const std::regex safe("[A-Za-z0-9_+][A-Za-z0-9._+-]{0,99}");
  return std::regex_match(s, safe);
}

bool is_experiment_file(const std::string& path) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("experiment:", 0) == 0) return true;
  }
  return false;
}

Experiment load_experiment(const std::string& path, const std::string& root) {
  Reader r(path, root);
  if (!fs::is_regular_file(path)) r.fail("", "", "no such file", "give the path of an experiment file, e.g. experiments/table2.yaml");
  YAML::Node doc;
  try {
    doc = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    r.fail("", "", std::string("not valid YAML: ") + e.what(), "correct the YAML syntax at that line");
  }
  if (const std::string repeated = repeated_yaml_key(doc); !repeated.empty()) {
    r.fail(repeated, "", "written twice; YAML keeps one of them silently", "keep one");
  }
  if (!doc.IsMap() || !doc["experiment"]) {
    r.fail("experiment", "", "missing: this is not an experiment file (a plain config is run with `optcc train "
           "--config`)", "add an `experiment:` block, `scales:` and `grid:` (experiments/README.md)");
  }
  r.check_keys(doc, kTopKeys, "");
  Experiment e;
  e.file = path;
  e.name = fs::path(path).stem().string();
  read_header(r, e);
  read_experiment_block(r, doc["experiment"], e);
  if (!doc["grid"]) r.fail("grid", "", "missing", "add `grid:` with at least one axis (experiments/README.md)");
  if (!doc["scales"]) r.fail("scales", "", "missing", "add `scales:` with cpu and paper");
  const std::vector<GridAxis> grid = read_grid(r, doc["grid"], "grid");
  read_scales(r, doc["scales"], grid, e);
  return e;
}

}  // namespace optcc

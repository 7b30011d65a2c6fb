// Expanding an experiment into runs, printing them, checking their configs (sweep.h).
#include "harness/experiments/sweep.h"

#include <cstring>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <regex>

#include "compat/torch_compat.h"
#include "harness/train/run_records.h"

namespace optcc {
namespace {
namespace fs = std::filesystem;

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// The arguments of one run: kind train runs `optcc train`, kind benchmark the program itself.
std::vector<std::string> run_args(const SweepPlan& p, const ExperimentScale& s, const SweepRun& r) {
  if (p.kind == "benchmark") {
    std::vector<std::string> args = {s.base};
    args.insert(args.end(), s.items.begin(), s.items.end());
    args.insert(args.end(), r.overrides.begin(), r.overrides.end());
    args.push_back("--benchmark_out=" + r.results);
    args.push_back("--benchmark_out_format=json");
    return args;
  }
  std::vector<std::string> sets = s.items;
  sets.insert(sets.end(), r.overrides.begin(), r.overrides.end());
  sets.push_back("log.dir=" + p.results_dir);
  sets.push_back("log.run_name=" + r.run);
  sets.push_back("checkpoint.dir=" + r.checkpoint_dir);
  std::vector<std::string> args = {"train", "--config", s.base};
  for (const auto& x : sets) args.insert(args.end(), {"--set", x});
  return args;
}

// Run `index` of the product: digit k of `index` in the mixed radix of the axis sizes picks axis
// k's choice, the last axis fastest.
SweepRun make_run(const SweepPlan& p, const ExperimentScale& s, int64_t index) {
  SweepRun r;
  r.index = index;
  std::vector<const AxisChoice*> picked(s.grid.size());
  int64_t rest = index;
  for (size_t k = s.grid.size(); k-- > 0;) {
    const int64_t n = static_cast<int64_t>(s.grid[k].choices.size());
    picked[k] = &s.grid[k].choices[static_cast<size_t>(rest % n)];
    rest /= n;
  }
  std::vector<std::string> parts;
  for (size_t k = 0; k < s.grid.size(); ++k) {
    parts.push_back(picked[k]->part);
    r.axes.emplace_back(s.grid[k].name, picked[k]->part);
    r.overrides.insert(r.overrides.end(), picked[k]->items.begin(), picked[k]->items.end());
  }
  r.run = join(parts, "-");
  const bool bench = p.kind == "benchmark";
  r.results = p.results_dir + "/" + r.run + (bench ? ".json" : ".h5");
  r.checkpoint_dir = bench ? "" : p.results_dir + "/ckpt/" + r.run;
  r.world_size = s.slurm.nodes * s.slurm.tasks_per_node;
  r.args = run_args(p, s, r);
  return r;
}

std::string parts_text(const SweepRun& r) {
  std::vector<std::string> out;
  for (const auto& [axis, part] : r.axes) out.push_back(axis + " " + part);
  return join(out, ", ");
}

void check_unique_names(const SweepPlan& p) {
  std::map<std::string, const SweepRun*> seen;
  for (const auto& r : p.runs) {
    auto [it, fresh] = seen.emplace(r.run, &r);
    if (fresh) continue;
    throw ExperimentError(fmt::format(
        "experiment error ({}): grid (scale {}): runs {} ({}) and {} ({}) are both named '{}': the parts joined "
        "with '-' collide. Run names must be unique (each names results/{}/<run>.h5). Fix: rename a variant or a "
        "label so the joined names differ, e.g. avoid '-' inside parts.",
        p.file, p.scale, it->second->index, parts_text(*it->second), r.index, parts_text(r), r.run, p.experiment));
  }
}

// `rel` (repository-relative) as seen from here: unchanged when the root is ".".
std::string under(const std::string& root, const std::string& rel) {
  return root == "." || fs::path(rel).is_absolute() ? rel : (fs::path(root) / rel).string();
}

// A train run's --config and --set values, read back from its args (what `optcc train` gets).
std::pair<std::string, std::vector<std::string>> config_and_sets(const std::vector<std::string>& args) {
  std::string config;
  std::vector<std::string> sets;
  for (size_t i = 1; i + 1 < args.size(); i += 2) {
    if (args[i] == "--config") config = args[i + 1];
    if (args[i] == "--set") sets.push_back(args[i + 1]);
  }
  return {config, sets};
}

// Loads and validates one train run as `optcc train` would; says whether the vocabulary came
// from data.vocab_size because the dataset is not prepared, and the run's projected results size.
// Throws ConfigError.
struct RunCheck {
  bool vocab_fallback = false;
  int64_t results_bytes = 0;
};
RunCheck check_run(const SweepRun& r, const std::string& root) {
  const auto [config, sets] = config_and_sets(r.args);
  Config cfg = load_config(under(root, config), sets);
  bool fallback = false;
  Config located = cfg;  // the run reads data.prefix from the repository root
  located.data.prefix = under(root, located.data.prefix);
  // The run reads network.match_regime from the repository root too (validate checks that the file exists).
  if (!cfg.network.match_regime.empty()) {
    const std::string& m = cfg.network.match_regime;
    const bool recorded = m.rfind(kRecordedRegimePrefix, 0) == 0;
    cfg.network.match_regime = recorded ? kRecordedRegimePrefix + under(root, m.substr(std::strlen(kRecordedRegimePrefix)))
                                        : under(root, m);
  }
  if (cfg.model.vocab_size == 0) {
    try {
      resolve_vocab(located);
      cfg.model.vocab_size = located.model.vocab_size;
    } catch (const ConfigError&) {
      cfg.model.vocab_size = cfg.data.vocab_size;
      fallback = true;
    }
  }
  cfg.validate(r.world_size);
  located.model.vocab_size = cfg.model.vocab_size;
  check_tokenizer_vocab(located, prepared_vocab_size(located.data.prefix));  // as train does before step 1
  return {fallback, project_results(cfg).total_bytes};
}

int print_check(const SweepPlan& p, const SweepCheck& c, const std::string& root) {
  if (p.kind == "benchmark") {
    std::cout << fmt::format("{} --scale {}: {} benchmark runs of {}; their options are valid (nothing to load){}\n",
                             p.file, p.scale, p.runs.size(), p.base,
                             fs::exists(under(root, p.base)) ? "" : fmt::format("; note: {} is not built yet", p.base));
    return 0;
  }
  for (const auto& bad : c.problems) std::cerr << fmt::format("run {} ({}): {}\n", bad.index, bad.run, bad.error);
  if (!c.problems.empty()) {
    std::cerr << fmt::format("{} --scale {}: {} of {} runs failed the check\n", p.file, p.scale, c.problems.size(),
                             p.runs.size());
    return 2;
  }
  std::cout << fmt::format("{} --scale {}: {} runs, every config valid for world size {}{}\n", p.file, p.scale,
                           c.checked, p.slurm.nodes * p.slurm.tasks_per_node,
                           c.vocab_from_data_config == 0 ? ""
                               : fmt::format(" ({} validated with data.vocab_size: the dataset is not prepared)",
                                             c.vocab_from_data_config));
  std::cout << fmt::format("{} --scale {}: results files about {} in all, the largest run about {} (upper bounds: "
                           "harness/train/run_records.h project_results)\n",
                           p.file, p.scale, byte_text(static_cast<double>(c.results_bytes)),
                           byte_text(static_cast<double>(c.largest_results_bytes)));
  return 0;
}

}  // namespace

std::string shell_quote(const std::string& s) {
  static const std::regex plain("[A-Za-z0-9._+=/:,@%-]+");
  if (std::regex_match(s, plain)) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

SweepPlan expand_experiment(const Experiment& e, const std::string& scale) {
  const ExperimentScale& s = e.scale(scale);
  SweepPlan p;
  p.experiment = e.name;
  p.scale = s.name;
  p.file = e.file;
  p.kind = e.kind;
  p.base = s.base;
  p.feeds = e.feeds;
  p.results_dir = "results/" + e.name;
  p.slurm = s.slurm;
  int64_t total = 1;
  for (const auto& axis : s.grid) total *= static_cast<int64_t>(axis.choices.size());
  for (int64_t i = 0; i < total; ++i) p.runs.push_back(make_run(p, s, i));
  check_unique_names(p);
  return p;
}

std::string sweep_listing(const SweepPlan& plan) {
  std::string out;
  for (const auto& r : plan.runs) {
    std::vector<std::string> quoted;
    for (const auto& o : r.overrides) quoted.push_back(shell_quote(o));
    out += fmt::format("{}\t{}\t{}\n", r.index, r.run, join(quoted, " "));
  }
  return out;
}

nlohmann::json sweep_json(const SweepPlan& plan) {
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : plan.runs) {
    nlohmann::json axes = nlohmann::json::object();
    for (const auto& [axis, part] : r.axes) axes[axis] = part;
    runs.push_back({{"index", r.index}, {"run", r.run}, {"kind", plan.kind}, {"axes", axes},
                    {"overrides", r.overrides}, {"results", r.results}, {"checkpoint_dir", r.checkpoint_dir},
                    {"world_size", r.world_size}, {"args", r.args},
                    {"compression", r.compression.empty() ? nlohmann::json() : nlohmann::json(r.compression)},
                    {"match_regime", r.match_regime}});
  }
  const SlurmResources& s = plan.slurm;
  const nlohmann::json array_limit = s.array_limit > 0 ? nlohmann::json(s.array_limit) : nlohmann::json();
  const nlohmann::json mem = s.mem.empty() ? nlohmann::json() : nlohmann::json(s.mem);
  return {{"experiment", plan.experiment}, {"scale", plan.scale}, {"file", plan.file}, {"kind", plan.kind},
          {"feeds", plan.feeds}, {"results_dir", plan.results_dir},
          {"slurm", {{"nodes", s.nodes}, {"tasks_per_node", s.tasks_per_node}, {"gpus_per_node", s.gpus_per_node},
                     {"cpus_per_task", s.cpus_per_task}, {"time", s.time}, {"array_limit", array_limit},
                     {"mem", mem}, {"exclusive", s.exclusive}, {"gpus_per_task", s.gpus_per_task},
                     {"stop_signal_seconds", s.stop_signal_seconds}}},
          {"needs_gpus", s.needs_gpus()},
          {"gpus", s.needs_gpus() ? nlohmann::json(s.gpu_text()) : nlohmann::json()},
          {"build", {{"cuda", kBuiltWithCuda}, {"description", build_description()}}},
          {"runs", runs}};
}

std::string gpu_build_refusal(const SweepPlan& plan, bool built_with_cuda, const std::string& build) {
  const SlurmResources& s = plan.slurm;
  if (!s.needs_gpus() || built_with_cuda) return "";
  return fmt::format(
      "experiment error ({}): experiment {}, --scale {}: its slurm block asks for {} ({} GPU{} per task, {} "
      "tasks per run), but this optcc is {}: it cannot use a GPU, and every task would hold its GPUs idle "
      "and run on CPUs only (the runs' configs were not checked). Fix: build optcc against a CUDA LibTorch "
      "(and point OPTCC at it), or use the cpu scale (--scale cpu).",
      plan.file, plan.experiment, plan.scale, s.gpu_text(), s.gpus_per_task, s.gpus_per_task == 1 ? "" : "s",
      s.nodes * s.tasks_per_node, build);
}

SweepCheck check_sweep(const SweepPlan& plan, const std::string& root) {
  SweepCheck c;
  if (plan.kind != "train") return c;
  for (const auto& r : plan.runs) {
    try {
      const RunCheck rc = check_run(r, root);
      c.vocab_from_data_config += rc.vocab_fallback ? 1 : 0;
      c.results_bytes += rc.results_bytes;
      c.largest_results_bytes = std::max(c.largest_results_bytes, rc.results_bytes);
    } catch (const std::exception& e) {
      c.problems.push_back({r.index, r.run, e.what()});
    }
    ++c.checked;
  }
  return c;
}

void label_runs(SweepPlan& plan, const std::string& root) {
  if (plan.kind != "train") return;
  for (auto& r : plan.runs) {
    try {
      const auto [config, sets] = config_and_sets(r.args);
      const Config cfg = load_config(under(root, config), sets);
      r.compression = compression_label(cfg.compression);
      r.match_regime = cfg.network.match_regime;
    } catch (const std::exception&) {
      r.compression.clear();  // --check names the problem
      r.match_regime.clear();
    }
  }
}

int run_sweep_command(const SweepOptions& o) {
  SweepPlan plan = expand_experiment(load_experiment(o.file, o.root), o.scale);
  if (o.check) {
    const std::string refusal = gpu_build_refusal(plan, kBuiltWithCuda, build_description());
    if (!refusal.empty()) {
      std::cerr << refusal << "\n";
      return 2;
    }
    return print_check(plan, check_sweep(plan, o.root), o.root);
  }
  if (o.json) {
    label_runs(plan, o.root);
    std::cout << sweep_json(plan).dump(2) << "\n";
    return 0;
  }
  if (!o.index) {
    std::cout << sweep_listing(plan);
    return 0;
  }
  const int64_t n = static_cast<int64_t>(plan.runs.size());
  if (*o.index < 0 || *o.index >= n) {
    throw ExperimentError(fmt::format("experiment error ({}): --index {}: the {} scale has {} runs, 0..{}. Fix: pass "
                                      "an index in that range (`optcc sweep {} --scale {}` lists them).",
                                      o.file, *o.index, o.scale, n, n - 1, o.file, o.scale));
  }
  for (const auto& a : plan.runs[static_cast<size_t>(*o.index)].args) std::cout << a << "\n";
  return 0;
}

}  // namespace optcc

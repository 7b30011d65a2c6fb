// optcc: the command-line entry point.
//
//   optcc train --config experiments/demo.yaml [--set section.key=value ...] [--resume [DIR|auto]]
//     --resume        resume from the config's checkpoint.dir (must hold a checkpoint)
//     --resume DIR    resume from DIR (an iter_NNNNNNN directory or a directory holding `latest`)
//     --resume auto   resume from checkpoint.dir when it holds a checkpoint, else start at step 0;
//                     the default inside a Slurm job (SLURM_JOB_ID set), so a requeue continues
//     (none)          start at step 0; refused when checkpoint.dir already holds a checkpoint
//   (a directory named "auto": write ./auto)
//   Results files are never overwritten: a re-run writes <run>.attempt-<n>.h5 (trainer.h).
//   optcc data fetch|prepare|info --config experiments/demo.yaml [--retrain (prepare)]
//   optcc bench step --config experiments/demo.yaml [--steps 10] [--threads 1]
//   optcc config show --config experiments/demo.yaml [--set ...]
//   optcc traffic --config experiments/paper/gpt-2.5b.yaml [--set ...] [--world N] [--json]
#include <CLI/CLI.hpp>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "datasets/cli_integer.h"
#include "harness/tools/bench.h"
#include "harness/tools/comm_check.h"
#include "harness/config/config.h"
#include "harness/parallel/distributed.h"
#include "harness/parallel/threads.h"
#include "harness/tools/traffic_report.h"
#include "harness/train/trainer.h"

extern char** environ;

namespace optcc {
namespace {
namespace fs = std::filesystem;

std::string command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) out += (i ? " " : "") + std::string(argv[i]);
  return out;
}

// Runs the sibling `optcc-data` tool (SentencePiece lives there, never in this process).
int run_data_tool(const std::vector<std::string>& args) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const fs::path tool = self.parent_path() / "optcc-data";
  if (!fs::exists(tool)) {
    throw std::runtime_error(fmt::format("{} is missing: build it with `make build`", tool.string()));
  }
  std::vector<std::string> argv_s = {tool.string()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  spdlog::info("running: {}", fmt::join(argv_s, " "));
  pid_t pid = 0;
  if (posix_spawn(&pid, tool.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    throw std::runtime_error("cannot start " + tool.string());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool is_builtin_source(const std::string& s) { return s == "nlp-corpus" || s == "brown"; }

int data_command(const std::string& action, const Config& cfg, bool retrain) {
  std::vector<std::string> args = {action};
  if (action == "fetch") {
    args.insert(args.end(), {"--data-dir", cfg.data.dir});
    for (const auto& s : cfg.data.sources) {
      if (is_builtin_source(s)) args.insert(args.end(), {"--source", s});
    }
  } else if (action == "prepare") {
    for (const auto& s : cfg.data.sources) {
      args.insert(args.end(), {"--input", is_builtin_source(s)
                                              ? (fs::path(cfg.data.dir) / "corpus" / (s + ".jsonl")).string()
                                              : s});
    }
    args.insert(args.end(), {"--output-prefix", cfg.data.prefix, "--vocab-size",
                             std::to_string(cfg.data.vocab_size), "--model-type",
                             cfg.data.tokenizer_type, "--seed", std::to_string(cfg.train.seed)});
    if (retrain) args.push_back("--retrain");
  } else {
    args.insert(args.end(), {"--prefix", cfg.data.prefix});
  }
  return run_data_tool(args);
}

}  // namespace
}  // namespace optcc

int main(int argc, char** argv) {
  using namespace optcc;
  ensure_passive_openmp(argv);
  CLI::App app{"optcc: communication-compressed 3D-parallel GPT training (Optimus-CC and beyond)"};
  app.require_subcommand(1);
  std::string config_path;
  std::vector<std::string> overrides;
  auto add_config = [&](CLI::App* sub) {
    sub->add_option("--config,-c", config_path, "experiment YAML (experiments/*.yaml)")->required();
    sub->add_option("--set", overrides, "override: section.key=value (repeatable)");
  };

  auto* train = app.add_subcommand("train", "train a GPT model as the config describes");
  add_config(train);
  std::string resume;
  auto* resume_opt = train->add_option("--resume", resume,
                                       "resume from DIR (no value: the config's checkpoint.dir); 'auto': resume "
                                       "from checkpoint.dir if it holds a checkpoint, else start at step 0 (the "
                                       "default inside a Slurm job). Without it, a run whose checkpoint.dir "
                                       "holds a checkpoint is refused")
                         ->expected(0, 1);

  auto* data = app.add_subcommand("data", "fetch the corpus, prepare the tokenizer and indexed dataset");
  data->require_subcommand(1);
  std::string data_action;
  for (const char* name : {"fetch", "prepare", "info"}) {
    auto* sub = data->add_subcommand(name, std::string("optcc-data ") + name + " with the config's data section");
    add_config(sub);
    sub->callback([&data_action, name] { data_action = name; });
  }
  bool data_retrain = false;
  data->get_subcommand("prepare")->add_flag("--retrain", data_retrain,
                                            "train the tokenizer anew even if it could be reused");

  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto* bench_step_cmd = bench->add_subcommand("step", "time the training step; compare with fp32 GEMM speed");
  add_config(bench_step_cmd);
  int64_t bench_steps = 10, bench_warmup = 2, bench_threads = 1;
  bench_step_cmd->add_option("--steps", bench_steps, "timed steps (median reported)")->transform(decimal_integer());
  bench_step_cmd->add_option("--warmup", bench_warmup, "untimed steps first")->transform(decimal_integer());
  bench_step_cmd->add_option("--threads", bench_threads, "intra-op threads (0 = config's)")->transform(decimal_integer());

  auto* comm_check = app.add_subcommand("comm-check", "check a launch: rendezvous, every group, p2p");
  add_config(comm_check);
  int nproc = 1;
  comm_check->add_option("--nproc", nproc, "local ranks to fork (omit under srun/torchrun)")->transform(decimal_integer());
  train->add_option("--nproc", nproc, "local ranks to fork (omit under srun/torchrun)")->transform(decimal_integer());
  CommCheckOptions check_opts;
  comm_check->add_option("--die-rank", check_opts.die_rank, "test hook: this rank kills itself")->transform(decimal_integer());

  auto* config_cmd = app.add_subcommand("config", "configuration");
  config_cmd->require_subcommand(1);
  auto* show = config_cmd->add_subcommand("show", "print the effective config after presets and --set");
  add_config(show);

  auto* traffic = app.add_subcommand(
      "traffic", "print the bytes per iteration by traffic class and link (analytic; runs nothing)");
  add_config(traffic);
  int64_t traffic_world = 0;
  bool traffic_json = false;
  TrafficModelOptions traffic_opts;
  traffic->add_option("--world", traffic_world, "GPUs: sets parallel.dp = N / (tp * pp) (default: tp*pp*dp)")
      ->transform(decimal_integer());
  traffic->add_flag("--json", traffic_json, "machine-readable output (bytes)");
  traffic->add_flag("--recompute", traffic_opts.recompute,
                    "k_TP = 6: full activation recomputation, as the paper's runs (optcc does not recompute)");
  traffic->add_option("--element-bytes", traffic_opts.element_bytes, "β: bytes per activation/gradient element (4 fp32, 2 for 16-bit)")
      ->transform(decimal_integer());
  traffic->add_flag("--reference-powersgd", traffic_opts.reference_powersgd,
                    "DP PowerSGD compresses every >=2-D gradient, as the reference (min_compression_rate 0)");

  CLI11_PARSE(app, argc, argv);

  try {
    Config cfg = load_config(config_path, overrides);
    if (traffic->parsed()) {  // analytic: no process group, no data
      if (traffic_world > 0) {
        const int64_t tp_pp = cfg.parallel.tp * cfg.parallel.pp;
        if (traffic_world % tp_pp != 0) {
          throw ConfigError(fmt::format("--world {} is not a multiple of parallel.tp * parallel.pp = {}. Fix: pick a "
                                        "multiple, or change tp/pp with --set.", traffic_world, tp_pp));
        }
        cfg.parallel.dp = traffic_world / tp_pp;
      }
      if (cfg.model.vocab_size == 0) {
        try {
          resolve_vocab(cfg);
        } catch (const ConfigError& e) {
          throw ConfigError(fmt::format("{}\nThe traffic model needs the vocabulary: pass --set model.vocab_size=N "
                                        "(e.g. 50257 for GPT-2), or prepare the dataset first.", e.what()));
        }
      }
      cfg.validate(cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp);
      const TrafficEstimate estimate = estimate_traffic(cfg, traffic_opts);
      const PaperTrafficRows rows = paper_traffic_rows(cfg, traffic_opts);
      std::cout << (traffic_json ? traffic_report_json(cfg, estimate, rows, traffic_opts)
                                 : traffic_report(cfg, estimate, rows, traffic_opts));
      return 0;
    }
    const bool is_launcher = nproc > 1 && std::getenv("OPTCC_RANK") == nullptr;
    if (is_launcher) {
      cfg.validate_layout(nproc);
      return launch_local(nproc, std::vector<std::string>(argv, argv + argc),
                          std::chrono::milliseconds(static_cast<int64_t>(cfg.parallel.timeout_seconds * 1000)));
    }
    if (comm_check->parsed()) return run_comm_check(cfg, check_opts);
    if (train->parsed()) {
      TrainOptions opts;
      opts.command_line = command_line(argc, argv);
      if (resume_opt->count() > 0 && resume != "auto") opts.resume = resume.empty() ? cfg.checkpoint_dir() : resume;
      // A Slurm requeue reruns the same command: inside a job, continue from the checkpoint by default.
      opts.resume_auto = resume == "auto" || (resume_opt->count() == 0 && std::getenv("SLURM_JOB_ID") != nullptr);
      TrainSummary s = run_training(cfg, opts);
      if (!s.results_path.empty()) spdlog::info("done: steps {}..{}, results in {}", s.first_step, s.last_step, s.results_path);
      return 0;
    }
    if (data->parsed()) return data_command(data_action, cfg, data_retrain);
    if (bench_step_cmd->parsed()) {
      auto r = bench_step(cfg, bench_steps, bench_warmup, bench_threads);
      std::cout << fmt::format(
          "bench step: preset={} L={} h={} s={} B={} threads={}\n"
          "  step {:.1f} ms | {:.0f} tokens/s | model {:.1f} GFLOP/s | fp32 GEMM {:.1f} GFLOP/s | "
          "ratio {:.2f}\n",
          cfg.model.preset, cfg.model.num_layers, cfg.model.hidden_size, cfg.model.seq_len,
          cfg.train.global_batch_size, r.threads, r.step_seconds * 1e3, r.tokens_per_second,
          r.model_gflops, r.gemm_gflops, r.ratio);
      return 0;
    }
    if (show->parsed()) {  // also a check: prints the config, then validates it as a run would
      std::cout << to_yaml(cfg);
      try {
        resolve_vocab(cfg);
      } catch (const ConfigError& e) {
        std::cerr << "note: " << e.what() << "\n";
        cfg.model.vocab_size = cfg.data.vocab_size;
      }
      cfg.validate(cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp);
      std::cerr << fmt::format("config OK for {} ranks (tp={} pp={} dp={}); run name '{}', results {}/{}.h5, "
                               "checkpoints {}\n",
                               cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp, cfg.parallel.tp,
                               cfg.parallel.pp, cfg.parallel.dp, cfg.run_name(), cfg.log.dir, cfg.run_name(),
                               cfg.checkpoint_dir());
      return 0;
    }
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

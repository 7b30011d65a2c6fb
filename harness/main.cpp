// optcc: the command-line entry point.
//
//   optcc train --config experiments/demo.yaml [--set section.key=value ...] [--resume [DIR|auto]]
//     --resume        resume from the config's checkpoint.dir (must hold a checkpoint)
//     --resume DIR    resume from DIR (an iter_NNNNNNN directory or a directory holding `latest`)
//     --resume auto   resume from checkpoint.dir when it holds a checkpoint, else start at step 0;
//                     the default in a requeued Slurm job (SLURM_RESTART_COUNT >= 1), so a requeue
//                     continues; a job id alone (salloc, a first attempt) is no requeue
//     (none)          start at step 0; refused when checkpoint.dir already holds a checkpoint
//   (a directory named "auto": write ./auto)
//   Results files are never overwritten: a re-run writes <run>.attempt-<n>.h5 (trainer.h).
//   optcc data fetch|prepare|info --config experiments/demo.yaml [--retrain (prepare)]
//   optcc bench step --config experiments/demo.yaml [--steps 10] [--threads 1]
//   optcc config show --config experiments/demo.yaml [--set ...]
//   optcc config label --config experiments/demo.yaml [--set ...]   what it compresses, one line
//   optcc traffic --config experiments/paper/gpt-2.5b.yaml [--set ...] [--world N] [--json]
//   optcc trace results/run.h5 [--step N] [-o trace.json] [--breakdown]
//   optcc sweep experiments/table2.yaml --scale cpu|paper [--json | --index I | --check]
//   optcc eval --checkpoint DIR [--split valid|test] [--layout tp,pp,dp] [--nproc N] [--set ...]
//              [--documents N] [--output FILE.h5]   (harness/checkpoints/eval_checkpoint.h)
//   optcc simulate --config X [--profile NAME|FILE] [--schemes a,b] [--json] [--match-regime PAPER_CONFIG]
//   optcc calibrate --config X [-o experiments/profiles/this-machine.yaml]
#include <CLI/CLI.hpp>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <iostream>

#include "compat/torch_compat.h"
#include "datasets/cli_integer.h"
#include "harness/tools/bench.h"
#include "harness/tools/comm_check.h"
#include "harness/checkpoints/eval_checkpoint.h"
#include "harness/config/config.h"
#include "harness/parallel/distributed.h"
#include "harness/parallel/stop_signal.h"
#include "harness/parallel/threads.h"
#include "harness/experiments/sweep.h"
#include "harness/perfmodel/calibrate.h"
#include "harness/perfmodel/simulate_report.h"
#include "harness/tools/trace.h"
#include "harness/perfmodel/traffic_report.h"
#include "harness/train/network_setup.h"
#include "harness/perfmodel/regime.h"
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
  const ChildSignals child_signals;  // SIGTERM/SIGUSR1 unblocked there (stop_signal.h)
  if (posix_spawn(&pid, tool.c_str(), nullptr, child_signals.get(), argv.data(), environ) != 0) {
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

// Every command, its options and where CLI11 writes them. Lives in main's frame: the callbacks
// and the option bindings point into it.
struct Cli {
  std::string config_path;
  std::vector<std::string> overrides;
  CLI::App* train = nullptr;
  CLI::Option* resume_opt = nullptr;
  std::string resume;
  bool allow_config_change = false;
  int nproc = 1;
  LaunchNodes nodes{1, -1, "", 0};  // --nnodes, --node-rank (-1: not given), --master: one launcher per host
  std::string master;         // --master HOST:PORT as typed
  CLI::App* data = nullptr;
  std::string data_action;
  bool data_retrain = false;
  CLI::App* bench_step = nullptr;
  int64_t bench_steps = 10, bench_warmup = 2, bench_threads = 1, bench_profile = 0;
  std::string bench_precision;  // empty: the config's train.precision
  CLI::App* comm_check = nullptr;
  CommCheckOptions check_opts;
  CLI::App* show = nullptr;
  CLI::App* label = nullptr;
  CLI::App* traffic = nullptr;
  int64_t traffic_world = 0;
  bool traffic_json = false;
  TrafficModelOptions traffic_opts;
  CLI::App* trace = nullptr;
  TraceOptions trace_opts;
  int64_t trace_step = -1;
  CLI::App* sweep = nullptr;
  SweepOptions sweep_opts;
  int64_t sweep_index = -1;
  CLI::App* eval = nullptr;
  EvalOptions eval_opts;
  CLI::App* simulate = nullptr;
  SimulateCommandOptions simulate_opts;
  CLI::App* calibrate = nullptr;
  CalibrateOptions calibrate_opts;

  void add_config(CLI::App* sub) {
    sub->add_option("--config,-c", config_path, "experiment YAML (experiments/*.yaml)")->required();
    sub->add_option("--set", overrides, "override: section.key=value (repeatable)");
  }
};

void add_train_command(CLI::App& app, Cli& c) {
  c.train = app.add_subcommand("train", "train a GPT model as the config describes");
  c.add_config(c.train);
  c.resume_opt = c.train->add_option("--resume", c.resume,
                                     "resume from DIR (no value: the config's checkpoint.dir); 'auto': resume "
                                     "from checkpoint.dir if it holds a checkpoint, else start at step 0 (the "
                                     "default in a requeued Slurm job: SLURM_RESTART_COUNT >= 1). Without it, a run whose checkpoint.dir "
                                     "holds a checkpoint is refused")
                     ->expected(0, 1);
  c.train->add_flag("--allow-config-change", c.allow_config_change,
                    "with a resume: accept a config that changes keys a resume normally keeps (learning-rate "
                    "schedule, model, data, compression, ...); the changes are logged and recorded in the results");
}

void add_data_commands(CLI::App& app, Cli& c) {
  c.data = app.add_subcommand("data", "fetch the corpus, prepare the tokenizer and indexed dataset");
  c.data->require_subcommand(1);
  for (const char* name : {"fetch", "prepare", "info"}) {
    auto* sub = c.data->add_subcommand(name, std::string("optcc-data ") + name + " with the config's data section");
    c.add_config(sub);
    sub->callback([&c, name] { c.data_action = name; });
  }
  c.data->get_subcommand("prepare")->add_flag("--retrain", c.data_retrain,
                                              "train the tokenizer anew even if it could be reused");
}

void add_bench_command(CLI::App& app, Cli& c) {
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  c.bench_step = bench->add_subcommand("step", "time the training step; compare with fp32 GEMM speed");
  c.add_config(c.bench_step);
  c.bench_step->add_option("--steps", c.bench_steps, "timed steps (median reported)")->transform(decimal_integer());
  c.bench_step->add_option("--warmup", c.bench_warmup, "untimed steps first")->transform(decimal_integer());
  c.bench_step->add_option("--threads", c.bench_threads, "intra-op threads (0 = config's)")->transform(decimal_integer());
  c.bench_step->add_option("--precision", c.bench_precision, "train.precision of the step: fp32 | bf16 (default: the config's)");
  c.bench_step->add_option("--profile", c.bench_profile,
                           "after the timed steps, profile one more (LibTorch's profiler) and print its N operations "
                           "with the most self time (GPU time on CUDA)")
      ->transform(decimal_integer());
}

// comm-check, and --nproc for it and for train.
void add_comm_check_command(CLI::App& app, Cli& c) {
  c.comm_check = app.add_subcommand("comm-check", "check a launch: rendezvous, every group, p2p");
  c.add_config(c.comm_check);
  for (CLI::App* cmd : {c.comm_check, c.train}) {
    cmd->add_option("--nproc", c.nproc, "local ranks to fork (omit under srun/torchrun)")->transform(decimal_integer());
    cmd->add_option("--nnodes", c.nodes.nnodes, "hosts of the run, one launcher on each (with --node-rank, --master)")
        ->transform(decimal_integer());
    cmd->add_option("--node-rank", c.nodes.node_rank, "this host's place, 0..nnodes-1 (0 runs global rank 0)")
        ->transform(decimal_integer());
    cmd->add_option("--master", c.master, "HOST:PORT of node 0 as every host reaches it (nnodes > 1)");
  }
  c.comm_check->add_option("--die-rank", c.check_opts.die_rank, "test hook: this rank kills itself")
      ->transform(decimal_integer());
  c.comm_check->add_option("--time-allreduce", c.check_opts.time_allreduce_mb,
                           "after the checks, time a world all-reduce of each size in MB (e.g. 128,256)")
      ->delimiter(',');
  c.comm_check->add_option("--reps", c.check_opts.reps, "--time-allreduce: timed calls per size")
      ->transform(decimal_integer());
}

void add_config_command(CLI::App& app, Cli& c) {
  auto* config_cmd = app.add_subcommand("config", "configuration");
  config_cmd->require_subcommand(1);
  c.show = config_cmd->add_subcommand("show", "print the effective config after presets and --set");
  c.add_config(c.show);
  c.label = config_cmd->add_subcommand(
      "label", "print what the config compresses, the run's name in results, tables and figures (e.g. baseline, "
               "cb_fe_sc, dp=powersgd(rank=4))");
  c.add_config(c.label);
}

void add_traffic_command(CLI::App& app, Cli& c) {
  c.traffic = app.add_subcommand(
      "traffic", "print the bytes per iteration by traffic class and link (analytic; runs nothing)");
  c.add_config(c.traffic);
  c.traffic->add_option("--world", c.traffic_world, "GPUs: sets parallel.dp = N / (tp * pp) (default: tp*pp*dp)")
      ->transform(decimal_integer());
  c.traffic->add_flag("--json", c.traffic_json, "machine-readable output (bytes)");
  c.traffic->add_flag("--recompute", c.traffic_opts.recompute,
                      "k_TP = 6: full activation recomputation, as the paper's runs (optcc does not recompute)");
  c.traffic->add_option("--element-bytes", c.traffic_opts.element_bytes,
                        "β: bytes per element of every message, 1, 2 (the paper's fp16 runs) or 4; default (0): "
                        "activations in train.precision's dtype, the uncompressed DP all-reduce in "
                        "parallel.grad_reduce_dtype's, other gradients fp32, as a run meters them")
      ->transform(decimal_integer());
  c.traffic->add_flag("--reference-powersgd", c.traffic_opts.reference_powersgd,
                      "DP PowerSGD compresses every >=2-D gradient, as the reference (min_compression_rate 0)");
}

// optcc trace: reads a results file; no config.
void add_trace_command(CLI::App& app, Cli& c) {
  c.trace = app.add_subcommand(
      "trace", "a run's timeline (log.timeline_steps): Chrome trace JSON (-o) and the Fig. 10 breakdown (--breakdown)");
  c.trace->add_option("results", c.trace_opts.results, "results file of the run (results/<run>.h5)")->required();
  c.trace->add_option("--step", c.trace_step, "only this step (default: every recorded step)")
      ->transform(decimal_integer());
  c.trace->add_option("-o,--output", c.trace_opts.output, "write Chrome trace-event JSON here (Perfetto, chrome://tracing)");
  c.trace->add_flag("--breakdown", c.trace_opts.breakdown, "print the time breakdown per step (the run stored it in /breakdown)");
}

// optcc sweep: an experiment file's runs (harness/experiments/sweep.h); no config.
void add_sweep_command(CLI::App& app, Cli& c) {
  c.sweep = app.add_subcommand("sweep", "expand an experiment file (experiments/README.md) into its runs");
  c.sweep->add_option("experiment", c.sweep_opts.file, "experiment file (experiments/table2.yaml)")->required();
  c.sweep->add_option("--scale", c.sweep_opts.scale, "cpu or paper")->required()->check(CLI::IsMember({"cpu", "paper"}));
  auto* json = c.sweep->add_flag("--json", c.sweep_opts.json, "every run as JSON (for scripts)");
  auto* index = c.sweep->add_option("--index", c.sweep_index, "print run I's optcc arguments, one per line")
                    ->transform(decimal_integer());
  auto* check = c.sweep->add_flag("--check", c.sweep_opts.check, "load and validate every run's config; exit 2 "
                                  "naming each bad run");
  json->excludes(index)->excludes(check);
  index->excludes(check);
}

// optcc eval: the config comes from the checkpoint, not from --config.
void add_eval_command(CLI::App& app, Cli& c) {
  c.eval = app.add_subcommand("eval", "loss, perplexity and last-word accuracy of a checkpoint of any layout, on one "
                                      "process or another layout");
  auto& o = c.eval_opts;
  c.eval->add_option("--checkpoint", o.checkpoint, "checkpoint.dir holding `latest`, or an iter_NNNNNNN directory")
      ->required();
  c.eval->add_option("--split", o.split, "held-out documents: valid (default) or test");
  c.eval->add_option("--layout", o.layout, "tp,pp,dp of the evaluation (default 1,1,1: one process)");
  c.eval->add_option("--nproc", c.nproc, "local ranks to fork (tp*pp*dp; omit under srun/torchrun)")
      ->transform(decimal_integer());
  c.eval->add_option("--set", o.overrides, "override: parallel.*, train.eval_iters, train.micro_batch_size, "
                                           "train.threads, data.prefix/dir/split, log.dir/run_name/level");
  c.eval->add_option("--documents", o.documents, "last-word documents (default 1000; 0 skips the metric)")
      ->transform(decimal_integer());
  c.eval->add_option("--output", o.output, "results file (default <log.dir>/<run>.eval-<step>.h5)");
}

int eval_command(const Cli& c, int argc, char** argv) {
  EvalOptions o = c.eval_opts;
  o.command_line = command_line(argc, argv);
  if (c.nproc > 1 && std::getenv("OPTCC_RANK") == nullptr) {  // the local launcher: check, then fork
    const Config cfg = eval_config_of(o, c.nproc);
    return launch_local(c.nproc, std::vector<std::string>(argv, argv + argc),
                        std::chrono::milliseconds(static_cast<int64_t>(cfg.parallel.timeout_seconds * 1000)));
  }
  const EvalResult r = run_eval(o);
  if (!r.results_path.empty()) std::cout << eval_report(r);  // global rank 0
  return 0;
}

// optcc simulate and optcc calibrate (harness/perfmodel/simulator.h, calibrate.h).
void add_simulate_commands(CLI::App& app, Cli& c) {
  c.simulate = app.add_subcommand("simulate", "predict one iteration's time per scheme (discrete-event replay; runs nothing)");
  c.add_config(c.simulate);
  auto& o = c.simulate_opts;
  c.simulate->add_option("--profile", o.profile, "hardware profile: NAME (experiments/profiles/NAME.yaml) or FILE");
  c.simulate->add_option("--schemes", o.schemes, "comma-separated schemes (and 'config': the config as given)");
  c.simulate->add_flag("--json", o.json, "machine-readable output (seconds)");
  c.simulate->add_flag("--recompute", o.sim.recompute, "full activation recomputation, as the paper's runs");
  c.simulate->add_option("--element-bytes", o.sim.element_bytes, "bytes per activation/gradient element")
      ->transform(decimal_integer());
  c.simulate->add_flag("--reference-powersgd", o.sim.reference_powersgd, "DP PowerSGD compresses every >=2-D gradient");
  c.simulate->add_option("--match-regime", o.match_regime,
                         "PAPER_CONFIG: print the link scale that puts --config into its inter-node share on --profile");
  c.simulate->add_option("--machine-profile", o.machine_profile, "with --match-regime: the profile --config computes at");
  c.calibrate = app.add_subcommand("calibrate", "measure this machine for the simulator; writes a profile");
  c.add_config(c.calibrate);
  c.calibrate->add_option("-o,--output", c.calibrate_opts.output,
                          "profile file to write (overwrites it; the default is the tracked profile)")
      ->capture_default_str();
  c.calibrate->add_option("--concurrent", c.calibrate_opts.concurrent,
                          "processes timing at once (default: the config's world, as an emulated run)")
      ->transform(decimal_integer());
  c.calibrate->add_option("--reps", c.calibrate_opts.reps, "timed repetitions (median)")
      ->transform(decimal_integer())
      ->capture_default_str();
}

// The vocabulary, for the analytic commands (traffic, simulate).
void resolve_vocab_for_model(Config& cfg, const char* what) {
  if (cfg.model.vocab_size != 0) return;
  try {
    resolve_vocab(cfg);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}\nThe {} needs the vocabulary: pass --set model.vocab_size=N "
                                  "(e.g. 50257 for GPT-2), or prepare the dataset first.", e.what(), what));
  }
}

// optcc traffic: analytic, no process group, no data.
int traffic_command(const Cli& c, Config cfg) {
  if (c.traffic_world > 0) {
    const int64_t tp_pp = cfg.parallel.tp * cfg.parallel.pp;
    if (c.traffic_world % tp_pp != 0) {
      throw ConfigError(fmt::format("--world {} is not a multiple of parallel.tp * parallel.pp = {}. Fix: pick a "
                                    "multiple, or change tp/pp with --set.", c.traffic_world, tp_pp));
    }
    cfg.parallel.dp = c.traffic_world / tp_pp;
  }
  resolve_vocab_for_model(cfg, "traffic model");
  // Analytic: a GPU or fp16 config is modelled on any build (a run of it is refused where it cannot run).
  cfg.validate(cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp, Config::BuildLimits::kAnyBuild);
  const TrafficEstimate estimate = estimate_traffic(cfg, c.traffic_opts);
  const PaperTrafficRows rows = paper_traffic_rows(cfg, c.traffic_opts);
  std::cout << (c.traffic_json ? traffic_report_json(cfg, estimate, rows, c.traffic_opts)
                               : traffic_report(cfg, estimate, rows, c.traffic_opts));
  return 0;
}

// SLURM_RESTART_COUNT set to a number >= 1: this job is a requeued one (scontrol requeue, or
// Slurm's own after a node failure); its first attempt ran the same command.
bool slurm_requeue() {
  const char* count = std::getenv("SLURM_RESTART_COUNT");
  if (count == nullptr) return false;
  char* end = nullptr;
  const long n = std::strtol(count, &end, 10);
  return end != count && *end == '\0' && n >= 1;
}

TrainOptions train_options(const Cli& c, const Config& cfg, int argc, char** argv) {
  TrainOptions opts;
  opts.command_line = command_line(argc, argv);
  if (c.resume_opt->count() > 0 && c.resume != "auto") opts.resume = c.resume.empty() ? cfg.checkpoint_dir() : c.resume;
  // A Slurm requeue reruns the same command: then, and only then, continue from the checkpoint by
  // default. Slurm marks a requeued job with SLURM_RESTART_COUNT >= 1; a job id alone (an salloc
  // shell, a first attempt) means only "inside an allocation" (docs/configuration.md, "Stopping early").
  opts.resume_auto = c.resume == "auto" || (c.resume_opt->count() == 0 && slurm_requeue());
  opts.allow_config_change = c.allow_config_change;
  opts.derive_network = derive_network_regime;  // network.match_regime (harness/perfmodel/regime.h)
  return opts;
}

// How to prepare this run's data: the user's own --config and --set, so that an overridden
// data.prefix (or data.sources, vocab_size) is the one prepared.
std::string prepare_command(const Cli& c) {
  std::string args = "--config " + shell_quote(c.config_path);
  for (const auto& o : c.overrides) args += " --set " + shell_quote(o);
  return fmt::format("`optcc data fetch {0}` and `optcc data prepare {0}`", args);
}

int train_command(const Cli& c, const Config& cfg, int argc, char** argv) {
  const TrainOptions opts = train_options(c, cfg, argc, argv);
  record_stop_signals();  // SIGTERM / SIGUSR1: checkpoint after this step and exit 75 (stop_signal.h)
  std::signal(SIGXFSZ, SIG_IGN);   // a file-size limit is a write error naming the file, not a silent death
  TrainSummary s = run_training(cfg, opts);
  if (s.stopped_by_signal != 0) return kStoppedExitCode;  // the trainer logged the step and the checkpoint
  if (!s.results_path.empty()) spdlog::info("done: steps {}..{}, results in {}", s.first_step, s.last_step, s.results_path);
  return 0;
}

int bench_command(const Cli& c, Config cfg) {
  if (!c.bench_precision.empty()) cfg.train.precision = c.bench_precision;  // validated by bench_step
  if (c.bench_profile < 0) throw ConfigError(fmt::format("--profile {}: must be >= 0 (0 = no profile)", c.bench_profile));
  auto r = bench_step(cfg, c.bench_steps, c.bench_warmup, c.bench_threads, c.bench_profile);
  std::string gemms;
  for (const auto& [name, gflops] : r.gemm) gemms += fmt::format("{}{} {:.1f}", gemms.empty() ? "" : ", ", name, gflops);
  std::cout << fmt::format(
      "bench step: preset={} L={} h={} s={} B={} device={} threads={} precision={} (CPU bf16: {}) attention={}; linear "
      "layers on {}; compressors' thin GEMMs: {}; heap: {}\n"
      "  {} GEMM at the model's shapes (GFLOP/s): {}\n"
      "  step {:.1f} ms | {:.0f} tokens/s | model {:.1f} GFLOP/s | best GEMM {:.1f} GFLOP/s ({}) | ratio {:.2f}\n",
      cfg.model.preset, cfg.model.num_layers, cfg.model.hidden_size, cfg.model.seq_len,
      cfg.train.global_batch_size, r.device, r.threads, r.precision, r.cpu_bf16, r.attention, r.linear_library, r.thin_gemm,
      r.allocator,
      r.precision, gemms, r.step_seconds * 1e3, r.tokens_per_second,
      r.model_gflops, r.gemm_gflops, r.gemm_library, r.ratio);
  if (!r.profile.empty()) {
    double self_total = 0;
    for (const auto& op : r.profile) self_total += op.self_ms;
    std::cout << fmt::format("  profile of one more step ({:.1f} ms under the profiler; {} clock): top {} operations by "
                             "self time, {:.1f} ms together\n",
                             r.profile_step_ms, r.profile_clock, r.profile.size(), self_total)
              << fmt::format("  | {:<40} | {:>7} | {:>10} | {:>6} | {:>10} |\n", "operation", "calls", "self ms",
                             "% step", "total ms")
              << fmt::format("  |{:-<42}|{:->9}|{:->12}|{:->8}|{:->12}|\n", "", "", "", "", "");
    for (const auto& op : r.profile) {
      std::cout << fmt::format("  | {:<40} | {:>7} | {:>10.2f} | {:>6.1f} | {:>10.2f} |\n", op.name, op.calls,
                               op.self_ms, 100.0 * op.self_ms / r.profile_step_ms, op.total_ms);
    }
  }
  return 0;
}

// optcc config show: also a check; prints the config, then validates it as a run would.
int config_show_command(Config cfg) {
  std::cout << to_yaml(cfg);
  try {
    resolve_vocab(cfg);
  } catch (const ConfigError& e) {
    // Not an error here: the corpus may be prepared after the config is written. A run would
    // stop on it; `config show` checks the rest with the tokenizer's target vocabulary instead.
    std::string why = e.what();
    const std::string prefix = "config error: ";
    if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
    std::cerr << fmt::format("note (not an error for `config show`; `optcc train` would stop here): {} Meanwhile "
                             "`config show` checks the rest with model.vocab_size = data.vocab_size = {}.\n",
                             why, cfg.data.vocab_size);
    cfg.model.vocab_size = cfg.data.vocab_size;
  }
  cfg.validate(cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp);
  check_tokenizer_vocab(cfg, prepared_vocab_size(cfg.data.prefix));  // as `optcc train` before its first step
  std::cerr << fmt::format("config OK for {} ranks (tp={} pp={} dp={}); run name '{}', results {}/{}.h5, "
                           "checkpoints {}\n",
                           cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp, cfg.parallel.tp,
                           cfg.parallel.pp, cfg.parallel.dp, cfg.run_name(), cfg.log.dir, cfg.run_name(),
                           cfg.checkpoint_dir());
  return 0;
}

// --nnodes / --node-rank / --master, checked: one host unless --nnodes > 1, which needs the other two.
LaunchNodes launch_nodes(const Cli& c) {
  LaunchNodes n = c.nodes;
  auto usage = [](const std::string& what, const std::string& rule) {
    return ConfigError(fmt::format("error: {}: {}. Fix: on each of N hosts run optcc train ... --nproc P --nnodes N "
                                "--node-rank K --master HOST:PORT, with K = 0 on the host at HOST",
                                what, rule));
  };
  if (n.nnodes < 1) throw usage(fmt::format("--nnodes {}", n.nnodes), "must be at least 1");
  if (n.nnodes > 1 && n.node_rank == -1) {
    throw usage(fmt::format("--nnodes {}", n.nnodes), "needs --node-rank: each host's launcher must say which it is");
  }
  if (n.nnodes == 1 && n.node_rank == -1) n.node_rank = 0;
  if (n.node_rank < 0 || n.node_rank >= n.nnodes) {
    throw usage(fmt::format("--node-rank {}", n.node_rank), fmt::format("must be from 0 to --nnodes - 1 = {}", n.nnodes - 1));
  }
  if (n.nnodes == 1) {
    if (!c.master.empty()) throw usage("--master " + c.master, "is for runs of several hosts (--nnodes > 1)");
    if (n.node_rank != 0) throw usage(fmt::format("--node-rank {}", n.node_rank), "is for runs of several hosts (--nnodes > 1)");
    return n;
  }
  const size_t colon = c.master.rfind(':');
  if (c.master.empty() || colon == std::string::npos || colon == 0) {
    throw usage("--master '" + c.master + "'", fmt::format("--nnodes {} needs node 0's HOST:PORT", n.nnodes));
  }
  n.master_addr = c.master.substr(0, colon);
  const std::string port = c.master.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) < 1 || std::stoi(port) > 65535) {
    throw usage("--master " + c.master, "the port must be a number from 1 to 65535");
  }
  n.master_port = std::stoi(port);
  return n;
}

// The parsed command on the loaded config. With --nproc > 1 outside a launched rank, this process
// is the local launcher: it forks the ranks, which run the same command line.
int dispatch(const Cli& c, Config& cfg, int argc, char** argv) {
  if (c.traffic->parsed()) return traffic_command(c, cfg);
  if (c.simulate->parsed()) {
    resolve_vocab_for_model(cfg, "simulator");
    cfg.validate(cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp, Config::BuildLimits::kAnyBuild);
    return run_simulate_command(cfg, c.simulate_opts);
  }
  if (c.calibrate->parsed()) {
    resolve_vocab_for_model(cfg, "calibration");
    return run_calibrate_command(cfg, c.calibrate_opts);
  }
  const bool is_launcher = (c.nproc > 1 || c.nodes.nnodes > 1) && std::getenv("OPTCC_RANK") == nullptr;
  if ((c.train->parsed() || c.comm_check->parsed()) && std::getenv("OPTCC_RANK") == nullptr) {
    launch_nodes(c);  // --nnodes / --node-rank / --master refused before any work
  }
  if (c.train->parsed() && std::getenv("OPTCC_RANK") == nullptr) {  // once, before any rank starts
    check_run_inputs(cfg, train_options(c, cfg, argc, argv), prepare_command(c));
    // The whole config as each rank checks it (trainer.cpp), this build's limits included (fp16 GEMMs,
    // fused attention, devices): a refusal is printed once, here, instead of once per rank.
    Config as_ranks_see_it = cfg;
    resolve_vocab(as_ranks_see_it);
    as_ranks_see_it.validate(cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp);
  }
  if (is_launcher) {
    const LaunchNodes nodes = launch_nodes(c);
    cfg.validate_layout(c.nproc * nodes.nnodes);
    if (nodes.nnodes > 1 && cfg.network.emulate) {
      throw ConfigError(fmt::format(
          "config error: network.emulate = true: --nnodes {} runs the ranks on {} hosts. Link emulation models a "
          "cluster on ONE machine (its shared NICs live in this machine's shared memory). Fix: set "
          "network.emulate: false to measure the real links, or run on one host (--nnodes 1)",
          nodes.nnodes, nodes.nnodes));
    }
    const auto nic_segment = make_launcher_nic_segment(cfg, c.nproc);  // emulated runs: shared NICs, unlinked at exit
    return launch_local(c.nproc, std::vector<std::string>(argv, argv + argc),
                        std::chrono::milliseconds(static_cast<int64_t>(cfg.parallel.timeout_seconds * 1000)), nodes);
  }
  if (c.comm_check->parsed()) return run_comm_check(cfg, c.check_opts);
  if (c.train->parsed()) return train_command(c, cfg, argc, argv);
  if (c.data->parsed()) return data_command(c.data_action, cfg, c.data_retrain);
  if (c.bench_step->parsed()) return bench_command(c, cfg);
  if (c.show->parsed()) return config_show_command(cfg);
  if (c.label->parsed()) {  // a label only for a config a run would accept (vocabulary and corpus aside)
    if (cfg.model.vocab_size == 0) cfg.model.vocab_size = cfg.data.vocab_size;
    cfg.validate(cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp, Config::BuildLimits::kAnyBuild);
    std::cout << compression_label(cfg.compression) << "\n";
    return 0;
  }
  return 0;
}

}  // namespace
}  // namespace optcc

int main(int argc, char** argv) {
  using namespace optcc;
  ensure_process_start(argv);  // passive OpenMP workers, SIGTERM/SIGUSR1 blocked in every thread (threads.h)
  start_stop_signal_thread();   // the one thread that takes them (stop_signal.h)
  die_with_launcher();  // a rank of `--nproc`: ends with its launcher (stop_signal.h)
  CLI::App app{"optcc: communication-compressed 3D-parallel GPT training (Optimus-CC and beyond)"};
  app.require_subcommand(1);
  // What this binary can run (compat/torch_compat.h): e.g. "optcc 0.1.0, LibTorch 1.13.1, CPU only (built without CUDA)".
  app.set_version_flag("--version", std::string("optcc ") + OPTCC_VERSION + ", " + optcc::build_description());
  Cli cli;
  add_train_command(app, cli);
  add_data_commands(app, cli);
  add_bench_command(app, cli);
  add_comm_check_command(app, cli);
  add_config_command(app, cli);
  add_traffic_command(app, cli);
  add_trace_command(app, cli);
  add_sweep_command(app, cli);
  add_eval_command(app, cli);
  add_simulate_commands(app, cli);

  CLI11_PARSE(app, argc, argv);

  try {
    if (cli.trace->parsed()) {
      if (cli.trace_step >= 0) cli.trace_opts.step = cli.trace_step;
      return run_trace_command(cli.trace_opts);
    }
    if (cli.sweep->parsed()) {
      if (cli.sweep->get_option("--index")->count() > 0) cli.sweep_opts.index = cli.sweep_index;
      return run_sweep_command(cli.sweep_opts);
    }
    if (cli.eval->parsed()) return eval_command(cli, argc, argv);
    Config cfg = load_config(cli.config_path, cli.overrides);
    return dispatch(cli, cfg, argc, argv);
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const PlacementError& e) {  // parallel.device / backend against this machine (device.h)
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

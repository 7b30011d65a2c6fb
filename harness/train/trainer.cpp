#include "harness/train/trainer.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "datasets/gpt_dataset.h"
#include "datasets/indexed_dataset.h"
#include "compression/act_codec.h"
#include "compression/grad_reducer.h"
#include "harness/records/checkpoint.h"
#include "harness/records/run_lock.h"
#include "harness/parallel/stop_signal.h"
#include "harness/records/results_reader.h"
#include "harness/parallel/allocator.h"
#include "harness/train/data_loader.h"
#include "harness/parallel/distributed.h"
#include "harness/train/grad_sync.h"
#include "harness/train/outer_sync.h"
#include "harness/train/network_setup.h"
#include "harness/records/memory_tracker.h"
#include "harness/records/metrics.h"
#include "harness/train/optimizer.h"
#include "compression/pipeline_codec.h"
#include "harness/parallel/pipeline_runner.h"
#include "harness/records/run_info.h"
#include "harness/train/run_records.h"
#include "harness/train/run_setup.h"
#include "harness/train/sc_choice.h"
#include "harness/train/stage_functions.h"
#include "harness/train/loss_scaler.h"
#include "harness/train/resume_check.h"
#include "kernels/thin_gemm.h"
#include "models/precision.h"
#include "harness/parallel/stage_link.h"
#include "harness/parallel/threads.h"
#include "harness/parallel/nic_table.h"  // monotonic_ns
#include "harness/parallel/timeline.h"
#include "harness/train/timeline_records.h"
#include "kernels/gemm.h"

namespace optcc {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

std::string format_eta(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds));
  return fmt::format("{:02d}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

// Evaluation never touches training state. Its pipeline messages go through a fork of the
// training codec (PipelineCodec::fork: the same options and a copy of the current warm-start Q /
// LEP buffers), so it measures the model with the compression training would apply at this step,
// and the training codec (its Q, generators, LEP buffers, stats, Fig. 11 records) is left as it
// was; each evaluation forks afresh, so its value does not depend on earlier evaluations. Dropout is
// off (eval mode); the default CPU and attention generators are restored all the same. Its data
// come from its own loader over the validation split; DP reducers are not used.
double validation_loss(GptModel& model, const Config& c, Distributed& d, const PipelineCodec& codec,
                const std::vector<int64_t>& act_shape, const data::GptDataset* valid) {
  torch::NoGradGuard no_grad;
  StageLink link(*d.pp, d.tp.get(), StageLinkShapes{act_shape, act_shape},
                 torch::TensorOptions().dtype(model->options().compute_dtype).device(d.placement.device), codec.fork(),
                 static_cast<int>(model->stage().chunks));
  auto cpu_gen = at::detail::getDefaultCPUGenerator();
  const torch::Tensor cpu_state = cpu_gen.get_state(), attention_state = model->attention_generator().get_state();
  model->eval();
  const auto& st = model->stage();
  std::unique_ptr<BatchLoader> loader;
  if (valid && (st.is_first || st.is_last)) {
    loader = std::make_unique<BatchLoader>(std::shared_ptr<const data::GptDataset>(valid, [](auto*) {}), c.model.seq_len,
                                           c.train.micro_batch_size, d.coord().dp, c.parallel.dp, 0, d.placement.device);
  }
  double sum = 0.0;
  for (int mb = 0; mb < c.train.eval_iters; ++mb) {
    torch::Tensor batch = loader ? loader->next() : torch::Tensor();
    const int64_t s = c.model.seq_len;
    const auto x = stage_forward(*model, link, mb, st.is_first ? batch.narrow(1, 0, s) : torch::Tensor());
    if (st.is_last) sum += model->head_loss(x, batch.narrow(1, 1, s)).item<double>();
  }
  model->train();
  cpu_gen.set_state(cpu_state);
  model->attention_generator().set_state(attention_state);
  // Average over micro-batches and data-parallel replicas; known on every rank.
  const bool reporter = st.is_last && d.coord().tp == 0;
  auto t = torch::tensor({reporter ? sum / c.train.eval_iters / c.parallel.dp : 0.0}, torch::kDouble);
  d.world->all_reduce(t, Traffic::kControl);
  return t.item<double>();
}

}  // namespace

GptOptions gpt_options(const Config& c) {
  GptOptions o;
  o.num_layers = c.model.num_layers;
  o.hidden_size = c.model.hidden_size;
  o.num_heads = c.model.num_heads;
  o.seq_len = c.model.seq_len;
  o.max_positions = c.model.max_position_embeddings > 0 ? c.model.max_position_embeddings : c.model.seq_len;
  o.vocab_size = c.model.vocab_size;
  o.padded_vocab_size = c.padded_vocab_size();
  o.hidden_dropout = c.model.hidden_dropout;
  o.attention_dropout = c.model.attention_dropout;
  o.init_std = c.model.init_std;
  o.seed = static_cast<uint64_t>(c.train.seed);
  o.compute_dtype = precision_dtype(c.train.precision);
  o.attention = attention_kernel(c.model.attention);
  return o;
}

StageRange stage_range(const Config& c, int stage) {
  const auto counts = c.stage_layer_counts();
  StageRange r;
  r.is_first = stage == 0;
  r.is_last = stage == c.parallel.pp - 1;
  if (c.parallel.virtual_stages > 1) {  // interleaved: v chunks of L / (p v) layers, round-robin (gpt.h)
    r.chunks = c.parallel.virtual_stages;
    r.num_layers = c.model.num_layers / (c.parallel.pp * r.chunks);
    r.first_layer = stage * r.num_layers;
    r.chunk_stride = c.parallel.pp * r.num_layers;
    return r;
  }
  for (int k = 0; k < stage; ++k) r.first_layer += counts[k];
  r.num_layers = counts[stage];
  return r;
}

int64_t threads_for(const Config& cfg, int64_t local_ranks) {
  if (cfg.train.threads > 0) return cfg.train.threads;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  return std::max<int64_t>(1, hw / std::max<int64_t>(1, local_ranks));
}

TrainSummary run_training(Config cfg, const TrainOptions& options) {
  LaunchEnv env = detect_launch_env(process_env(), this_hostname());
  use_interface(env, cfg.parallel.interface);
  const ParallelDims dims{static_cast<int>(cfg.parallel.tp), static_cast<int>(cfg.parallel.pp),
                          static_cast<int>(cfg.parallel.dp)};
  cfg.validate_layout(env.world_size);
  // parallel.device / backend against this machine's GPUs (device.h), before any group is made.
  Placement placement = this_rank_placement(cfg.parallel.device, cfg.parallel.backend, env.local_rank,
                                            env.local_world_size);
  use_device(placement.device);  // the rank's GPU becomes CUDA's current device (NCCL binds to it)
  const int per_node = cfg.parallel.ranks_per_node > 0 ? static_cast<int>(cfg.parallel.ranks_per_node) : env.local_world_size;
  auto dist = init_distributed(dims, per_node, env,
                               std::chrono::milliseconds(static_cast<int64_t>(cfg.parallel.timeout_seconds * 1000)),
                               {}, std::move(placement));
  return run_training(std::move(cfg), options, *dist);
}

namespace {

int64_t bytes_of(const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

// Adam's moments (and max moment with amsgrad), bytes.
int64_t optimizer_state_bytes(torch::optim::AdamW& opt) {
  int64_t n = 0;
  for (const auto& [key, state] : opt.state()) {
    if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
      n += bytes_of(s->exp_avg()) + bytes_of(s->exp_avg_sq()) + bytes_of(s->max_exp_avg_sq());
    }
  }
  return n;
}

}  // namespace

// ---- Trainer: assembly -------------------------------------------------------------------------

namespace {

Config validated(Config cfg, const Distributed& d) {
  resolve_vocab(cfg);  // before validate, to_yaml and gpt_options
  cfg.validate(d.env.world_size);
  return cfg;
}

}  // namespace

struct Trainer::StepResult {
  double lr = 0.0;
  double grad_norm = 0.0;
  double loss = 0.0;     // nats, averaged over DP replicas
  double seconds = 0.0;  // the step, before its records
  double loss_scale = 1.0;  // the scale the step ran with (fp16; 1 otherwise)
  bool skipped = false;     // inf/NaN gradients on some rank: nothing was updated (loss_scaler.h)
  int stop_signal = 0;      // SIGTERM/SIGUSR1 reached some rank: the run stops after this step
};

Trainer::Trainer(Config cfg, const TrainOptions& options, Distributed& d)
    : d_(d),
      options_(options),
      memory_(std::make_shared<MemoryTracker>()),
      memory_guard_(MemoryTracker::install(memory_)),  // before the model exists
      cfg_(validated(std::move(cfg), d)) {
  set_up();
  build_model_and_optimizer();  // the data is opened and checked against the model here
  claim_directories();
  build_pipeline();
  build_gradient_sync();
  build_checkpoint_parts();
  resume();
  build_records();
  log_start();
  start_timeline();
}

Trainer::~Trainer() = default;

// `fn` on every rank, then a world agreement: when it threw on some rank, every rank throws (that
// rank its own exception, the others one naming it), so no rank waits for a failed one in a later
// collective. Every rank must call this at the same point.
void Trainer::on_every_rank(const std::string& what, const std::function<void()>& fn) {
  const TrafficMeter before = d_.meter;  // bookkeeping, not the step's traffic (/traffic)
  std::exception_ptr failure;
  try {
    fn();
  } catch (...) {
    failure = std::current_exception();
  }
  auto failed = torch::zeros({d_.env.world_size}, torch::kDouble);
  if (failure) failed[d_.rank()] = 1.0;
  d_.world->all_reduce(failed, Traffic::kControl);
  d_.meter = before;
  if (failure) std::rethrow_exception(failure);
  std::vector<int> ranks;
  for (int r = 0; r < d_.env.world_size; ++r) {
    if (failed[r].item<double>() > 0) ranks.push_back(r);
  }
  if (!ranks.empty()) {
    throw std::runtime_error(fmt::format("{} failed on rank {} (its error names the cause); every rank stops", what,
                                         fmt::join(ranks, ", ")));
  }
}

// After the config and the data passed their checks (a refused config leaves no directory): every
// rank can write where it must, this run holds the locks, and only then is checkpoint.dir read for
// the resume point (a concurrent run may be writing there).
void Trainer::claim_directories() {
  check_writable_dirs();
  take_run_locks();
  resume_from_ = resume_point(cfg_, options_);
}

// One run per checkpoint.dir and per results name, for the run's life (run_lock.h); global rank 0
// holds both. A stale lock of a dead run is taken over with a warning.
void Trainer::take_run_locks() {
  on_every_rank("taking the run's locks", [&] {
    if (!writer_) return;
    fs::create_directories(cfg_.checkpoint_dir());
    fs::create_directories(cfg_.log.dir);
    const std::vector<std::pair<std::string, std::string>> locks = {
        {(fs::path(cfg_.checkpoint_dir()) / "optcc.lock").string(), "checkpoint.dir " + cfg_.checkpoint_dir()},
        {(fs::path(cfg_.log.dir) / (cfg_.run_name() + ".lock")).string(),
         fmt::format("run name '{}' in log.dir {}", cfg_.run_name(), cfg_.log.dir)}};
    for (const auto& [path, what] : locks) {
      locks_.push_back(std::make_unique<RunLock>(path, what, cfg_.run_name()));
      if (!locks_.back()->stale_holder().empty()) {
        spdlog::warn("{}: took over the lock of a run that is no longer running ({})", what,
                     locks_.back()->stale_holder());
      }
    }
    // The run's lock is ours: an earlier attempt's results file still flagged "open for write" lost
    // its writer (killed); cleared, so any reader opens it (results_reader.h).
    for (const std::string& f : run_results_files(cfg_.log.dir, cfg_.run_name())) {
      if (clear_stale_write_flag(f)) {
        spdlog::info("{}: cleared the 'open for write' flag its killed writer left; plain readers open it now", f);
      }
    }
  });
}

// Every rank writes its checkpoint files into checkpoint.dir (on a node-local or a shared file
// system), global rank 0 the results into log.dir: each checks now, before step 0, that it can
// create a file there.
void Trainer::check_writable_dirs() {
  on_every_rank("checking checkpoint.dir and log.dir", [&] {
    std::vector<std::pair<std::string, std::string>> dirs = {{"checkpoint.dir", cfg_.checkpoint_dir()}};
    if (writer_) dirs.emplace_back("log.dir", cfg_.log.dir);
    for (const auto& [key, dir] : dirs) {
      std::error_code ec;
      fs::create_directories(dir, ec);
      const std::string probe = (fs::path(dir) / fmt::format(".write-test-rank{}-{}", d_.rank(), getpid())).string();
      std::FILE* f = ec ? nullptr : std::fopen(probe.c_str(), "w");
      const int e = ec ? ec.value() : errno;
      if (f != nullptr) std::fclose(f);
      fs::remove(probe, ec);
      if (f == nullptr) {
        throw std::runtime_error(fmt::format(
            "{} {}: rank {} cannot create a file there: {}. Fix: make it a writable directory (every part of the "
            "path must be a directory), or set {} to one this job can write",
            key, dir, d_.rank(), std::strerror(e), key));
      }
    }
  });
}

// Buffered rows into the results file (global rank 0), agreed by every rank: a failed write (a full
// disk) stops the run everywhere with the file and the OS error; rows flushed before stay readable.
void Trainer::flush_results() {
  on_every_rank("writing the results file", [&] {
    if (sink_) sink_->flush();
  });
}

// Resume point, log level, threads, the seed (before the model draws its initial weights).
void Trainer::set_up() {
  writer_ = d_.rank() == 0;
  quiet_ = options_.quiet || !writer_;
  spdlog::set_level(spdlog::level::from_str(cfg_.log.level));
  set_cpu_threads(threads_for(cfg_, d_.env.local_world_size));
  if (!cfg_.network.match_regime.empty()) apply_network_regime();  // before the seed: it draws tensors
  torch::manual_seed(static_cast<uint64_t>(cfg_.train.seed));
  setup_network(d_, cfg_);  // link emulation / skipping (network_setup.h); nothing when off
  coord_ = d_.coord();
  stages_ = static_cast<int>(cfg_.parallel.pp);
  range_ = stage_range(cfg_, coord_.pp);
  m_ = cfg_.num_micro_batches();
  act_shape_ = {cfg_.model.seq_len, cfg_.train.micro_batch_size, cfg_.model.hidden_size};
}

// network.match_regime (config.h): the scale and latencies derived on every rank, logged; the recorded
// config holds the derived values (match_regime "": it ran at that scale), the attribute says how.
void Trainer::apply_network_regime() {
  if (cfg_.network.match_regime.rfind(kRecordedRegimePrefix, 0) == 0) {
    network_regime_ = reuse_recorded_regime(cfg_);  // network_setup.h
    if (!quiet_) spdlog::info("network.match_regime: {}", network_regime_);
    return;
  }
  if (!options_.derive_network) {
    throw ConfigError(fmt::format(
        "config error: network.match_regime = '{}': the scale is derived by `optcc train` at its start, and this "
        "caller gave no derivation (TrainOptions::derive_network). Fix: run it with optcc train, or set "
        "network.match_regime: \"\" and network.scale yourself (optcc simulate --match-regime prints one)",
        cfg_.network.match_regime));
  }
  if (!quiet_) spdlog::info("network.match_regime = {}: measuring this machine on every rank (~10 s)", cfg_.network.match_regime);
  network_regime_ = options_.derive_network(cfg_, d_);
  cfg_.network.match_regime = "";
  validate_network_config(cfg_);
  if (!quiet_) spdlog::info("network.match_regime: {}", network_regime_);
}

void Trainer::build_model_and_optimizer() {
  data_ = open_data(cfg_);  // every rank: middle stages need the split sizes only
  if (!data_.valid && !quiet_) {
    spdlog::warn("data.split = '{}' leaves no validation documents: this run does not evaluate (train.eval_interval "
                 "is 0; give the split a validation weight, e.g. 949,50,1, to evaluate)", cfg_.data.split);
  }
  model_ = GptModel(gpt_options(cfg_), d_.tp.get(), range_);  // drawn on the host: the same weights on every device
  model_->to(d_.placement.device);
  model_->train();
  optimizer_ = make_adamw(*model_, cfg_.train);
  lr_ = LrSchedule::from(cfg_.train);
  const auto& t = cfg_.train;
  scaler_ = std::make_unique<DynamicLossScaler>(
      t.precision == "fp16", LossScaleOptions{t.loss_scale_initial, t.loss_scale_growth_interval, t.loss_scale_backoff,
                                              t.loss_scale_min});
  layout_ = CheckpointLayout{cfg_.parallel.tp, cfg_.parallel.pp, cfg_.parallel.dp, d_.rank()};
  config_yaml_ = to_yaml(cfg_);
}

// Pipeline messages: CB / LEP / epilogue-only and forward codecs (pipeline_codec.h), the link
// between stages, cast-on-the-wire TP all-reduces, the schedule and this stage's functions.
void Trainer::build_pipeline() {
  const auto& comp = cfg_.compression;
  codec_ = std::make_shared<PipelineCodec>(
      make_act_codec(comp.pipeline_forward.name, pipeline_codec_options(cfg_, comp.pipeline_forward)),
      make_act_codec(comp.pipeline_backward.name, pipeline_codec_options(cfg_, comp.pipeline_backward)),
      comp.pipeline_policy());
  codec_->enable_orthogonality_check(cfg_.log.lep_orthogonality && range_.is_last && stages_ > 1);
  codec_->enable_lep_diagnostics(cfg_.log.lep_diagnostics && !range_.is_first);  // the stages that send backward
  link_ = std::make_unique<StageLink>(*d_.pp, d_.tp.get(), StageLinkShapes{act_shape_, act_shape_},
                                      torch::TensorOptions().dtype(model_->options().compute_dtype).device(d_.placement.device),
                                      codec_, static_cast<int>(range_.chunks));  // activations cross stages in the compute dtype
  if (comp.tp.name != "none" && d_.tp) {  // before SC's calibration step and evaluation (TP all-reduces)
    d_.tp->set_all_reduce_wire_dtype(Traffic::kTensorParallel, comp.tp.name == "fp16" ? torch::kHalf : torch::kBFloat16);
  }
  pipeline_ = make_schedule(cfg_.parallel.schedule, static_cast<int>(cfg_.parallel.virtual_stages));
  stage_fn_ = std::make_unique<GptStageFunctions>(model_, m_);
}

// SC: which stages compress their DP gradients (dp_stages: all | way | auto), then DP gradients
// and the tied-embedding sync (baseline pair or FE).
void Trainer::build_gradient_sync() {
  const auto& comp = cfg_.compression;
  sc_compress_.assign(stages_, false);
  if (comp.dp_stages == DpStages::automatic()) choose_sc_auto();  // the calibration's answer per stage
  for (int k = 0; k < stages_; ++k) {
    sc_compress_[k] = stage_compresses_dp(comp.dp_stages, k, stages_, comp.dp.name != "none", sc_compress_[k]);
  }
  grad_sync_ = std::make_unique<GradientSync>(cfg_, model_, d_.dp.get(), d_.embedding.get(), d_.fused_embedding.get(),
                                              coord_.pp, static_cast<bool>(sc_compress_[coord_.pp]));
  if (comp.diloco_on()) outer_ = std::make_unique<OuterSync>(cfg_, model_, d_.dp.get(), d_.embedding.get());
}

// dp_stages: auto. A resumed run keeps the checkpoint's choice; otherwise one calibration step.
void Trainer::choose_sc_auto() {
  std::optional<torch::Tensor> stored;
  if (resume_from_) stored = read_checkpoint_tensor(*resume_from_, d_.rank(), "sc_auto", "compress");
  if (stored && stored->numel() == stages_) {
    for (int k = 0; k < stages_; ++k) sc_compress_[k] = (*stored)[k].item<int64_t>() != 0;
    sc_auto_text_ = "kept from the checkpoint";
  } else {
    const ScChoice c = calibrate_sc_auto(cfg_, d_, model_, *pipeline_, *stage_fn_, act_shape_, m_, data_);
    sc_compress_ = c.compress;
    for (int k = 0; k < stages_; ++k) {
      sc_auto_text_ += fmt::format("{}stage {}: end {:.1f} ms + raw DP {:.1f} ms {} stage 0's end + compressed DP "
                                   "{:.1f} ms -> {}",
                                   k ? "; " : "", k, 1e3 * c.end[k], 1e3 * c.raw[k],
                                   c.compress[k] ? ">" : "<=", 1e3 * (c.end[0] + c.comp0[0]),
                                   c.compress[k] ? "compress" : "raw");
    }
  }
  if (!quiet_) spdlog::info("compression.dp_stages = auto: {}", sc_auto_text_);
}

// What a checkpoint holds besides model and optimizer, in this order: gradient sync's reducers,
// SC auto's choice, the pipeline codec.
void Trainer::build_checkpoint_parts() {
  const auto& comp = cfg_.compression;
  checkpoint_parts_ = grad_sync_->checkpoint_parts();
  if (outer_) {
    for (auto& part : outer_->checkpoint_parts()) checkpoint_parts_.push_back(std::move(part));
  }
  if (sc_way(cfg_) < 0) {
    checkpoint_parts_.push_back({"sc_auto", "auto",
                                 [sc = sc_compress_](auto& a) {
                                   std::vector<int64_t> v(sc.begin(), sc.end());
                                   a.write("compress", torch::tensor(v, torch::kLong));
                                 },
                                 [](auto&) {}});  // read before GradientSync, see choose_sc_auto
  }
  if (scaler_->enabled()) {
    DynamicLossScaler* s = scaler_.get();
    checkpoint_parts_.push_back({"loss_scaler", "dynamic", [s](auto& a) { s->save(a); }, [s](auto& a) { s->load(a); }});
  }
  if (codec_->compresses_backward() || codec_->compresses_forward()) {
    // The messages this rank encodes, so that loading checks the saved Q / LEP buffers against them.
    int64_t slice = 1;
    for (int64_t n : act_shape_) slice *= n;
    if (link_->scatter_gather(act_shape_)) slice /= cfg_.parallel.tp;
    // Chunks that send: forward all but the last stage's last, backward all but the first stage's first.
    const int chunks = static_cast<int>(range_.chunks);
    std::vector<int> backward_chunks;
    for (int c = range_.is_first ? 1 : 0; c < chunks; ++c) backward_chunks.push_back(c);
    codec_->expect_messages(range_.is_last && chunks == 1 ? 0 : slice, backward_chunks.empty() ? 0 : slice, m_,
                            backward_chunks);
    PipelineCodec* c = codec_.get();
    checkpoint_parts_.push_back({"pipeline_codec",
                                 fmt::format("fwd={} bwd={} phases={} lep={}", to_yaml_value(comp.pipeline_forward),
                                             to_yaml_value(comp.pipeline_backward), to_string(comp.backward_phases), to_string(comp.lep)),
                                 [c](auto& a) { c->save(a); }, [c](auto& a) { c->load(a); }});
  }
}

// Model, optimizer, step, data position, generators and every checkpoint part, from resume_from_.
void Trainer::resume() {
  if (!resume_from_) return;
  check_resume_config();
  state_ = load_checkpoint(*resume_from_, *model_, *optimizer_, layout_, {{"attention", model_->attention_generator()}},
                           checkpoint_parts_);
  if (!quiet_) {
    spdlog::info("resumed from {} at step {}{}", *resume_from_, state_.step, options_.resume ? "" : " (--resume auto)");
  }
}

// This run's config against the checkpoint's (resume_check.h), before anything is loaded: refused
// with every changed key unless --allow-config-change, then logged and recorded.
void Trainer::check_resume_config() {
  const CheckpointFile saved = read_checkpoint_file(*resume_from_, layout_.rank, /*with_parameters=*/false);
  const auto changes = resume_config_changes(saved.config_yaml, config_yaml_, to_yaml(Config()));
  if (changes.empty()) return;
  const std::string listed = describe_changes(changes);
  if (!options_.allow_config_change) {
    throw ConfigError(fmt::format(
        "resume from {} (step {}): this run's config changes {} key{} a resume keeps as the checkpoint has them "
        "(checkpoint value -> this run's):\n{}Fix: resume with the checkpoint's values, or start a new run (another "
        "log.run_name and checkpoint.dir); or pass --allow-config-change to continue as a changed experiment (the "
        "changes are logged and kept in the results' resume_config_changes). A resume may change: {}.",
        *resume_from_, saved.step, changes.size(), changes.size() == 1 ? "" : "s", listed,
        fmt::join(resume_mutable_keys(), ", ")));
  }
  resume_config_changes_ = listed;
  if (!quiet_) spdlog::warn("resume with --allow-config-change: changed from the checkpoint's config:\n{}", listed);
}

// Fixed widths of the per-step record gather and the DP tensor names of every rank (world
// collectives), the data loader at the resumed position, and the results file (rank 0).
void Trainer::build_records() {
  extras_ = std::make_unique<StepExtras>();
  extras_->dp_reducer = &grad_sync_->dp_reducer();
  extras_->codec = codec_.get();
  auto n = torch::tensor({static_cast<int64_t>(grad_sync_->dp_tensor_names().size())}, torch::kLong);
  d_.world->all_reduce(n, Traffic::kControl, /*max=*/true);
  extras_->max_dp_tensors = n.item<int64_t>();
  extras_->max_orth_pairs = cfg_.log.lep_orthogonality ? std::max<int64_t>(0, m_ - 1) : 0;
  extras_->max_lep_sends = cfg_.log.lep_diagnostics ? m_ : 0;
  all_dp_names_ = gather_names(d_, grad_sync_->dp_tensor_names());
  sc_stages_ = sc_stages_text(cfg_, sc_compress_);
  if (range_.is_first || range_.is_last) {  // the stages that load micro-batches
    loader_ = std::make_unique<BatchLoader>(data_.train, cfg_.model.seq_len, cfg_.train.micro_batch_size, coord_.dp,
                                            cfg_.parallel.dp, state_.consumed_samples, d_.placement.device);
  }
  summary_.first_step = state_.step;
  on_every_rank("creating the results file", [&] {
    if (!writer_) return;
    sink_ = create_results(cfg_, state_.step, result_attributes(), quiet_);
    summary_.results_path = sink_->path();
  });
  tokens_per_step_ = cfg_.train.global_batch_size * cfg_.model.seq_len;
}

std::map<std::string, std::string> Trainer::result_attributes() const {
  const auto& comp = cfg_.compression;
  auto attrs = run_attributes(options_.command_line);
  attrs["config"] = config_yaml_;
  attrs["layout"] = fmt::format("tp={} pp={} dp={}", cfg_.parallel.tp, cfg_.parallel.pp, cfg_.parallel.dp);
  attrs["rank_table"] = rank_table(d_);
  attrs["stage_layers"] = stage_layers_text(cfg_);
  attrs["launcher"] = d_.env.source;
  attrs["resumed_from_step"] = std::to_string(state_.step);
  attrs["resume_config_changes"] = resume_config_changes_;  // "" unless --allow-config-change changed keys
  attrs["network_emulation"] = cfg_.network.emulate ? "on" : "off";
  attrs["network"] = network_summary(cfg_.network);  // effective values (profile applied)
  attrs["trainable_result"] = cfg_.network.skip.empty() ? "true" : "false";  // skipped transfers
  attrs["compression_dp"] = to_yaml_value(comp.dp);
  attrs["compression_scheme"] = comp.scheme.empty() ? "(none)" : comp.scheme;
  attrs["compression"] = compression_label(comp);  // what the run compresses: its name in tables and figures
  attrs["compression_summary"] = fmt::format(
      "dp={} dp_stages={} [{}] uncompressed_dp_dtype={} embedding={} fused_embedding={} pipeline_forward={} "
      "pipeline_backward={} backward_phases={} lep={} tp={}",
      to_yaml_value(comp.dp), comp.dp_stages.text(), sc_stages_, uncompressed_dp_dtype(cfg_), to_yaml_value(comp.embedding),
      comp.fused_embedding,
      to_yaml_value(comp.pipeline_forward), to_yaml_value(comp.pipeline_backward), to_string(comp.backward_phases), to_string(comp.lep),
      to_yaml_value(comp.tp));
  // BR-05: which reconstruction the error-feedback residual subtracts, when the reducer has one.
  attrs["dp_ef_residual"] = make_dp_reducer(cfg_, /*compresses=*/true)->ef_residual();
  attrs["dp_tensor_names"] = nlohmann::json(all_dp_names_).dump();
  if (!sc_auto_text_.empty()) attrs["sc_auto"] = sc_auto_text_;
  if (!network_regime_.empty()) attrs["network_regime"] = network_regime_;
  attrs["traffic_classes"] = "0 tp, 1 pp_fwd, 2 pp_bwd, 3 dp, 4 embedding, 5 control; link 0 intra, 1 inter";
  if (!cfg_.log.timeline_steps.empty()) {
    for (auto& [k, v] : timeline_attributes()) attrs[k] = v;
  }
  return attrs;
}

void Trainer::log_start() const {
  if (quiet_) return;
  const auto& comp = cfg_.compression;
  spdlog::info("model: {} layers, h={}, heads={}, seq={}, vocab={} (padded {}); layout tp={} pp={} dp={}, stages {}",
               cfg_.model.num_layers, cfg_.model.hidden_size, cfg_.model.num_heads, cfg_.model.seq_len,
               cfg_.model.vocab_size, cfg_.padded_vocab_size(), cfg_.parallel.tp, cfg_.parallel.pp, cfg_.parallel.dp,
               stage_layers_text(cfg_));
  if (d_.env.world_size > 1) spdlog::info("ranks ({} launcher):\n{}", d_.env.source, rank_table(d_));
  if (const std::string shared = shared_hostnames(d_); !shared.empty()) {
    spdlog::warn("hosts with different addresses share a hostname: {}; the nodes are told apart by address", shared);
  }
  if (!d_.placement.decided.empty()) spdlog::info("placement (rank 0): {}", d_.placement.decided);
  // The model's GEMMs and the compressors' thin ones, as this process runs them (kernels/gemm.h, thin_gemm.h).
  const bool fp32 = cfg_.train.precision == "fp32";
  const int64_t steps = cfg_.train.train_steps;
  spdlog::info("training {} step{} of {} sequences ({} micro-batches of {} per replica), threads per rank: {}, "
               "precision {}{}, GEMMs: {}, attention: {} ({}), compressors' thin GEMMs: {}, heap: {}; results -> {}",
               steps, steps == 1 ? "" : "s", cfg_.train.global_batch_size, m_, cfg_.train.micro_batch_size,
               at::get_num_threads(), cfg_.train.precision, fp32 ? "" : " (fp32 master weights, optimizer and compressor state)",
               d_.placement.on_gpu() ? "ATen (CUDA)" : compute_gemm_library(precision_dtype(cfg_.train.precision)),
               attention_kernel_name(attention_kernel_used(attention_kernel(cfg_.model.attention), d_.placement.on_gpu(),
                                                           cfg_.model.attention_dropout, /*training=*/true)),
               cfg_.model.attention,
               d_.placement.on_gpu() ? "ATen (CUDA)" : "kernels/thin_gemm.h, " + thin_gemm_isa(), cpu_allocator(),
               summary_.results_path);
  // The backward phases and the LEP variant only act on compressed backward sends: name them then.
  const std::string lep = comp.lep == LepMode::kLazyDecay ? fmt::format("lazy_decay {}", comp.lep_decay) : to_string(comp.lep);
  const std::string bwd_how =
      comp.pipeline_backward.name == "none" ? "" : fmt::format(" ({}, lep {})", to_string(comp.backward_phases), lep);
  const std::string dp_wire = uncompressed_dp_dtype(cfg_);
  spdlog::info("compression: {}; dp={} (stages c = compressed: [{}]{}), embedding={}{}, pipeline fwd={} bwd={}{}, tp={}",
               compression_label(comp), to_yaml_value(comp.dp), sc_stages_,
               dp_wire == "fp32" ? "" : fmt::format("; uncompressed stages all-reduce in {}, summed in fp32", dp_wire),
               to_yaml_value(comp.embedding), comp.fused_embedding ? " fused (FE)" : "",
               to_yaml_value(comp.pipeline_forward), to_yaml_value(comp.pipeline_backward), bwd_how,
               to_yaml_value(comp.tp));
  log_network(cfg_.network, d_.layout);
  if (sink_) spdlog::info("results file: {}", projection_text(project_results(cfg_), cfg_.train.train_steps));
}

// Per-rank events of log.timeline_steps (timeline.h): one clock per run, every rank's origin taken
// right after a common barrier.
void Trainer::start_timeline() {
  timeline_ = std::make_unique<Timeline>(cfg_.log.timeline_steps);
  if (timeline_->empty()) return;
  d_.world->barrier();
  timeline_->set_origin(monotonic_ns());
}

// ---- Trainer: the loop -------------------------------------------------------------------------

TrainSummary Trainer::run() {
  // The untrained model's loss (about ln V) anchors the curve; eval_interval 0 = only at the end.
  if (state_.step == 0 && cfg_.train.eval_interval > 0) evaluate(0);
  params_ = model_->parameters();
  while (state_.step < cfg_.train.train_steps) {
    auto recording = std::make_unique<Timeline::StepGuard>(timeline_.get(), state_.step + 1);  // selected steps only
    const StepResult r = step();
    log_progress(r);
    if (r.stop_signal != 0) {  // agreed by every rank in this step's flag all-reduce
      stop_on_signal(r.stop_signal);
      return summary_;
    }
    if (cfg_.train.eval_interval > 0 && state_.step % cfg_.train.eval_interval == 0 &&
        state_.step != cfg_.train.train_steps) {
      evaluate(state_.step);
    }
    const bool periodic = cfg_.checkpoint.interval > 0 && state_.step % cfg_.checkpoint.interval == 0;
    const bool final = cfg_.checkpoint.save_final && state_.step == cfg_.train.train_steps;
    if (periodic || final) save();
    if (recording->recording()) {  // a world collective on every rank alike (same selected steps)
      recording.reset();
      const std::string line = record_timeline_step(d_, sink_.get(), *timeline_);
      if (!quiet_ && !line.empty()) spdlog::info("{}", line);
    }
  }
  evaluate(state_.step);
  flush_results();
  summary_.last_step = state_.step;
  if (options_.keep_parameters) {
    for (const auto& p : model_->named_parameters()) summary_.parameters[p.key()] = p.value().detach().clone();
  }
  return summary_;
}

// SIGTERM / SIGUSR1 (stop_signal.h): the step is complete on every rank; checkpoint it, flush the
// results and return (train_command exits kStoppedExitCode). No evaluation: the time is the
// batch system's.
void Trainer::stop_on_signal(int signal) {
  save();
  flush_results();
  summary_.last_step = state_.step;
  summary_.stopped_by_signal = signal;
  if (writer_) spdlog::warn("stopping on {} at step {}; checkpoint -> {} (exit {}; continue with --resume auto)",
               signal_name(signal), state_.step, summary_.last_checkpoint, kStoppedExitCode);
}

// One iteration (docs/design.md §1.2): pipeline schedule -> gradient sync -> clip -> optimizer -> records.
Trainer::StepResult Trainer::step() {
  auto step_event = std::make_unique<TimelineScope>(EventKind::kStep, Stream::kStep);
  const auto t0 = Clock::now();
  StepResult r;
  if (options_.on_step_state) options_.on_step_state(state_.step + 1, d_.rank(), checkpoint_parts_);
  r.lr = lr_.at(state_.step);
  set_lr(*optimizer_, r.lr);
  optimizer_->zero_grad();
  stage_fn_->batches.clear();
  for (int64_t i = 0; i < m_ && loader_; ++i) stage_fn_->batches.push_back(loader_->next());
  if (codec_->compresses_backward() || codec_->compresses_forward()) {  // put back if the step is skipped
    codec_before_step_ = std::make_unique<PipelineCodecSnapshot>(codec_->snapshot());
  }
  r.loss_scale = scaler_->scale();
  stage_fn_->loss_scale = r.loss_scale;
  codec_->begin_step();
  memory_->reset_peak();
  const int64_t before_schedule = memory_->allocated();
  const auto pipe = run_pipeline_step(*pipeline_, *stage_fn_, *link_, static_cast<int>(m_));
  codec_->end_step();  // lep: lazy_iteration drops its buffer here
  const int64_t activations_peak = memory_->peak() - before_schedule;
  update(r);  // gradient sync, clip, AdamW (or skip, BR-01)
  if (outer_) outer_->after_step(state_.step);  // dp_strategy: diloco, the fragments due after this step
  // The loss lives on the last stage: average over data-parallel replicas, known everywhere.
  // (fp16: the schedule's losses carry the scale S; dividing is exact for a power-of-two S.)
  auto loss_t = torch::tensor({range_.is_last && coord_.tp == 0 ? pipe.loss / r.loss_scale / cfg_.parallel.dp : 0.0},
                              torch::kDouble);
  d_.world->all_reduce(loss_t, Traffic::kControl);
  r.loss = loss_t.item<double>();
  if (!std::isfinite(r.loss)) {
    throw std::runtime_error(fmt::format("training diverged: loss is {} at step {}. Fix: lower "
                                         "train.lr or raise train.warmup_steps.",
                                         r.loss, state_.step));
  }
  synchronize(d_.placement.device);  // CUDA: the step ends when the GPU has finished it
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  step_event.reset();
  extras_->pipeline_compute_seconds = pipe.compute_seconds;
  record_step(r, pipe.seconds, activations_peak);
  return r;
}

// The overflow check (loss_scaler.h: local gradients, agreed over the world, before any reduction
// or compression; a skip puts the codec back and updates nothing), unscaling (fp16), then gradient
// sync (DP with SC, then embedding: pair or FE), global-norm clipping, AdamW; a non-finite gradient
// found by a reducer still skips the optimizer step on every rank (grad_sync.h). Counts the step.
void Trainer::update(StepResult& r) {
  const auto grads = ensure_grads(params_);
  if (options_.on_local_gradients) options_.on_local_gradients(state_.step + 1, d_.rank(), grads);
  // One max all-reduce carries the flags: a local overflow, a stop signal (stop_signal.h), and the
  // lowest rank with an overflow (as world size - rank).
  const bool overflow = has_local_overflow(grads, grad_sync_->wire_overflow_limit());
  auto flags = torch::tensor({overflow ? 1.0 : 0.0, static_cast<double>(stop_signal_received()),
                              overflow ? static_cast<double>(d_.env.world_size - d_.rank()) : 0.0},
                             torch::kDouble);
  d_.world->all_reduce(flags, Traffic::kControl, /*max=*/true);
  r.skipped = flags[0].item<double>() > 0;
  r.stop_signal = static_cast<int>(flags[1].item<double>());
  if (r.skipped && !scaler_->enabled() && !cfg_.train.skip_nonfinite) {
    stop_on_nonfinite_gradients(d_.env.world_size - static_cast<int>(flags[2].item<double>()));
  }
  if (r.skipped) {
    scaler_->update(/*overflow=*/true);
    skip_step(r, grads);
    return;
  }
  codec_before_step_.reset();
  if (r.loss_scale != 1.0) {
    torch::NoGradGuard no_grad;
    for (const auto& g : grads) g.mul_(1.0 / r.loss_scale);  // exact for a power-of-two S (the defaults)
  }
  const bool finite = grad_sync_->reduce(params_, state_.step, r.loss_scale);
  if (!finite) {  // BR-01: NaN norm here reaches every rank through the model-parallel all-reduce
    for (const auto& p : params_) p.grad().fill_(std::numeric_limits<float>::quiet_NaN());
  }
  r.grad_norm = global_grad_norm(model_, d_.model_parallel.get(), coord_.tp, stages_);
  if (std::isfinite(r.grad_norm)) {
    scaler_->update(/*overflow=*/false);
    TimelineScope optimizer_event(EventKind::kOptimizer, Stream::kCompute);
    clip_grads_to(params_, r.grad_norm, cfg_.train.clip_grad);
    optimizer_->step();
  } else {
    // Finite local gradients, a non-finite result: the reduction or the compressor's own state
    // (an error-feedback or LEP buffer) made it. Skipped like an overflow, and counted; in fp32/bf16
    // without train.skip_nonfinite, the state check names the poisoned buffer, or the run stops here.
    scaler_->update(/*overflow=*/true);
    r.skipped = true;
    if (!scaler_->enabled() && !cfg_.train.skip_nonfinite) {
      check_state_after_skip();
      throw std::runtime_error(fmt::format(
          "training stopped: the gradient sync made non-finite gradients from finite ones at step {} (norm {}, "
          "train.precision {}). Fix: check the DP compressor's settings, resume from the last checkpoint; or set "
          "train.skip_nonfinite: true to skip such steps",
          state_.step + 1, r.grad_norm, cfg_.train.precision));
    }
    if (!quiet_) {
      spdlog::warn("step {}: non-finite gradients after the gradient sync (norm {}); optimizer step skipped on every "
                   "rank", state_.step + 1, r.grad_norm);
    }
    count_skipped_step(r);
  }
  state_.step += 1;
  state_.consumed_samples += cfg_.train.global_batch_size;
}

// fp32/bf16 without train.skip_nonfinite: inf/NaN in some rank's local gradients is a fault (no loss
// scale to blame); every rank stops, naming the lowest such rank, the step and, on that rank, the first
// non-finite gradient. Nothing of the step is applied or saved.
void Trainer::stop_on_nonfinite_gradients(int first_rank) {
  std::string tensor;
  if (d_.rank() == first_rank) {
    for (const auto& p : model_->named_parameters()) {
      const auto& g = p.value().grad();
      if (g.defined() && !torch::isfinite(g).all().item<bool>()) {
        tensor = fmt::format(" (the first non-finite gradient: {}, {} of {} values)", p.key(),
                             (~torch::isfinite(g)).sum().item<int64_t>(), g.numel());
        break;
      }
    }
  }
  throw std::runtime_error(fmt::format(
      "training stopped: inf/NaN gradients on rank {} at step {}{}, train.precision {}. Without a loss scale "
      "this is a fault, not an overflow: nothing of the step was applied or saved. Fix: resume from the last "
      "checkpoint (checkpoint.interval sets how often one is written) with --set train.skip_nonfinite=true to "
      "skip such steps (at most train.max_skipped_steps in a row), or with a lower train.lr or a longer "
      "train.warmup_steps (a changed schedule needs --allow-config-change)",
      first_rank, state_.step + 1, d_.rank() == first_rank ? tensor : fmt::format(" (rank {}'s error names the tensor)", first_rank),
      cfg_.train.precision));
}

// An overflow agreed by the world (loss_scaler.h step 3): the pipeline codec is put back as it was
// before the step, the gradients are dropped, nothing is updated; the step and the data position
// advance.
void Trainer::skip_step(StepResult& r, const std::vector<torch::Tensor>& grads) {
  if (codec_before_step_) codec_->restore(std::move(*codec_before_step_));
  codec_before_step_.reset();
  for (const auto& g : grads) g.zero_();
  r.grad_norm = std::numeric_limits<double>::quiet_NaN();
  if (!quiet_) {
    spdlog::warn("step {}: inf/NaN gradients on some rank (loss scale {}); step skipped on every rank, nothing "
                 "updated{}", state_.step + 1, r.loss_scale,
                 scaler_->enabled() ? fmt::format(", loss scale now {}", scaler_->scale()) : "");
  }
  count_skipped_step(r);
  state_.step += 1;
  state_.consumed_samples += cfg_.train.global_batch_size;  // the batch is consumed (documented)
}

// Every skipped step, whatever found it: counted (summary, /train's `skipped`); the first of a run
// of skips checks the compressor and optimizer state for NaN/inf (a poisoned buffer skips every
// later step); too many skips in a row end the run with the scale and the fix.
void Trainer::count_skipped_step(StepResult& r) {
  summary_.skipped_steps += 1;
  if (scaler_->skipped_in_a_row() == 1) check_state_after_skip();
  const int64_t limit = cfg_.train.max_skipped_steps;
  if (limit > 0 && scaler_->skipped_in_a_row() > limit) {
    throw std::runtime_error(fmt::format(
        "training stopped: {} steps in a row skipped on inf/NaN gradients (step {}, train.precision {}, loss "
        "scale {}). Fix: {}; or raise train.max_skipped_steps (0 = no limit).",
        scaler_->skipped_in_a_row(), state_.step + 1, cfg_.train.precision, r.loss_scale,
        scaler_->enabled() ? "the scale is at or near train.loss_scale_min: lower train.lr, raise "
                             "train.warmup_steps, or use train.precision: bf16"
                           : "lower train.lr or raise train.warmup_steps"));
  }
}

// NaN/inf in this rank's optimizer or compressor state (checkpoint.h: non_finite_state), agreed by
// the world: found, the run stops, naming the buffers and the ranks; nothing poisoned is saved.
void Trainer::check_state_after_skip() {
  on_every_rank("the state check after a skipped step", [&] {
    const auto bad = non_finite_state(*optimizer_, checkpoint_parts_);
    if (bad.empty()) return;
    std::string names;
    for (size_t i = 0; i < bad.size() && i < 5; ++i) names += (i ? ", " : "") + bad[i];
    if (bad.size() > 5) names += fmt::format(" and {} more", bad.size() - 5);
    throw std::runtime_error(fmt::format(
        "training stopped at step {}: rank {} holds NaN or infinite values in its optimizer or compressor state "
        "({} tensor{}: {}); every later step would be skipped. Nothing of it was saved. Fix: resume from the last "
        "checkpoint (--resume auto){}",
        state_.step + 1, d_.rank(), bad.size(), bad.size() == 1 ? "" : "s", names,
        summary_.last_checkpoint.empty() ? "" : " or --resume " + summary_.last_checkpoint));
  });
}

// Memory components, every rank's traffic and compressor records (a world all-gather), /train.
void Trainer::record_step(const StepResult& r, double pipeline_seconds, int64_t activations_peak) {
  seconds_run_ += r.seconds;
  summary_.train_losses.push_back(r.loss);
  int64_t param_bytes = 0, grad_bytes = 0;
  for (const auto& p : params_) param_bytes += bytes_of(p), grad_bytes += bytes_of(p.grad());
  const GradReducer* emb = grad_sync_->embedding_reducer();
  const GradReducer& dpr = grad_sync_->dp_reducer();
  extras_->memory = {param_bytes, grad_bytes, optimizer_state_bytes(*optimizer_), activations_peak,
                     codec_->lep_peak_bytes(), dpr.error_feedback_bytes() + (emb ? emb->error_feedback_bytes() : 0),
                     dpr.factor_bytes() + (emb ? emb->factor_bytes() : 0) + codec_->codec_state_bytes(), memory_->peak(),
                     outer_ ? outer_->state_bytes() : 0};
  extras_->tensor_detail = state_.step % cfg_.log.interval == 0 || state_.step == cfg_.train.train_steps;
  record_rank_stats(d_, sink_.get(), state_.step, pipeline_seconds, r.seconds, *extras_);
  summary_.loss_scales.push_back(r.loss_scale);
  if (sink_) {
    sink_->append("train", {state_.step, r.loss, r.lr, r.grad_norm, r.seconds, tokens_per_step_ / r.seconds, r.loss_scale,
                            int64_t{r.skipped}});
  }
}

void Trainer::log_progress(const StepResult& r) {
  if (state_.step % cfg_.log.interval != 0 && state_.step != cfg_.train.train_steps) return;
  flush_results();
  const double avg = seconds_run_ / static_cast<double>(state_.step - summary_.first_step);
  if (!quiet_) {
    spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f}{} | {:>8.0f} tok/s | "
                 "{:.0f} ms/step | ETA {}",
                 state_.step, cfg_.train.train_steps, r.loss, r.lr, r.grad_norm,
                 scaler_->enabled() ? fmt::format(" | loss scale {} ({} skipped)", scaler_->scale(), summary_.skipped_steps)
                                    : "",
                 tokens_per_step_ / avg, avg * 1e3, format_eta(avg * (cfg_.train.train_steps - state_.step)));
  }
}

// The validation loss at `step` (see validation_loss), into the summary, /eval and the log.
void Trainer::evaluate(int64_t step) {
  if (!data_.valid) return;  // empty validation split (the same on every rank)
  TimelineScope eval_event(EventKind::kEvaluation, Stream::kCompute);
  const TrafficMeter before = d_.meter;  // /traffic is per training step: evaluation's bytes are not counted
  std::optional<OuterSync::GlobalWeights> global;  // dp_strategy: diloco: the global model (outer_sync.h)
  if (outer_) global.emplace(outer_->global_weights());
  const double loss = validation_loss(model_, cfg_, d_, *codec_, act_shape_, data_.valid.get());
  global.reset();  // the replica's own weights back before anything else reads them
  d_.meter = before;
  const Perplexity ppl = perplexity(loss);  // NaN stays NaN; a capped value is marked
  summary_.eval_losses.push_back(loss);
  if (sink_) sink_->append("eval", {step, loss, ppl.value, int64_t{ppl.capped}});
  flush_results();
  if (quiet_) return;
  if (!outer_) {
    spdlog::info("eval  step {:>6} | {}", step, eval_text(loss, ppl));
    return;
  }
  // DiLoCo evaluates the global model (outer_sync.h): say which syncs it holds, and at the run's end
  // when the steps since the last one are not in it.
  const DilocoConfig& o = cfg_.compression.diloco;
  std::vector<int64_t> landed;
  for (int64_t f = 0; f < o.fragments; ++f) {
    landed.push_back(outer_last_landed_sync(f, step, o.inner_steps, o.fragments, o.sync_delay));
  }
  const int64_t oldest = *std::min_element(landed.begin(), landed.end());
  spdlog::info("eval  step {:>6} | {} | the global model: {}", step, eval_text(loss, ppl),
               o.fragments == 1 ? (landed[0] > 0 ? fmt::format("outer sync of step {}", landed[0])
                                                 : std::string("the initial weights (no outer sync yet)"))
                                : fmt::format("fragments' outer syncs of steps {}{}", fmt::join(landed, ", "),
                                              oldest == 0 ? " (0: not synced yet, the initial weights)" : ""));
  if (step == cfg_.train.train_steps && step > 0 && oldest < step) {
    const int64_t next = o.inner_steps * std::max<int64_t>(1, (step - o.sync_delay + o.inner_steps - 1) / o.inner_steps) +
                         o.sync_delay;  // the first step >= this one after which a whole-model sync has landed
    spdlog::warn(
        "the final evaluation (step {}) measures DiLoCo's global model, whose {} synced after step {}: the last {} "
        "steps of each replica are not in it. {}",
        step, o.fragments == 1 ? "weights were last" : "oldest fragment was last", oldest, step - oldest,
        o.fragments == 1
            ? fmt::format("To evaluate a model that holds every step, end the run where a sync lands: train.train_steps "
                          "= k * diloco.inner_steps + diloco.sync_delay (here {})",
                          next)
            : std::string("Streaming DiLoCo syncs its fragments at staggered steps, so some fragment is always behind"));
  }
}

// This rank's checkpoint of the step just completed; every rank waits in the world barrier.
void Trainer::save() {
  TimelineScope checkpoint_event(EventKind::kCheckpoint, Stream::kCompute);
  const TrafficMeter before = d_.meter;  // the checkpoint's agreement is not the step's traffic
  flush_results();
  const auto all_written = [&](bool ok) {  // every rank's file in place? (checkpoint.h)
    auto flag = torch::tensor({ok ? 0.0 : 1.0}, torch::kDouble);
    d_.world->all_reduce(flag, Traffic::kControl, /*max=*/true);
    return flag.item<double>() == 0.0;
  };
  if (fs::path(summary_.last_checkpoint) == fs::path(cfg_.checkpoint_dir()) / fmt::format("iter_{:07d}", state_.step)) {
    return;  // this step's checkpoint is written (a stop signal on a checkpoint step)
  }
  summary_.last_checkpoint = save_checkpoint(cfg_.checkpoint_dir(), state_, *model_, *optimizer_, layout_, config_yaml_,
                                             cfg_.checkpoint.keep, all_written,
                                             {{"attention", model_->attention_generator()}}, checkpoint_parts_);
  d_.meter = before;
  if (!quiet_) spdlog::info("checkpoint -> {}", summary_.last_checkpoint);
}

TrainSummary run_training(Config cfg, const TrainOptions& options, Distributed& d) {
  Trainer trainer(std::move(cfg), options, d);
  return trainer.run();
}

}  // namespace optcc

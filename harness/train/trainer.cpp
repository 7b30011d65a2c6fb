#include "harness/train/trainer.h"

#include <spdlog/spdlog.h>

#include <array>
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
#include "harness/train/data_loader.h"
#include "harness/parallel/distributed.h"
#include "harness/train/grad_sync.h"
#include "harness/records/memory_tracker.h"
#include "harness/records/metrics.h"
#include "harness/train/optimizer.h"
#include "harness/train/pipeline_codec.h"
#include "harness/parallel/pipeline_runner.h"
#include "harness/records/run_info.h"
#include "harness/train/run_records.h"
#include "harness/parallel/stage_link.h"
#include "harness/parallel/threads.h"

namespace optcc {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

std::string format_eta(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds));
  return fmt::format("{:02d}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

struct RunData {
  std::shared_ptr<const data::GptDataset> train, valid;
};

RunData open_data(const Config& c) {
  const std::string prefix = c.data.prefix;
  if (!fs::exists(prefix + ".idx") || !fs::exists(prefix + ".bin")) {
    throw std::runtime_error(fmt::format(
        "data error: the indexed dataset {}.bin/.idx (data.prefix) does not exist. Fix: run "
        "`optcc data fetch --config {}` and `optcc data prepare --config {}` first.",
        prefix, c.source_path, c.source_path));
  }
  auto indexed = std::make_shared<const data::IndexedDataset>(prefix);
  const data::DatasetVocab vocab = data::dataset_vocab(*indexed);  // .json, or one scan of the .bin
  check_dataset_vocab(c, vocab.min_token_id, vocab.max_token_id, vocab.vocab_size);
  const auto splits = data::split_documents(indexed->num_documents(), c.data.split);
  const std::string cache = (fs::path(c.data.dir) / "cache").string();
  const auto seed = static_cast<uint64_t>(c.train.seed);
  RunData d;
  d.train = std::make_shared<const data::GptDataset>(
      indexed, splits[0],
      data::GptDatasetOptions{c.model.seq_len, c.train.train_steps * c.train.global_batch_size, seed, cache, "train"});
  if (splits[1].end_doc > splits[1].begin_doc) {
    d.valid = std::make_shared<const data::GptDataset>(
        indexed, splits[1],
        data::GptDatasetOptions{c.model.seq_len, c.train.eval_iters * c.train.micro_batch_size * c.parallel.dp, seed,
                                cache, "valid"});
  }
  return d;
}

// What the pipeline runner calls on this rank: embed on the first stage, this stage's blocks, the
// loss on the last stage. Micro-batch data is loaded before each step by the stages that need it.
class GptStageFunctions final : public StageFunctions {
 public:
  GptStageFunctions(GptModel& model, int64_t microbatches) : model_(model), m_(microbatches) {}
  std::vector<torch::Tensor> batches;  // [b, s + 1] per micro-batch (first and last stage)

  torch::Tensor forward(int mb, const torch::Tensor& input) override {
    const auto& st = model_->stage();
    torch::Tensor x;
    if (st.is_first || st.is_last) TORCH_CHECK(mb < static_cast<int>(batches.size()), "no data for micro-batch ", mb);
    const int64_t s = st.is_first || st.is_last ? batches[mb].size(1) - 1 : 0;
    x = st.is_first ? model_->embed(batches[mb].narrow(1, 0, s)) : input;
    x = model_->run_layers(x);
    if (!st.is_last) return x;
    return model_->head_loss(x, batches[mb].narrow(1, 1, s)) / static_cast<double>(m_);
  }

 private:
  GptModel& model_;
  int64_t m_;
};

StageRange stage_range(const Config& c, int stage) {
  const auto counts = c.stage_layer_counts();
  StageRange r;
  for (int k = 0; k < stage; ++k) r.first_layer += counts[k];
  r.num_layers = counts[stage];
  r.is_first = stage == 0;
  r.is_last = stage == c.parallel.pp - 1;
  return r;
}

// Evaluation never touches training state. Its pipeline messages go through a fork of the
// training codec (PipelineCodec::fork: the same options and a copy of the current warm-start Q /
// LEP buffers), so it measures the model with the compression training would apply at this step,
// and the training codec (its Q, generators, LEP buffers, stats, Fig. 11 records) is left as it
// was; each evaluation forks afresh, so its value does not depend on earlier evaluations. Dropout is
// off (eval mode); the default CPU and attention generators are restored all the same. Its data
// come from its own loader over the validation split; DP reducers are not used.
double evaluate(GptModel& model, const Config& c, Distributed& d, const PipelineCodec& codec,
                const std::vector<int64_t>& act_shape, const data::GptDataset* valid) {
  torch::NoGradGuard no_grad;
  StageLink link(*d.pp, d.tp.get(), StageLinkShapes{act_shape, act_shape}, torch::kFloat, codec.fork());
  auto cpu_gen = at::detail::getDefaultCPUGenerator();
  const torch::Tensor cpu_state = cpu_gen.get_state(), attention_state = model->attention_generator().get_state();
  model->eval();
  const auto& st = model->stage();
  std::unique_ptr<BatchLoader> loader;
  if (valid && (st.is_first || st.is_last)) {
    loader = std::make_unique<BatchLoader>(std::shared_ptr<const data::GptDataset>(valid, [](auto*) {}), c.model.seq_len,
                                           c.train.micro_batch_size, d.coord().dp, c.parallel.dp);
  }
  double sum = 0.0;
  for (int mb = 0; mb < c.train.eval_iters; ++mb) {
    torch::Tensor batch = loader ? loader->next() : torch::Tensor();
    const int64_t s = c.model.seq_len;
    auto x = st.is_first ? model->embed(batch.narrow(1, 0, s)) : link.recv_forward(mb);
    x = model->run_layers(x);
    if (st.is_last) {
      sum += model->head_loss(x, batch.narrow(1, 1, s)).item<double>();
    } else {
      link.send_forward(x, mb);
    }
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

// The checkpoint this run resumes from (nullopt: step 0), by TrainOptions' rules; before any work.
std::optional<std::string> resume_point(const Config& c, const TrainOptions& o) {
  if (o.resume) {
    if (!find_checkpoint(*o.resume)) {
      throw std::runtime_error(fmt::format(
          "--resume {}: no checkpoint there (no `latest` file, no rank_00000.pt). Fix: point --resume at a "
          "checkpoint.dir or one of its iter_NNNNNNN directories, or pass --resume auto, which starts at step 0 "
          "when checkpoint.dir holds no checkpoint.",
          *o.resume));
    }
    return o.resume;
  }
  const std::string dir = c.checkpoint_dir();
  const auto found = find_checkpoint(dir);
  if (found && !o.resume_auto) {
    throw std::runtime_error(fmt::format(
        "checkpoint.dir {} already holds a checkpoint ({}) of run '{}'; starting again at step 0 would mix two "
        "runs there. Fix: pass --resume auto (or --resume) to continue from it, or give this run its own "
        "log.run_name or checkpoint.dir, or remove {} to start over (results files are never overwritten).",
        dir, fs::path(*found).filename().string(), c.run_name(), dir));
  }
  return found;
}

// <log.dir>/<run>[.resumed-<step>].h5, or the first free <that>.attempt-<n>.h5 (n = 2, 3, ...) when it
// exists: an earlier attempt's results are never overwritten (the sink creates exclusively).
std::unique_ptr<Hdf5MetricsSink> create_results(const Config& c, int64_t first_step,
                                                const std::map<std::string, std::string>& attrs, bool quiet) {
  fs::create_directories(c.log.dir);
  std::string base = c.run_name();
  if (first_step > 0) base += fmt::format(".resumed-{}", first_step);
  const auto path = [&](int n) {
    return (fs::path(c.log.dir) / (n == 1 ? base + ".h5" : fmt::format("{}.attempt-{}.h5", base, n))).string();
  };
  for (int n = 1;; ++n) {
    try {
      auto sink = std::make_unique<Hdf5MetricsSink>(path(n), attrs, result_tables());
      if (n > 1 && !quiet) {
        spdlog::warn("{} exists (an earlier attempt's results, kept): this run writes {}", path(1), sink->path());
      }
      return sink;
    } catch (const ResultsFileExists&) {
      if (n >= 10000) throw;
    }
  }
}

std::string stage_layers_text(const Config& c) {
  std::string out;
  int64_t first = 0;
  for (auto n : c.stage_layer_counts()) {
    out += fmt::format("{}[{}, {})", out.empty() ? "" : " ", first, first + n);
    first += n;
  }
  return out;
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
  return o;
}

int64_t threads_for(const Config& cfg, int64_t local_ranks) {
  if (cfg.train.threads > 0) return cfg.train.threads;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  return std::max<int64_t>(1, hw / std::max<int64_t>(1, local_ranks));
}

TrainSummary run_training(Config cfg, const TrainOptions& options) {
  const LaunchEnv env = detect_launch_env(process_env(), this_hostname());
  const ParallelDims dims{static_cast<int>(cfg.parallel.tp), static_cast<int>(cfg.parallel.pp),
                          static_cast<int>(cfg.parallel.dp)};
  cfg.validate_layout(env.world_size);
  const int per_node = cfg.parallel.ranks_per_node > 0 ? static_cast<int>(cfg.parallel.ranks_per_node) : env.local_world_size;
  auto dist = init_distributed(dims, per_node, env,
                               std::chrono::milliseconds(static_cast<int64_t>(cfg.parallel.timeout_seconds * 1000)));
  return run_training(std::move(cfg), options, *dist);
}

namespace {

// SC `auto` (spec §6.5): one calibration step before training decides which stages compress.
struct ScChoice {
  std::vector<bool> compress;           // [stages]
  std::vector<double> end, raw, comp0;  // per stage: schedule end after a common barrier, raw DP
                                        // all-reduce time, stage 0's compressed time (s)
};

ScChoice calibrate_sc_auto(const Config& cfg, Distributed& d, GptModel& model, const PipelineSchedule& pipeline,
                           GptStageFunctions& fn, const std::vector<int64_t>& act_shape, int64_t m,
                           const RunData& data) {
  const RankCoord coord = d.coord();
  const int stages = static_cast<int>(cfg.parallel.pp);
  // Nothing of the run may change: generators are restored, the data position is not advanced,
  // the pipeline codec (LEP, Q) is not used (an uncompressed link), no optimizer step.
  auto cpu_gen = at::detail::getDefaultCPUGenerator();
  const torch::Tensor cpu_state = cpu_gen.get_state();
  const torch::Tensor attention_state = model->attention_generator().get_state();
  fn.batches.clear();
  if (model->stage().is_first || model->stage().is_last) {
    BatchLoader calib(data.train, cfg.model.seq_len, cfg.train.micro_batch_size, coord.dp, cfg.parallel.dp, 0);
    for (int64_t i = 0; i < m; ++i) fn.batches.push_back(calib.next());
  }
  StageLink plain(*d.pp, d.tp.get(), StageLinkShapes{act_shape, act_shape});
  auto params = model->parameters();
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  d.world->barrier();
  const auto t0 = Clock::now();
  run_pipeline_step(pipeline, fn, plain, static_cast<int>(m));
  const double end = std::chrono::duration<double>(Clock::now() - t0).count();
  auto grads = ensure_grads(params);
  std::vector<torch::Tensor> copy;
  for (const auto& g : grads) copy.push_back(g.clone());
  Registry<GradReducer> registry;
  register_builtin_grad_reducers(registry);
  auto timed = [&](const std::string& name, const YAML::Node& options) {
    auto reducer = registry.create(name, options);
    std::vector<torch::Tensor> work;
    for (const auto& g : copy) work.push_back(g.clone());
    d.dp->barrier();
    const auto t = Clock::now();
    reducer->reduce(work, *d.dp, 0);
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const double raw = d.dp->size() > 1 ? timed("none", YAML::Node()) : 0.0;
  const double comp = d.dp->size() > 1 && coord.pp == 0 ? timed(cfg.compression.dp.name, cfg.compression.dp.options) : 0.0;
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  fn.batches.clear();
  cpu_gen.set_state(cpu_state);
  model->attention_generator().set_state(attention_state);
  auto mine = torch::tensor({static_cast<double>(coord.pp), end, raw, comp}, torch::kDouble);
  auto all = d.world->all_gather(mine.unsqueeze(0), Traffic::kControl, 0);
  d.meter.reset();
  ScChoice c;
  c.end.assign(stages, 0.0), c.raw.assign(stages, 0.0), c.comp0.assign(stages, 0.0);
  auto a = all.accessor<double, 2>();
  for (int64_t r = 0; r < all.size(0); ++r) {  // per stage, the slowest of its ranks
    const int k = static_cast<int>(a[r][0]);
    c.end[k] = std::max(c.end[k], a[r][1]), c.raw[k] = std::max(c.raw[k], a[r][2]);
    c.comp0[k] = std::max(c.comp0[k], a[r][3]);
  }
  c.compress.assign(stages, false);
  for (int k = 0; k < stages; ++k) {  // compress k iff its raw all-reduce ends after stage 0's compressed one
    c.compress[k] = c.end[k] + c.raw[k] > c.end[0] + c.comp0[0];
  }
  return c;
}

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

TrainSummary run_training(Config cfg, const TrainOptions& options, Distributed& d) {
  auto memory = std::make_shared<MemoryTracker>();
  const auto memory_guard = MemoryTracker::install(memory);  // before the model exists
  resolve_vocab(cfg);
  cfg.validate(d.env.world_size);
  const std::optional<std::string> resume = resume_point(cfg, options);
  const bool writer = d.rank() == 0;
  const bool quiet = options.quiet || !writer;
  spdlog::set_level(spdlog::level::from_str(cfg.log.level));
  set_cpu_threads(threads_for(cfg, d.env.local_world_size));
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));

  const RankCoord coord = d.coord();
  const int stages = static_cast<int>(cfg.parallel.pp);
  const StageRange range = stage_range(cfg, coord.pp);
  const bool has_data = range.is_first || range.is_last;  // loads micro-batches
  RunData data = open_data(cfg);  // every rank: middle stages need the split sizes only
  GptModel model(gpt_options(cfg), d.tp.get(), range);
  model->train();
  auto optimizer = make_adamw(*model, cfg.train);
  const LrSchedule schedule = LrSchedule::from(cfg.train);
  const CheckpointLayout layout{cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.dp, d.rank()};
  const std::string config_yaml = to_yaml(cfg);
  const int64_t m = cfg.num_micro_batches();
  const std::vector<int64_t> act_shape{cfg.model.seq_len, cfg.train.micro_batch_size, cfg.model.hidden_size};
  const auto& comp = cfg.compression;
  // Pipeline messages: CB / LEP / epilogue-only and forward codecs (pipeline_codec.h).
  auto codec = std::make_shared<PipelineCodec>(
      make_act_codec(comp.pipeline_forward.name, pipeline_codec_options(cfg, comp.pipeline_forward)),
      make_act_codec(comp.pipeline_backward.name, pipeline_codec_options(cfg, comp.pipeline_backward)),
      parse_backward_phases(comp.backward_phases), parse_lep_mode(comp.lep));
  codec->enable_orthogonality_check(cfg.log.lep_orthogonality && range.is_last && stages > 1);
  StageLink link(*d.pp, d.tp.get(), StageLinkShapes{act_shape, act_shape}, torch::kFloat, codec);
  if (comp.tp.name != "none" && d.tp) {  // cast-on-the-wire TP all-reduces
    d.tp->set_all_reduce_wire_dtype(Traffic::kTensorParallel, comp.tp.name == "fp16" ? torch::kHalf : torch::kBFloat16);
  }
  auto pipeline = make_schedule(cfg.parallel.schedule);
  GptStageFunctions stage_fn(model, m);
  // SC: which stages compress their DP gradients (dp_stages: all | way | auto).
  std::vector<bool> sc_compress(stages);
  std::string sc_auto_text;
  if (sc_way(cfg) >= 0) {
    for (int k = 0; k < stages; ++k) sc_compress[k] = k < sc_way(cfg);
  } else {
    std::optional<torch::Tensor> stored;
    if (resume) stored = read_checkpoint_tensor(*resume, d.rank(), "sc_auto", "compress");
    if (stored && stored->numel() == stages) {
      for (int k = 0; k < stages; ++k) sc_compress[k] = (*stored)[k].item<int64_t>() != 0;
      sc_auto_text = "kept from the checkpoint";
    } else {
      const ScChoice c = calibrate_sc_auto(cfg, d, model, *pipeline, stage_fn, act_shape, m, data);
      sc_compress = c.compress;
      for (int k = 0; k < stages; ++k) {
        sc_auto_text += fmt::format("{}stage {}: end {:.1f} ms + raw DP {:.1f} ms {} stage 0's end + compressed DP "
                                    "{:.1f} ms -> {}",
                                    k ? "; " : "", k, 1e3 * c.end[k], 1e3 * c.raw[k],
                                    c.compress[k] ? ">" : "<=", 1e3 * (c.end[0] + c.comp0[0]),
                                    c.compress[k] ? "compress" : "raw");
      }
    }
    if (!quiet) spdlog::info("compression.dp_stages = auto: {}", sc_auto_text);
  }
  if (comp.dp.name == "none") sc_compress.assign(stages, false);
  // DP gradients (SC decides per stage), tied-embedding sync (baseline pair or FE).
  GradientSync grad_sync(cfg, model, d.dp.get(), d.embedding.get(), d.fused_embedding.get(), coord.pp,
                         static_cast<bool>(sc_compress[coord.pp]));
  auto checkpoint_parts = grad_sync.checkpoint_parts();
  if (sc_way(cfg) < 0) {
    checkpoint_parts.push_back({"sc_auto", "auto",
                                [sc_compress](auto& a) {
                                  std::vector<int64_t> v(sc_compress.begin(), sc_compress.end());
                                  a.write("compress", torch::tensor(v, torch::kLong));
                                },
                                [](auto&) {}});  // read before GradientSync, see above
  }
  if (codec->compresses_backward() || codec->compresses_forward()) {
    // The messages this rank encodes, so that loading checks the saved Q / LEP buffers against them.
    int64_t slice = 1;
    for (int64_t n : act_shape) slice *= n;
    if (link.scatter_gather(act_shape)) slice /= cfg.parallel.tp;
    codec->expect_messages(range.is_last ? 0 : slice, range.is_first ? 0 : slice, m);
    PipelineCodec* c = codec.get();
    checkpoint_parts.push_back({"pipeline_codec",
                                fmt::format("fwd={} bwd={} phases={} lep={}", to_yaml_value(comp.pipeline_forward),
                                            to_yaml_value(comp.pipeline_backward), comp.backward_phases, comp.lep),
                                [c](auto& a) { c->save(a); }, [c](auto& a) { c->load(a); }});
  }

  TrainState state;
  if (resume) {
    state = load_checkpoint(*resume, *model, *optimizer, layout, {{"attention", model->attention_generator()}},
                            checkpoint_parts);
    if (!quiet) spdlog::info("resumed from {} at step {}{}", *resume, state.step, options.resume ? "" : " (--resume auto)");
  }
  // Fixed widths of the per-step record gather, and the DP tensor names of every rank.
  StepExtras extras;
  extras.dp_reducer = &grad_sync.dp_reducer();
  extras.codec = codec.get();
  {
    auto n = torch::tensor({static_cast<int64_t>(grad_sync.dp_tensor_names().size())}, torch::kLong);
    d.world->all_reduce(n, Traffic::kControl, /*max=*/true);
    extras.max_dp_tensors = n.item<int64_t>();
    extras.max_orth_pairs = cfg.log.lep_orthogonality ? std::max<int64_t>(0, m - 1) : 0;
  }
  const auto all_dp_names = gather_names(d, grad_sync.dp_tensor_names());
  const auto sc_stages = [&] {  // which stages compress DP gradients (SC), for the log and results
    if (comp.dp.name == "none") return std::string("all raw");
    std::string out;
    for (int k = 0; k < stages; ++k) out += fmt::format("{}{}", out.empty() ? "" : ",", sc_compress[k] ? "c" : "raw");
    return out;
  }();
  std::unique_ptr<BatchLoader> loader;
  if (has_data) {
    loader = std::make_unique<BatchLoader>(data.train, cfg.model.seq_len, cfg.train.micro_batch_size, coord.dp,
                                           cfg.parallel.dp, state.consumed_samples);
  }

  TrainSummary summary;
  summary.first_step = state.step;
  std::unique_ptr<Hdf5MetricsSink> sink;
  if (writer) {
    auto attrs = run_attributes(options.command_line);
    attrs["config"] = config_yaml;
    attrs["layout"] = fmt::format("tp={} pp={} dp={}", cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.dp);
    attrs["rank_table"] = rank_table(d);
    attrs["stage_layers"] = stage_layers_text(cfg);
    attrs["launcher"] = d.env.source;
    attrs["resumed_from_step"] = std::to_string(state.step);
    attrs["network_emulation"] = cfg.network.emulate ? "on" : "off";
    attrs["compression_dp"] = to_yaml_value(comp.dp);
    attrs["compression_scheme"] = comp.scheme.empty() ? "(none)" : comp.scheme;
    attrs["compression_summary"] = fmt::format(
        "dp={} dp_stages={} [{}] embedding={} fused_embedding={} pipeline_forward={} pipeline_backward={} "
        "backward_phases={} lep={} tp={}",
        to_yaml_value(comp.dp), comp.dp_stages, sc_stages, to_yaml_value(comp.embedding), comp.fused_embedding,
        to_yaml_value(comp.pipeline_forward), to_yaml_value(comp.pipeline_backward), comp.backward_phases, comp.lep,
        to_yaml_value(comp.tp));
    // BR-05: which reconstruction the error-feedback residual subtracts, when the reducer has one.
    attrs["dp_ef_residual"] = comp.dp.options && comp.dp.options["ef_residual"]
                                  ? comp.dp.options["ef_residual"].as<std::string>()
                                  : (comp.dp.name == "powersgd" ? "averaged" : "n/a");
    attrs["dp_tensor_names"] = nlohmann::json(all_dp_names).dump();
    if (!sc_auto_text.empty()) attrs["sc_auto"] = sc_auto_text;
    attrs["traffic_classes"] = "0 tp, 1 pp_fwd, 2 pp_bwd, 3 dp, 4 embedding, 5 control; link 0 intra, 1 inter";
    sink = create_results(cfg, state.step, attrs, quiet);
    summary.results_path = sink->path();
  }
  const int64_t tokens_per_step = cfg.train.global_batch_size * cfg.model.seq_len;
  if (!quiet) {
    spdlog::info("model: {} layers, h={}, heads={}, seq={}, vocab={} (padded {}); layout tp={} pp={} dp={}, stages {}",
                 cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_heads, cfg.model.seq_len,
                 cfg.model.vocab_size, cfg.padded_vocab_size(), cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.dp,
                 stage_layers_text(cfg));
    if (d.env.world_size > 1) spdlog::info("ranks ({} launcher):\n{}", d.env.source, rank_table(d));
    spdlog::info("training {} steps of {} sequences ({} micro-batches of {} per replica), threads per rank: {}; results -> {}",
                 cfg.train.train_steps, cfg.train.global_batch_size, m, cfg.train.micro_batch_size,
                 at::get_num_threads(), summary.results_path);
    spdlog::info("compression{}: dp={} (stages c = compressed: [{}]), embedding={}{}, pipeline fwd={} bwd={} ({}, lep {}), tp={}",
                 comp.scheme.empty() ? "" : " (scheme " + comp.scheme + ")", to_yaml_value(comp.dp), sc_stages,
                 to_yaml_value(comp.embedding), comp.fused_embedding ? " fused (FE)" : "",
                 to_yaml_value(comp.pipeline_forward), to_yaml_value(comp.pipeline_backward), comp.backward_phases,
                 comp.lep, to_yaml_value(comp.tp));
  }

  auto run_eval = [&](int64_t step) {
    if (!data.valid) return;  // empty validation split (the same on every rank)
    const TrafficMeter before = d.meter;  // /traffic is per training step: evaluation's bytes are not counted
    const double loss = evaluate(model, cfg, d, *codec, act_shape, data.valid.get());
    d.meter = before;
    const Perplexity ppl = perplexity(loss);  // NaN stays NaN; a capped value is marked
    summary.eval_losses.push_back(loss);
    if (sink) {
      sink->append("eval", {step, loss, ppl.value, int64_t{ppl.capped}});
      sink->flush();
    }
    if (!quiet) spdlog::info("eval  step {:>6} | {}", step, eval_text(loss, ppl));
  };

  if (state.step == 0) run_eval(0);  // the untrained model's loss (about ln V) anchors the curve
  const auto params = model->parameters();
  double seconds_run = 0.0;
  while (state.step < cfg.train.train_steps) {
    const auto t0 = Clock::now();
    const double lr = schedule.at(state.step);
    set_lr(*optimizer, lr);
    optimizer->zero_grad();
    stage_fn.batches.clear();
    for (int64_t i = 0; i < m && loader; ++i) stage_fn.batches.push_back(loader->next());
    codec->begin_step();
    memory->reset_peak();
    const int64_t before_schedule = memory->allocated();
    const auto result = run_pipeline_step(*pipeline, stage_fn, link, static_cast<int>(m));
    const int64_t activations_peak = memory->peak() - before_schedule;
    const bool finite = grad_sync.reduce(params, state.step);  // DP (SC), then embedding (pair or FE)
    if (!finite) {  // BR-01: NaN norm here reaches every rank through the model-parallel all-reduce
      for (const auto& p : params) p.grad().fill_(std::numeric_limits<float>::quiet_NaN());
    }
    const double grad_norm = global_grad_norm(model, d.model_parallel.get(), coord.tp, stages);
    if (std::isfinite(grad_norm)) {
      clip_grads_to(params, grad_norm, cfg.train.clip_grad);
      optimizer->step();
    } else {
      summary.skipped_steps += 1;
      if (!quiet) spdlog::warn("step {}: non-finite gradients (norm {}); optimizer step skipped on every rank",
                               state.step + 1, grad_norm);
    }
    state.step += 1;
    state.consumed_samples += cfg.train.global_batch_size;

    // The loss lives on the last stage: average over data-parallel replicas, known everywhere.
    auto loss_t = torch::tensor({range.is_last && coord.tp == 0 ? result.loss / cfg.parallel.dp : 0.0}, torch::kDouble);
    d.world->all_reduce(loss_t, Traffic::kControl);
    const double loss = loss_t.item<double>();
    if (!std::isfinite(loss)) {
      throw std::runtime_error(fmt::format("training diverged: loss is {} at step {}. Fix: lower "
                                           "train.lr or raise train.warmup_steps.",
                                           loss, state.step));
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    seconds_run += dt;
    summary.train_losses.push_back(loss);
    {
      int64_t param_bytes = 0, grad_bytes = 0;
      for (const auto& p : params) param_bytes += bytes_of(p), grad_bytes += bytes_of(p.grad());
      const GradReducer* emb = grad_sync.embedding_reducer();
      const GradReducer& dpr = grad_sync.dp_reducer();
      extras.memory = {param_bytes, grad_bytes, optimizer_state_bytes(*optimizer), activations_peak,
                       codec->lep_bytes(), dpr.error_feedback_bytes() + (emb ? emb->error_feedback_bytes() : 0),
                       dpr.factor_bytes() + (emb ? emb->factor_bytes() : 0) + codec->codec_state_bytes(), memory->peak()};
    }
    record_rank_stats(d, sink.get(), state.step, result.seconds, dt, extras);
    if (sink) sink->append("train", {state.step, loss, lr, grad_norm, dt, tokens_per_step / dt});
    if (state.step % cfg.log.interval == 0 || state.step == cfg.train.train_steps) {
      if (sink) sink->flush();
      const double avg = seconds_run / static_cast<double>(state.step - summary.first_step);
      if (!quiet) {
        spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:>8.0f} tok/s | "
                     "{:.0f} ms/step | ETA {}",
                     state.step, cfg.train.train_steps, loss, lr, grad_norm, tokens_per_step / avg, avg * 1e3,
                     format_eta(avg * (cfg.train.train_steps - state.step)));
      }
    }
    if (cfg.train.eval_interval > 0 && state.step % cfg.train.eval_interval == 0 && state.step != cfg.train.train_steps) {
      run_eval(state.step);
    }
    const bool periodic = cfg.checkpoint.interval > 0 && state.step % cfg.checkpoint.interval == 0;
    const bool final = cfg.checkpoint.save_final && state.step == cfg.train.train_steps;
    if (periodic || final) {
      if (sink) sink->flush();
      summary.last_checkpoint = save_checkpoint(cfg.checkpoint_dir(), state, *model, *optimizer, layout, config_yaml,
                                                cfg.checkpoint.keep, [&] { d.world->barrier(); },
                                                {{"attention", model->attention_generator()}}, checkpoint_parts);
      if (!quiet) spdlog::info("checkpoint -> {}", summary.last_checkpoint);
    }
  }
  run_eval(state.step);
  if (sink) sink->flush();
  summary.last_step = state.step;
  if (options.keep_parameters) {
    for (const auto& p : model->named_parameters()) summary.parameters[p.key()] = p.value().detach().clone();
  }
  return summary;
}

}  // namespace optcc

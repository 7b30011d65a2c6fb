// Cross-field validation and derived quantities of the config.
#include "harness/config/config.h"

#include "datasets/gpt_dataset.h"

#include "compression/act_codec.h"
#include "compression/grad_reducer.h"
#include "compression/options.h"
#include "compat/fused_attention.h"
#include "compat/torch_compat.h"
#include "harness/parallel/device.h"
#include "harness/parallel/schedule.h"
#include "models/gpt.h"
#include "models/precision.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include <filesystem>
#include <map>
#include <numeric>

namespace optcc {
namespace {

[[noreturn]] void fail(const std::string& key, const std::string& value, const std::string& rule,
                       const std::string& fix) {
  throw ConfigError(
      fmt::format("config error: {} = {}: {}. Fix: {}.", key, value, rule, fix));
}

std::string divisors_of(int64_t n) {
  std::string out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out += (out.empty() ? "" : ", ") + std::to_string(d);
  }
  return out;
}

void check_positive(const std::string& key, int64_t v) {
  if (v <= 0) fail(key, std::to_string(v), "must be positive", "set it to 1 or more");
}

void check_probability(const std::string& key, double v) {
  if (!(v >= 0.0 && v < 1.0)) fail(key, fmt::format("{}", v), "must be in [0, 1)", "use e.g. 0.1");
}

// train.precision: a name models/precision.h knows, fp16 where the build has fp16 GEMMs; the loss
// scale keys only with fp16 (elsewhere they would do nothing).
void check_precision(const TrainConfig& t, bool this_build) {
  try {
    (void)precision_dtype(t.precision);
  } catch (const std::invalid_argument&) {
    fail("train.precision", "'" + t.precision + "'", fmt::format("must be one of {}", fmt::join(precision_names(), ", ")),
         "use fp32 (the default), bf16 or fp16");
  }
  if (this_build && t.precision == "fp16" && !kCpuFp16Gemm && !kBuiltWithCuda) {
    fail("train.precision", "'fp16'",
         fmt::format("fp16 compute on CPU ranks needs fp16 GEMMs, which {} does not have", build_description()),
         "use bf16 (the same 2 bytes per element on the wire, with fp32's exponent range), or build optcc against "
         "LibTorch 2.x (scripts/debian13/test.sh) or a CUDA LibTorch");
  }
  const TrainConfig d;
  if (t.precision != "fp16") {
    struct Key {
      const char* key;
      bool changed;
      std::string value;
    };
    for (const auto& [key, changed, value] :
         {Key{"train.loss_scale_initial", t.loss_scale_initial != d.loss_scale_initial, fmt::format("{}", t.loss_scale_initial)},
          Key{"train.loss_scale_growth_interval", t.loss_scale_growth_interval != d.loss_scale_growth_interval,
              std::to_string(t.loss_scale_growth_interval)},
          Key{"train.loss_scale_backoff", t.loss_scale_backoff != d.loss_scale_backoff, fmt::format("{}", t.loss_scale_backoff)},
          Key{"train.loss_scale_min", t.loss_scale_min != d.loss_scale_min, fmt::format("{}", t.loss_scale_min)}}) {
      if (changed) {  // a key at its default is accepted: a dumped config (config show, results) lists all
        fail(key, value, fmt::format("loss scaling acts only with train.precision: fp16 (this run is {})", t.precision),
             "remove the key, or set train.precision: fp16");
      }
    }
  }
  if (!(t.loss_scale_min > 0)) fail("train.loss_scale_min", fmt::format("{}", t.loss_scale_min), "must be > 0", "use 1");
  if (!(t.loss_scale_initial >= t.loss_scale_min && t.loss_scale_initial <= 16777216.0)) {
    fail("train.loss_scale_initial", fmt::format("{}", t.loss_scale_initial),
         fmt::format("must be in [loss_scale_min = {}, 2^24]", t.loss_scale_min), "use 65536 (2^16)");
  }
  if (!(t.loss_scale_backoff > 0 && t.loss_scale_backoff < 1)) {
    fail("train.loss_scale_backoff", fmt::format("{}", t.loss_scale_backoff), "must be in (0, 1)", "use 0.5");
  }
  check_positive("train.loss_scale_growth_interval", t.loss_scale_growth_interval);
  if (t.max_skipped_steps < 0) {
    fail("train.max_skipped_steps", std::to_string(t.max_skipped_steps), "must be >= 0", "use 20, or 0 for no limit");
  }
}

void validate_model(const Config& c) {
  const auto& m = c.model;
  check_positive("model.num_layers", m.num_layers);
  check_positive("model.hidden_size", m.hidden_size);
  check_positive("model.num_heads", m.num_heads);
  check_positive("model.seq_len", m.seq_len);
  check_positive("model.vocab_divisor", m.vocab_divisor);
  if (m.hidden_size % m.num_heads != 0) {
    fail("model.hidden_size", std::to_string(m.hidden_size),
         fmt::format("must be divisible by model.num_heads = {} (head size = h / heads)", m.num_heads),
         fmt::format("choose num_heads among the divisors of {}: {}", m.hidden_size,
                     divisors_of(m.hidden_size)));
  }
  if (m.num_heads % c.parallel.tp != 0) {  // BR-16
    fail("model.num_heads", std::to_string(m.num_heads),
         fmt::format("must be divisible by parallel.tp = {} (each tensor-parallel rank holds "
                     "heads / tp whole heads)", c.parallel.tp),
         fmt::format("use a parallel.tp among {}", divisors_of(m.num_heads)));
  }
  if (m.max_position_embeddings != 0 && m.max_position_embeddings < m.seq_len) {
    fail("model.max_position_embeddings", std::to_string(m.max_position_embeddings),
         fmt::format("must be >= model.seq_len = {}", m.seq_len),
         "set it to at least seq_len, or 0 to use seq_len");
  }
  if (m.vocab_size < 0) fail("model.vocab_size", std::to_string(m.vocab_size), "must be >= 0",
                             "use 0 to read it from the dataset");
  check_probability("model.hidden_dropout", m.hidden_dropout);
  check_probability("model.attention_dropout", m.attention_dropout);
  if (!(m.init_std > 0)) fail("model.init_std", fmt::format("{}", m.init_std), "must be > 0",
                              "use 0.02 (Megatron's default)");
  AttentionKernel kernel{};
  try {
    kernel = attention_kernel(m.attention);
  } catch (const std::invalid_argument&) {
    fail("model.attention", "'" + m.attention + "'", fmt::format("must be one of {}", fmt::join(attention_kernel_names(), ", ")),
         "use auto (fused attention on a GPU where it applies, the explicit one elsewhere)");
  }
  if (kernel == AttentionKernel::kFused && m.attention_dropout > 0) {
    fail("model.attention", "'fused'",
         fmt::format("the fused kernel draws no attention dropout, but model.attention_dropout = {}", m.attention_dropout),
         "set model.attention_dropout: 0.0, or model.attention: auto (explicit attention while dropout is drawn)");
  }
}

// What this build can run: fused attention needs ATen's kernel (LibTorch >= 2.0).
void check_attention_build(const ModelConfig& m) {
  if (m.attention == "fused" && !kHasFusedAttention) {
    fail("model.attention", "'fused'", fmt::format("needs LibTorch >= 2.0 (at::scaled_dot_product_attention); this binary is {}",
                                                   build_description()),
         "use auto or explicit, or build optcc against LibTorch 2.x (scripts/debian13/test.sh) or a CUDA LibTorch");
  }
}

// What this build can run, checked first: a GPU config on a CPU build fails on that, whatever else it
// says. The rules are resolve_placement's (harness/parallel/device.h), applied without knowing the
// machine: a CUDA build is assumed to see one GPU per local rank here; train checks the real count
// at start-up, before any group is made.
void validate_backend(const Config& c) {
  try {
    resolve_placement(c.parallel.device, c.parallel.backend, 0, 1, kBuiltWithCuda ? 1 : 0, kBuiltWithCuda);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
}

// The schedule's own rules (schedule.h: its name, chunks, stages and micro-batches), asked from the
// schedule itself, and the layer split interleaving needs.
void validate_schedule(const Config& c) {
  const auto& p = c.parallel;
  const std::string runnable = "1f1b, gpipe, interleaved_1f1b or zb_h1";
  check_positive("parallel.virtual_stages", p.virtual_stages);
  std::unique_ptr<PipelineSchedule> schedule;
  try {
    schedule = make_schedule(p.schedule, static_cast<int>(p.virtual_stages));
  } catch (const std::invalid_argument& e) {
    const bool known = p.schedule == "1f1b" || p.schedule == "gpipe" || p.schedule == "zb_h1" ||
                       p.schedule == "interleaved_1f1b";
    if (!known) fail("parallel.schedule", "'" + p.schedule + "'", "must be " + runnable, "pick one of them");
    // The schedule's message names the rule and the fix.
    throw ConfigError(fmt::format("config error: parallel.virtual_stages = {}: {}", p.virtual_stages, e.what()));
  }
  if (p.virtual_stages == 1) return;
  for (const auto& [key, on] : {std::pair{"log.lep_orthogonality", c.log.lep_orthogonality},
                                std::pair{"log.lep_diagnostics", c.log.lep_diagnostics}}) {
    if (on) {
      fail(key, "true", "records one stage boundary per stage, and interleaved 1F1B has one per model chunk",
           fmt::format("set {}: false, or use parallel.schedule: 1f1b", key));
    }
  }
  if (!p.stage_layers.empty()) {
    fail("parallel.stage_layers", fmt::format("{} entries", p.stage_layers.size()),
         "cannot be set with interleaved_1f1b, whose chunks split the layers evenly",
         "leave it empty, or use parallel.schedule: 1f1b");
  }
  const int64_t virtual_total = p.pp * p.virtual_stages;
  if (c.model.num_layers % virtual_total != 0) {
    fail("model.num_layers", std::to_string(c.model.num_layers),
         fmt::format("is not divisible by parallel.pp * parallel.virtual_stages = {} * {} = {} (interleaved 1F1B "
                     "gives each virtual stage the same number of layers)",
                     p.pp, p.virtual_stages, virtual_total),
         "change parallel.virtual_stages or pp");
  }
  const int64_t m = c.num_micro_batches();
  try {
    if (m >= 1) schedule->actions(0, static_cast<int>(p.pp), static_cast<int>(m));
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("config error: parallel.schedule = '{}': {}", p.schedule, e.what()));
  }
}

void validate_parallel(const Config& c, int64_t world_size) {
  const auto& p = c.parallel;
  check_positive("parallel.tp", p.tp);
  check_positive("parallel.pp", p.pp);
  check_positive("parallel.dp", p.dp);
  if (p.tp * p.pp * p.dp != world_size) {
    fail("parallel.tp*pp*dp", fmt::format("{}*{}*{} = {}", p.tp, p.pp, p.dp, p.tp * p.pp * p.dp),
         fmt::format("must equal the number of ranks, {}", world_size),
         "change tp/pp/dp so that their product is the world size (or launch that many ranks)");
  }
  if (p.ranks_per_node < 0) {
    fail("parallel.ranks_per_node", std::to_string(p.ranks_per_node), "must be >= 0",
         "give the ranks per node of the cluster, or 0 for the launcher's local world size");
  }
  validate_schedule(c);
  if (!(p.timeout_seconds > 0)) {
    fail("parallel.timeout_seconds", fmt::format("{}", p.timeout_seconds), "must be > 0",
         "use e.g. 120 (seconds)");
  }
  if (!p.stage_layers.empty()) {  // BR-14: never drop layers silently
    if (static_cast<int64_t>(p.stage_layers.size()) != p.pp) {
      fail("parallel.stage_layers", fmt::format("{} entries", p.stage_layers.size()),
           fmt::format("must list one layer count per pipeline stage (pp = {})", p.pp),
           "give pp numbers, or leave it empty for an even split");
    }
    int64_t sum = std::accumulate(p.stage_layers.begin(), p.stage_layers.end(), int64_t{0});
    for (auto n : p.stage_layers) check_positive("parallel.stage_layers[i]", n);
    if (sum != c.model.num_layers) {
      fail("parallel.stage_layers", fmt::format("sum {}", sum),
           fmt::format("must add up to model.num_layers = {}", c.model.num_layers),
           "fix the per-stage counts");
    }
  } else if (c.model.num_layers % p.pp != 0) {
    fail("model.num_layers", std::to_string(c.model.num_layers),
         fmt::format("is not divisible by parallel.pp = {}", p.pp),
         "set parallel.stage_layers to an explicit split (e.g. [8, 8, 7, 7]) or change pp");
  }
}

void validate_train(const Config& c, bool this_build) {
  const auto& t = c.train;
  check_positive("train.micro_batch_size", t.micro_batch_size);
  check_positive("train.global_batch_size", t.global_batch_size);
  check_positive("train.train_steps", t.train_steps);
  const int64_t per_pass = t.micro_batch_size * c.parallel.dp;
  if (t.global_batch_size % per_pass != 0) {
    const int64_t lo = std::max(per_pass, t.global_batch_size / per_pass * per_pass);
    fail("train.global_batch_size", std::to_string(t.global_batch_size),
         fmt::format("must be a multiple of micro_batch_size * dp = {} * {} = {}",
                     t.micro_batch_size, c.parallel.dp, per_pass),
         fmt::format("set it to {} or {}, or change train.micro_batch_size", lo, lo + per_pass));
  }
  if (!(t.lr > 0)) fail("train.lr", fmt::format("{}", t.lr), "must be > 0", "use e.g. 3e-4");
  if (t.min_lr < 0 || t.min_lr > t.lr) {
    fail("train.min_lr", fmt::format("{}", t.min_lr), fmt::format("must be in [0, lr = {}]", t.lr),
         "lower min_lr or raise lr");
  }
  if (t.warmup_steps < 0) fail("train.warmup_steps", std::to_string(t.warmup_steps),
                               "must be >= 0", "use 0 for no warm-up");
  if (t.decay_steps < 0) fail("train.decay_steps", std::to_string(t.decay_steps), "must be >= 0",
                              "use 0 for train_steps");
  if (t.weight_decay < 0) fail("train.weight_decay", fmt::format("{}", t.weight_decay),
                               "must be >= 0", "use e.g. 0.01");
  for (auto [key, beta] : {std::pair{"train.adam_beta1", t.adam_beta1},
                           std::pair{"train.adam_beta2", t.adam_beta2}}) {
    check_probability(key, beta);
  }
  if (!(t.adam_eps > 0)) fail("train.adam_eps", fmt::format("{}", t.adam_eps), "must be > 0",
                              "use 1e-8");
  if (t.clip_grad < 0) fail("train.clip_grad", fmt::format("{}", t.clip_grad), "must be >= 0",
                            "use 1.0, or 0 to disable clipping");
  if (t.seed < 0) fail("train.seed", std::to_string(t.seed), "must be >= 0", "use e.g. 1234");
  if (t.eval_interval < 0) fail("train.eval_interval", std::to_string(t.eval_interval),
                                "must be >= 0", "use 0 to evaluate only at the end");
  check_positive("train.eval_iters", t.eval_iters);
  if (t.threads < 0) fail("train.threads", std::to_string(t.threads), "must be >= 0",
                          "use 0 for automatic");
  check_precision(t, this_build);
}

// The fix for a compressor the registry refused: a known name had a bad option (keep the name, correct
// the option: the message says which and what it takes), else the name itself is wrong.
std::string compressor_fix(const std::string& name, const std::vector<std::string>& known) {
  if (std::find(known.begin(), known.end(), name) != known.end()) {
    return fmt::format("keep {} and correct the option the message names (its options are documented in the header that "
                       "declares it; docs/compression.md, \"The compression: section\", names that header)", name);
  }
  return fmt::format("pick one of {} with its documented options", fmt::join(known, ", "));
}

void validate_reducer(const std::string& where, const CompressorSpec& spec) {
  Registry<GradReducer> registry;
  register_builtin_grad_reducers(registry);
  try {
    (void)registry.create(spec.name, spec.options);  // validates the name and options now
  } catch (const std::exception& e) {
    fail(where, "'" + spec.name + "'", e.what(), compressor_fix(spec.name, registry.names()));
  }
}

void validate_codec(const Config& c, const std::string& where, const CompressorSpec& spec) {
  try {
    (void)make_act_codec(spec.name, pipeline_codec_options(c, spec));
  } catch (const std::exception& e) {
    fail(where, "'" + spec.name + "'", e.what(), compressor_fix(spec.name, act_codec_names()));
  }
}

// What compression.scheme alone sets (the defaults when there is none): a refusal names the scheme as
// the origin of a key only when the scheme set that key to the value refused.
CompressionConfig scheme_preset(const CompressionConfig& k) {
  CompressionConfig preset;
  apply_compression_scheme(preset, k.scheme);
  return preset;
}

std::string set_by_scheme(const CompressionConfig& k, bool scheme_sets_it) {
  return scheme_sets_it ? fmt::format(" (set by compression.scheme = {})", k.scheme) : "";
}

// Under dp_strategy allreduce: a diloco: key that differs from its default would look like DiLoCo
// and run all-reduce, so it is refused, naming the first such key and its value.
void refuse_diloco_keys_under_allreduce(const Config& c) {
  const DilocoConfig& g = c.compression.diloco;
  Config defaults;
  std::string changed, value;
  DilocoConfig mine = g;
  defaults.compression.diloco.visit([&](const char* key, auto& def) {
    mine.visit([&](const char* key2, auto& v) {
      if (std::string(key) != key2) return;
      using T = std::decay_t<decltype(v)>;
      if constexpr (!std::is_same_v<T, std::decay_t<decltype(def)>>) {
        return;  // another key (visit pairs every key with every key)
      } else if constexpr (std::is_same_v<T, CompressorSpec>) {
        if (to_yaml_value(v) != to_yaml_value(def) && changed.empty()) changed = key, value = to_yaml_value(v);
      } else {
        if (v != def && changed.empty()) changed = key, value = fmt::format("{}", v);
      }
    });
  });
  if (!changed.empty()) {
    fail("diloco." + changed, value, "is only read when compression.dp_strategy is diloco (it is allreduce)",
         "set compression.dp_strategy: diloco, or remove the diloco: section (or the --set); in an experiment, "
         "`--set-where AXIS=VALUE diloco.KEY=V` gives the key only to the runs that read it (docs/experiments.md)");
  }
}

// The diloco: section's own ranges (config.h documents the keys).
void validate_diloco_keys(const Config& c) {
  const DilocoConfig& g = c.compression.diloco;
  if (g.inner_steps < 1) {
    fail("diloco.inner_steps", std::to_string(g.inner_steps), "must be >= 1 (optimizer steps between two syncs)",
         "use e.g. 16");
  }
  const int64_t max_fragments = std::min(g.inner_steps, c.model.num_layers);
  if (g.fragments < 1 || g.fragments > max_fragments) {
    fail("diloco.fragments", std::to_string(g.fragments),
         fmt::format("must be in [1, min(inner_steps, model.num_layers)] = [1, {}] (each fragment holds at least one "
                     "layer and gets its own sync step in a period)", max_fragments),
         fmt::format("use a value in [1, {}]: 1 is DiLoCo, more is Streaming DiLoCo; it need not divide the layers "
                     "(fragment f holds layers [f*L/F, (f+1)*L/F))", max_fragments));
  }
  if (g.sync_delay < 0 || g.sync_delay >= g.inner_steps) {
    fail("diloco.sync_delay", std::to_string(g.sync_delay),
         fmt::format("must be in [0, inner_steps) = [0, {}) (a fragment's update lands before its next sync starts)",
                     g.inner_steps),
         "use 0 (apply at once) or a few steps, e.g. 1");
  }
  if (!(g.outer_lr > 0)) {
    fail("diloco.outer_lr", fmt::format("{}", g.outer_lr), "must be > 0", "use e.g. 0.7 (1 with no momentum: the mean of the replicas)");
  }
  if (!(g.outer_momentum >= 0 && g.outer_momentum < 1)) {
    fail("diloco.outer_momentum", fmt::format("{}", g.outer_momentum), "must be in [0, 1)", "use e.g. 0.9, or 0 for none");
  }
  if (!(g.mix >= 0 && g.mix < 1)) {
    fail("diloco.mix", fmt::format("{}", g.mix),
         "must be in [0, 1) (the local weights' share of the applied fragment; 1 would keep the local weights and "
         "throw every global update away)",
         "use 0 (DiLoCo) or e.g. 0.5");
  }
  validate_reducer("diloco.outer", g.outer);
}

// The compression keys DiLoCo cannot run with: those that act on the every-step DP reduction.
void validate_diloco_with_compression(const Config& c) {
  const auto& k = c.compression;
  // A key the scheme set is named with the scheme, so cb_fe / cb_fe_sc are told to use cb at once; one
  // the user set (over any scheme) is told to unset it.
  const CompressionConfig preset = scheme_preset(k);
  if (k.fused_embedding) {
    const bool by_scheme = preset.fused_embedding;
    fail("compression.fused_embedding", "true" + set_by_scheme(k, by_scheme),
         "fuses the embedding sync into the every-step DP reduction, which compression.dp_strategy: diloco does not run",
         by_scheme ? "use compression.scheme: cb (CB on the pipeline; the tied embedding is synced inside each "
                     "replica) and put a DP compressor under diloco.outer"
                   : "set compression.fused_embedding: false (the tied embedding is synced inside each replica)");
  }
  if (k.dp.name != "none") {
    fail("compression.dp", "'" + k.dp.name + "'" + set_by_scheme(k, preset.dp.name == k.dp.name),
         "reduces every step's gradients, and compression.dp_strategy is diloco (the replicas exchange only outer gradients)",
         "set compression.dp: none and put the compressor under diloco.outer (e.g. {name: qsgd, levels: 7})");
  }
  if (k.dp_stages != DpStages::all()) {
    fail("compression.dp_stages", k.dp_stages.text() + set_by_scheme(k, preset.dp_stages == k.dp_stages),
         "chooses the stages whose every-step DP reduction is compressed (SC), and compression.dp_strategy is diloco, "
         "which runs none (diloco.outer compresses every stage's outer gradients alike)",
         "remove compression.dp_stages (its default is all)");
  }
  if (c.parallel.grad_reduce_dtype != "fp32") {
    fail("parallel.grad_reduce_dtype", "'" + c.parallel.grad_reduce_dtype + "'",
         "sets the wire dtype of the every-step DP all-reduce, and compression.dp_strategy is diloco, which runs none "
         "(the outer exchange's wire is diloco.outer's)",
         "remove parallel.grad_reduce_dtype, and for a 16-bit outer exchange set diloco.outer: bf16");
  }
}

// compression.dp_strategy and the diloco: section.
void validate_diloco(const Config& c) {
  const auto& k = c.compression;
  if (k.dp_strategy != "allreduce" && k.dp_strategy != "diloco") {
    fail("compression.dp_strategy", "'" + k.dp_strategy + "'", "must be allreduce or diloco",
         "use allreduce (a gradient reducer every step) or diloco (the diloco: section)");
  }
  if (!k.diloco_on()) {
    refuse_diloco_keys_under_allreduce(c);
    return;
  }
  validate_diloco_keys(c);
  validate_diloco_with_compression(c);
}

void validate_compression(const Config& c) {
  const auto& k = c.compression;
  validate_reducer("compression.dp", k.dp);
  validate_reducer("compression.embedding", k.embedding);
  validate_codec(c, "compression.pipeline_forward", k.pipeline_forward);
  validate_codec(c, "compression.pipeline_backward", k.pipeline_backward);
  if (!(k.lep_decay > 0.0 && k.lep_decay <= 1.0)) {
    fail("compression.lep_decay", fmt::format("{}", k.lep_decay), "must be in (0, 1] (the factor on the carried error)",
         "use e.g. 0.5; 1 carries the whole error as lep: lazy does");
  }
  if (k.lep_decay != 1.0 && k.lep != LepMode::kLazyDecay) {
    fail("compression.lep_decay", fmt::format("{}", k.lep_decay),
         "is only used by compression.lep: lazy_decay (compression.lep is '" + to_string(k.lep) + "')",
         "set compression.lep: lazy_decay, or remove compression.lep_decay");
  }
  if (k.pipeline_backward.name == "none" && k.lep != LepMode::kLazy) {  // lep_decay needs lazy_decay (above)
    fail("compression.lep", "'" + to_string(k.lep) + "'",
         "acts on compressed backward sends, and compression.pipeline_backward is none (nothing to feed back)",
         "set compression.pipeline_backward (e.g. scheme cb), or leave lep at its default (lazy)");
  }
  if (c.log.lep_diagnostics && k.pipeline_backward.name == "none") {
    fail("log.lep_diagnostics", "true", "diagnoses compressed backward sends, so it needs compression.pipeline_backward",
         "set pipeline_backward: lowrank (e.g. scheme cb), or turn the diagnostics off");
  }
  if (k.tp.name != "none" && k.tp.name != "fp16" && k.tp.name != "bf16") {
    fail("compression.tp", "'" + k.tp.name + "'", "tensor-parallel all-reduces support none, fp16 or bf16",
         "use one of them (the paper never compresses TP traffic, docs/design.md §9)");
  }
  if (c.log.lep_orthogonality) {  // docs/design.md §3.3: the Fig. 11 check needs CB on every backward send
    if (k.pipeline_backward.name == "none" || k.lep == LepMode::kOff) {
      fail("log.lep_orthogonality", "true", "the Fig. 11 check compares LEP errors, so it needs compression.pipeline_backward "
           "and compression.lep other than off", "set pipeline_backward: lowrank (scheme cb), or turn the check off");
    }
    if (k.backward_phases == BackwardPhases::kEpilogue) {
      fail("log.lep_orthogonality", "true", "under backward_phases: epilogue the last stage compresses one micro-batch "
           "per step, so no successive pair (j, j+1) exists (the reference forbids it too, docs/design.md §3.3)",
           "set compression.backward_phases: all for the Fig. 11 run (e.g. experiments/schemes/fig11-mini-3d.yaml)");
    }
  }
  if (k.tp.options && k.tp.options.size() > 0) {
    fail("compression.tp", to_yaml_value(k.tp), "the cast compressors take no options", "give only the name");
  }
  validate_diloco(c);
}

// parallel.grad_reduce_dtype: fp32 or compute; with a 16-bit compute dtype `compute` acts on the
// gradients DP reduces uncompressed, so some stage must reduce uncompressed.
void check_grad_reduce_dtype(const Config& c) {
  const std::string& v = c.parallel.grad_reduce_dtype;
  if (v != "fp32" && v != "compute") {
    fail("parallel.grad_reduce_dtype", "'" + v + "'", "must be fp32 or compute",
         "use fp32 (the default) or compute (train.precision's dtype on the wire, summed in fp32)");
  }
  if (v != "compute" || c.train.precision == "fp32" || c.compression.dp.name == "none") return;
  if (c.compression.dp_stages == DpStages::all() || sc_way(c) >= c.parallel.pp) {
    const bool cast = c.compression.dp.name == "bf16" || c.compression.dp.name == "fp16";
    fail("parallel.grad_reduce_dtype", "'compute'",
         fmt::format("acts on the DP gradients reduced uncompressed, and compression.dp = {}{} compresses them on "
                     "all {} stages (compression.dp_stages = {})",
                     c.compression.dp.name,
                     set_by_scheme(c.compression, scheme_preset(c.compression).dp.name == c.compression.dp.name),
                     c.parallel.pp, c.compression.dp_stages.text()),
         cast ? fmt::format("set parallel.grad_reduce_dtype: fp32 (compression.dp: {} already sends every DP gradient "
                            "in 16 bits)", c.compression.dp.name)
              : "set parallel.grad_reduce_dtype: fp32, or let some stages reduce uncompressed (compression.dp_stages: "
                "1 .. pp-1, or auto)");
  }
}

// log.run_name names the results file <log.dir>/<name>.h5 and the checkpoint folder <log.dir>/ckpt/
// <name>: one path component. Spaces, quotes, commas and any UTF-8 are fine (results_index.py
// quotes them in index.csv).
void check_run_name(const std::string& n) {
  if (n.empty()) return;  // the config file's stem, or "run"
  std::string why;
  if (n == "." || n == "..") {
    why = "is a folder name, not a file name";
  } else if (n.find('/') != std::string::npos || n.find('\\') != std::string::npos) {
    why = "contains a path separator, so the files would land outside log.dir or in a missing folder";
  } else if (n[0] == '.') {
    why = "starts with '.', which hides the results file";
  } else if (n[0] == '-') {
    why = "starts with '-', which reads as an option wherever the name is passed on a command line";
  } else if (n.size() > 200) {
    why = fmt::format("is {} bytes long, more than the 200 a file name may safely have here", n.size());
  } else if (std::any_of(n.begin(), n.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; })) {
    why = "contains a control character";
  }
  if (!why.empty()) {
    fail("log.run_name", "'" + n + "'", "names one file and one folder inside log.dir, and this " + why,
         "use one plain name, e.g. demo-3d-bf16 (spaces, commas and Unicode are fine); log.dir chooses the folder");
  }
}

void validate_rest(const Config& c) {
  if (c.data.vocab_size < 16) fail("data.vocab_size", std::to_string(c.data.vocab_size),
                                   "must be >= 16", "use e.g. 8000");
  // The dataset's own rule (datasets/gpt_dataset.h), checked before any rank starts.
  if (const std::string why = data::split_problem(c.data.split); !why.empty()) {
    fail("data.split", "'" + c.data.split + "'",
         "must be 1-3 non-negative weights separated by ',' or '/' (" + why + ")",
         "use e.g. \"949,50,1\" (train, valid, test)");
  }
  if (c.data.tokenizer_type != "unigram" && c.data.tokenizer_type != "bpe") {
    fail("data.tokenizer_type", "'" + c.data.tokenizer_type + "'", "must be unigram or bpe",
         "pick one of them");
  }
  // The validation split's weight, by the dataset's own rule on a large corpus (the corpus itself is
  // checked when it is opened: harness/train/run_setup.h open_data).
  if (c.train.eval_interval > 0) {
    const auto parts = data::split_documents(1000000, c.data.split);
    if (parts[1].end_doc == parts[1].begin_doc) {
      fail("data.split", "'" + c.data.split + "'",
           fmt::format("gives the validation split no weight, but train.eval_interval = {} asks for evaluation",
                       c.train.eval_interval),
           "give it weight (e.g. 949,50,1), or set train.eval_interval: 0 (then the run does not evaluate)");
    }
  }
  if (c.data.sources.empty()) fail("data.sources", "[]", "needs at least one source",
                                   "use [nlp-corpus, brown] or paths to .jsonl/.txt files");
  validate_compression(c);
  check_grad_reduce_dtype(c);
  validate_network_config(c);
  for (int64_t step : c.log.timeline_steps) {
    if (step < 1 || step > c.train.train_steps) {
      fail("log.timeline_steps", std::to_string(step), fmt::format("must be a step in 1..train.train_steps = {}", c.train.train_steps),
           "list steps the run reaches, e.g. [5, 6]; steps count from 1 as the log shows them");
    }
  }
  check_positive("log.interval", c.log.interval);
  check_run_name(c.log.run_name);
  if (c.log.level != "debug" && c.log.level != "info" && c.log.level != "warn") {
    fail("log.level", "'" + c.log.level + "'", "must be debug, info or warn", "pick one");
  }
  if (c.checkpoint.interval < 0) fail("checkpoint.interval", std::to_string(c.checkpoint.interval),
                                      "must be >= 0", "use 0 for no periodic checkpoints");
  if (c.checkpoint.keep < 0) fail("checkpoint.keep", std::to_string(c.checkpoint.keep),
                                  "must be >= 0", "use 0 to keep all");
}

// Every floating-point key, whatever set it (a file, --set, code): NaN and infinities are refused
// (the YAML reader already refuses them, compression/options.h; this covers programmatic configs).
void validate_finite(const Config& const_cfg) {
  Config c = const_cfg;  // visit() is non-const by design
  for_each_section(c, [](const char* sec, auto& section) {
    section.visit([&](const char* key, auto& field) {
      if constexpr (std::is_same_v<std::decay_t<decltype(field)>, double>) {
        if (!std::isfinite(field)) {
          fail(fmt::format("{}.{}", sec, key), fmt::format("{}", field), "must be a finite number",
               "give a finite value (NaN and infinities are never valid settings)");
        }
      }
    });
  });
}

}  // namespace

void Config::validate(int64_t world_size, BuildLimits limits) const {
  const bool this_build = limits == BuildLimits::kThisBuild;
  validate_finite(*this);
  if (this_build) validate_backend(*this);
  if (this_build) check_attention_build(model);
  // The layout sizes divide other checks' values (heads / tp, layers / pp, batch / dp): positive first.
  check_positive("parallel.tp", parallel.tp);
  check_positive("parallel.pp", parallel.pp);
  check_positive("parallel.dp", parallel.dp);
  validate_model(*this);
  validate_parallel(*this, world_size);
  validate_train(*this, this_build);
  validate_rest(*this);
}

void Config::validate_layout(int64_t world_size) const {
  validate_backend(*this);
  validate_parallel(*this, world_size);
}

std::vector<int64_t> Config::stage_layer_counts() const {
  if (!parallel.stage_layers.empty()) return parallel.stage_layers;
  return std::vector<int64_t>(parallel.pp, model.num_layers / parallel.pp);
}

int64_t Config::num_micro_batches() const {
  return train.global_batch_size / (train.micro_batch_size * parallel.dp);
}

int64_t Config::padded_vocab_size() const {
  const int64_t multiple = model.vocab_divisor * parallel.tp;
  return (model.vocab_size + multiple - 1) / multiple * multiple;
}

std::string Config::run_name() const {
  if (!log.run_name.empty()) return log.run_name;
  if (!source_path.empty()) return std::filesystem::path(source_path).stem().string();
  return "run";
}

std::string Config::checkpoint_dir() const {
  if (!checkpoint.dir.empty()) return checkpoint.dir;
  return (std::filesystem::path(log.dir) / "ckpt" / run_name()).string();
}

YAML::Node pipeline_codec_options(const Config& c, const CompressorSpec& spec) {
  return act_codec_options(spec.name, spec.options,
                           MessageShape{c.model.hidden_size, c.model.seq_len, c.train.micro_batch_size});
}

int64_t sc_way(const Config& c) { return c.compression.dp_stages.way(c.parallel.pp); }

std::string uncompressed_dp_dtype(const Config& c) {
  return c.parallel.grad_reduce_dtype == "compute" ? c.train.precision : "fp32";
}

std::vector<std::string> compression_scheme_names() {
  return {"baseline", "cb", "cb_fe", "cb_fe_sc", "cb_nonlep"};
}

void apply_compression_scheme(CompressionConfig& c, const std::string& name) {
  if (name.empty()) return;
  const auto names = compression_scheme_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw ConfigError(fmt::format(
        "compression.scheme = '{}' is not a known scheme. Known schemes: {}. Fix: pick one, or "
        "leave scheme empty and set the compression keys yourself.",
        name, fmt::join(names, ", ")));
  }
  const std::string strategy = c.dp_strategy;  // its own axis: a scheme keeps it
  const DilocoConfig diloco = c.diloco;
  c = CompressionConfig{};
  c.dp_strategy = strategy;
  c.diloco = diloco;
  c.scheme = name;
  if (name == "baseline") return;
  // CB: rank-16 low-rank codec on activation gradients, epilogue-only, LEP (docs/design.md §8.1).
  c.pipeline_backward.name = "lowrank";
  c.pipeline_backward.options.reset(YAML::Node(YAML::NodeType::Map));
  c.pipeline_backward.options["rank"] = 16;
  c.backward_phases = BackwardPhases::kEpilogue;
  c.lep = name == "cb_nonlep" ? LepMode::kOff : LepMode::kLazy;
  if (name == "cb_fe" || name == "cb_fe_sc") c.fused_embedding = true;
  if (name == "cb_fe_sc") {  // PowerSGD rank 128 with error feedback on the first 3 stages
    c.dp.name = "powersgd";
    c.dp.options.reset(YAML::Node(YAML::NodeType::Map));
    c.dp.options["rank"] = 128;
    c.dp.options["error_feedback"] = true;
    c.dp.options["warmup_steps"] = 0;
    c.dp_stages = DpStages::first(3);
  }
}

}  // namespace optcc

// Analytic traffic per iteration (traffic_estimate.h): for one rank, the collectives and sends the
// runtime issues, class by class. The compressors' own plans (compression/comm_plan.h) and the
// pipeline and SC policies (compression/pipeline_policy.h, stage_selection.h) are asked, never restated.
#include "harness/perfmodel/traffic_estimate.h"

#include "models/precision.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <map>
#include <stdexcept>

#include "compression/act_codec.h"
#include "compression/grad_reducer.h"
#include "compression/options.h"
#include "harness/parallel/schedule.h"
#include "harness/train/grad_sync.h"
#include "harness/train/outer_sync.h"
#include "harness/train/trainer.h"

namespace optcc {
namespace {

// Communicator's per-rank byte conventions (communicator.h), integer division per collective.
int64_t all_reduce_bytes(int64_t n, int64_t x) { return n > 1 ? 2 * (n - 1) * x / n : 0; }
int64_t all_gather_bytes(int64_t n, int64_t x) { return n > 1 ? (n - 1) * x : 0; }

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto v : shape) n *= v;
  return n;
}

std::string spec_text(const CompressorSpec& spec) { return to_yaml_value(spec); }

// nullptr for `none`, else the codec the runtime would build (pipeline_codec_options fills sizes).
std::unique_ptr<ActCodec> build_codec(const Config& cfg, const CompressorSpec& spec, const char* key) {
  if (spec.name == "none") return nullptr;
  try {
    return make_act_codec(spec.name, pipeline_codec_options(cfg, spec));
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("config error: {} = {}: {}. Fix: pick a codec and options that fit the model.",
                                  key, spec_text(spec), e.what()));
  }
}

int64_t codec_bytes(const ActCodec& codec, int64_t slice, const char* key, const CompressorSpec& spec) {
  try {
    return codec.payload_bytes(slice);
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format(
        "config error: {} = {}: cannot encode a message slice of {} elements: {}. Fix: pick a view "
        "or sizes that fit the message (s*b*h/t elements).",
        key, spec_text(spec), slice, e.what()));
  }
}

// YAML::Node copies alias one node and assignment writes through the alias, so a plain Config copy
// followed by apply_compression_scheme() (which assigns fresh options) would wipe the original's
// compressor options. Variants are built on copies whose option nodes are deep clones.
void set_spec(CompressorSpec& dst, const CompressorSpec& src) {
  dst.name = src.name;
  dst.options.reset(src.options ? YAML::Clone(src.options) : YAML::Node());  // rebind, never write through
}

}  // namespace

Config detached_copy(const Config& c) {
  Config out = c;
  auto& o = out.compression;
  const auto& k = c.compression;
  set_spec(o.dp, k.dp);
  set_spec(o.embedding, k.embedding);
  set_spec(o.pipeline_forward, k.pipeline_forward);
  set_spec(o.pipeline_backward, k.pipeline_backward);
  set_spec(o.tp, k.tp);
  return out;
}

namespace {

int resolve_ranks_per_node(const Config& cfg, const TrafficModelOptions& o) {
  if (o.ranks_per_node > 0) return static_cast<int>(o.ranks_per_node);
  if (cfg.parallel.ranks_per_node > 0) return static_cast<int>(cfg.parallel.ranks_per_node);
  return 8;
}

}  // namespace

int64_t sent_bytes(const std::vector<CommStep>& steps, int64_t n) {
  int64_t sum = 0;
  for (const auto& st : steps) {
    if (!st.compute && n > 1) sum += LinkEmulator::ring_send_bytes(st.kind, st.bytes, static_cast<int>(n));
  }
  return sum;
}

namespace {

PlanContext plan_context(const TrafficModelOptions& o, int64_t n) {
  PlanContext ctx;
  ctx.step = o.step;
  ctx.element_bytes = o.element_bytes;
  ctx.host_gloo = o.gloo;
  ctx.compress_every_matrix = o.reference_powersgd;
  ctx.group_size = n;
  return ctx;
}

// A reducer as the runtime builds it; a bad name or option is the config's error.
template <class Make>
std::unique_ptr<GradReducer> build_reducer(Make make, const char* key, const CompressorSpec& spec) {
  try {
    return make();
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("config error: {} = {}: {}. Fix: pick a registered reducer and its options.",
                                  key, spec_text(spec), e.what()));
  }
}

}  // namespace

int64_t ParamShape::numel() const { return product(shape); }

std::vector<ParamShape> stage_parameter_shapes(const Config& cfg, int stage) {
  const int64_t p = cfg.parallel.pp, t = cfg.parallel.tp, h = cfg.model.hidden_size;
  if (stage < 0 || stage >= p) {
    throw std::out_of_range(fmt::format("stage_parameter_shapes: stage {} outside 0..{}", stage, p - 1));
  }
  const auto counts = cfg.stage_layer_counts();
  const int64_t vp = cfg.padded_vocab_size();
  const int64_t positions = cfg.model.max_position_embeddings > 0 ? cfg.model.max_position_embeddings : cfg.model.seq_len;
  const bool first = stage == 0, last = stage == p - 1;
  std::vector<ParamShape> out;
  // Root parameters first (position_embedding), then the modules in registration order.
  if (first) out.push_back({"position_embedding", {positions, h}, false});
  if (first || last) out.push_back({"embedding.weight", {vp / t, h}, true});
  for (int64_t i = 0; i < counts.at(stage); ++i) {
    const std::string b = fmt::format("blocks.{}.", i);
    out.push_back({b + "ln1.weight", {h}, false});
    out.push_back({b + "ln1.bias", {h}, false});
    out.push_back({b + "attn.qkv.weight", {3 * h / t, h}, false});
    out.push_back({b + "attn.qkv.bias", {3 * h / t}, false});
    out.push_back({b + "attn.proj.weight", {h, h / t}, false});
    out.push_back({b + "attn.proj.bias", {h}, false});
    out.push_back({b + "ln2.weight", {h}, false});
    out.push_back({b + "ln2.bias", {h}, false});
    out.push_back({b + "mlp.fc1.weight", {4 * h / t, h}, false});
    out.push_back({b + "mlp.fc1.bias", {4 * h / t}, false});
    out.push_back({b + "mlp.fc2.weight", {h, 4 * h / t}, false});
    out.push_back({b + "mlp.fc2.bias", {h}, false});
  }
  if (last) {
    out.push_back({"final_ln.weight", {h}, false});
    out.push_back({"final_ln.bias", {h}, false});
  }
  return out;
}

int64_t RankTrafficEstimate::total() const {
  int64_t s = 0;
  for (const auto& c : bytes) s += c[0] + c[1];
  return s;
}

int64_t TrafficEstimate::cluster_total(Traffic cls) const {
  return cluster[static_cast<int>(cls)][0] + cluster[static_cast<int>(cls)][1];
}

int64_t TrafficEstimate::cluster_total() const {
  int64_t s = 0;
  for (int c = 0; c < kNumTraffic; ++c) {
    if (modelled[c]) s += cluster[c][0] + cluster[c][1];
  }
  return s;
}

const RankTrafficEstimate& TrafficEstimate::gpu(int stage) const {
  return ranks.at(static_cast<size_t>(stage) * dims.tp * dims.dp);  // rank = tp + t·(dp + d·pp)
}

int64_t activation_element_bytes(const Config& cfg, const TrafficModelOptions& o) {
  return o.element_bytes > 0 ? o.element_bytes : precision_element_bytes(cfg.train.precision);
}

int64_t gradient_element_bytes(const TrafficModelOptions& o) { return o.element_bytes > 0 ? o.element_bytes : 4; }

int64_t uncompressed_dp_element_bytes(const Config& cfg, const TrafficModelOptions& o) {
  if (o.element_bytes > 0) return o.element_bytes;
  return precision_element_bytes(uncompressed_dp_dtype(cfg));
}

namespace {

void check_traffic_inputs(const Config& cfg, const TrafficModelOptions& o) {
  if (cfg.model.vocab_size <= 0) {
    throw ConfigError("config error: model.vocab_size = 0: the traffic model needs the vocabulary. Fix: "
                      "--set model.vocab_size=N, or prepare the dataset so <data.prefix>.json gives it.");
  }
  if (o.element_bytes != 0 && o.element_bytes != 1 && o.element_bytes != 2 && o.element_bytes != 4) {
    throw ConfigError(fmt::format("traffic model: --element-bytes {} is not an element size: use 2 (fp16/bf16 "
                                  "messages, as the paper's runs), 4 (fp32), 1 (8-bit), or leave it out to take "
                                  "train.precision's and parallel.grad_reduce_dtype's",
                                  o.element_bytes));
  }
}

// The estimate's frame: layout, message sizes, k_TP, which classes are modelled.
TrafficEstimate estimate_frame(const Config& cfg, const TrafficModelOptions& o) {
  TrafficEstimate e;
  e.dims = ParallelDims{static_cast<int>(cfg.parallel.tp), static_cast<int>(cfg.parallel.pp),
                        static_cast<int>(cfg.parallel.dp)};
  e.ranks_per_node = resolve_ranks_per_node(cfg, o);
  const int64_t t = e.dims.tp;
  const int64_t s = cfg.model.seq_len, b = cfg.train.micro_batch_size, h = cfg.model.hidden_size;
  e.micro_batches = cfg.num_micro_batches();
  e.message_elements = s * b * h;
  e.scatter_gather = t > 1 && e.message_elements % t == 0;
  e.slice_elements = e.scatter_gather ? e.message_elements / t : e.message_elements;
  e.k_tp = o.recompute ? 6 : 4;
  e.modelled.fill(true);
  e.modelled[static_cast<int>(Traffic::kControl)] = false;
  e.notes.push_back("control traffic (grad norm, loss, non-finite flags: a few scalars per step) is not modelled");
  return e;
}

// What every stage's estimate needs besides its parameters.
struct StageInputs {
  int64_t beta = 4;                  // bytes per activation element (pipeline, TP)
  int64_t grad_beta = 4;             // bytes per gradient element (DP, embedding)
  int64_t dp_raw_beta = 4;           // bytes per element of the uncompressed DP all-reduce (grad_reduce_dtype)
  int64_t fwd_bytes = 0;             // one forward message (codec payload or slice·β)
  int64_t bwd_bytes_compressed = 0;  // one compressed backward message
  bool bwd_codec = false;            // pipeline_backward compresses
  std::unique_ptr<PipelineSchedule> schedule;
  int64_t way = 0;  // SC: stages 0..way-1 compress DP gradients
  int64_t tp_beta = 4, ce_beta = 4;  // TP all-reduce bytes per element; cross-entropy's
  int64_t vp = 0, emb_elements = 0;  // padded vocabulary; E = Vp/t·h
  std::vector<CommStep> cb_encode, cb_decode;  // one compressed gradient's arithmetic
};

// Pipeline codecs, built as the runtime builds them, the schedule (for the epilogue decision), SC.
StageInputs stage_inputs(const Config& cfg, TrafficEstimate& e, const TrafficModelOptions& o) {
  const auto& k = cfg.compression;
  const int64_t slice = e.slice_elements;
  StageInputs in;
  in.beta = activation_element_bytes(cfg, o);
  in.grad_beta = gradient_element_bytes(o);
  in.dp_raw_beta = uncompressed_dp_element_bytes(cfg, o);
  const auto fwd = build_codec(cfg, k.pipeline_forward, "compression.pipeline_forward");
  const auto bwd = build_codec(cfg, k.pipeline_backward, "compression.pipeline_backward");
  in.fwd_bytes = fwd ? codec_bytes(*fwd, slice, "compression.pipeline_forward", k.pipeline_forward) : slice * in.beta;
  in.bwd_bytes_compressed =
      bwd ? codec_bytes(*bwd, slice, "compression.pipeline_backward", k.pipeline_backward) : slice * in.beta;
  in.bwd_codec = bwd != nullptr;
  if (bwd) {  // one compressed gradient's arithmetic, sender and receiver, as the codec counts it
    in.cb_encode = {bwd->encode_arithmetic(slice, k.pipeline_policy().keeps_error())};
    in.cb_decode = {bwd->decode_arithmetic(slice)};
  }
  try {
    in.schedule = make_schedule(cfg.parallel.schedule, static_cast<int>(cfg.parallel.virtual_stages));
  } catch (const std::exception& ex) {
    throw ConfigError(fmt::format("config error: parallel.schedule = '{}': {}", cfg.parallel.schedule, ex.what()));
  }
  in.way = sc_way(cfg);
  if (in.way < 0) {
    in.way = e.dims.pp;
    e.notes.push_back("compression.dp_stages = auto is decided at run time by a calibration step; modelled as all");
  }
  const bool tp_cast = k.tp.name == "fp16" || k.tp.name == "bf16";
  in.tp_beta = tp_cast ? 2 : in.beta;
  in.ce_beta = tp_cast ? 2 : 4;
  in.vp = cfg.padded_vocab_size();
  in.emb_elements = in.vp / e.dims.tp * cfg.model.hidden_size;
  return in;
}

// PP: sends on the pipeline link, the receiver's all-gather on the TP link (stage_link.h), LEP. The
// messages are those of the stage's communication plan (schedule.h), the one the runtime runs: with
// interleaving every stage sends m*v each way around the ring; each backward send is compressed as
// its epilogue flag and the policy say.
void stage_pp_bytes(StageTrafficEstimate& g, const Config& cfg, const TrafficEstimate& e, const StageInputs& in,
                    int64_t st) {
  const auto& k = cfg.compression;
  const int64_t t = e.dims.tp, p = e.dims.pp, m = e.micro_batches, slice = e.slice_elements, beta = in.beta;
  g.pp_gather_bytes = e.scatter_gather ? slice * beta : 0;
  g.cb_encode = in.cb_encode;
  g.cb_decode = in.cb_decode;
  if (p == 1) return;
  const int64_t gather = e.scatter_gather ? all_gather_bytes(t, slice * beta) : 0;
  g.pp_bwd_messages.assign(static_cast<size_t>(in.schedule->chunks() * m), 0);
  g.pp_bwd_compressed.assign(g.pp_bwd_messages.size(), false);
  std::map<int, int64_t> compressed_by_chunk;  // compressed backward sends per sending chunk (LEP boundary)
  for (const StageStep& step : communication_plan(*in.schedule, static_cast<int>(st), static_cast<int>(p), static_cast<int>(m))) {
    for (const auto* calls : {&step.before, &step.after}) {
      for (const P2PCall& call : *calls) {
        for (const P2PMessage& msg : call.messages) {
          switch (msg.dir) {
            case P2PDir::kSendForward:
              g.pp_fwd_message = in.fwd_bytes;
              g.pp_fwd_send += in.fwd_bytes;
              break;
            case P2PDir::kRecvForward:
              g.pp_fwd_gather += gather;
              break;
            case P2PDir::kRecvBackward:
              g.pp_bwd_gather += gather;
              break;
            case P2PDir::kSendBackward: {
              const bool compressed = in.bwd_codec && k.pipeline_policy().compresses_backward_send(msg.epilogue);
              g.backward_sends += 1;
              g.backward_compressed += compressed;
              g.pp_bwd_send += compressed ? in.bwd_bytes_compressed : slice * beta;
              const size_t at = static_cast<size_t>(msg.chunk * m + msg.microbatch);
              g.pp_bwd_messages.at(at) = compressed ? in.bwd_bytes_compressed : slice * beta;
              g.pp_bwd_compressed.at(at) = compressed;
              if (compressed) compressed_by_chunk[msg.chunk] += 1;
              break;
            }
          }
        }
      }
    }
  }
  // One boundary's buffers per sending chunk (pipeline_codec.h), each of the policy's count.
  int64_t lep = 0;
  for (const auto& [chunk, sends] : compressed_by_chunk) lep += k.pipeline_policy().lep_buffers(sends);
  g.lep_bytes = lep * slice * 4;  // fp32 slices
}

// DP: SC picks the reducer per stage (grad_sync.h make_dp_reducer, as GradientSync builds it).
void stage_dp_bytes(StageTrafficEstimate& g, const Config& cfg, TrafficEstimate& e, const StageInputs& in,
                    const TrafficModelOptions& o, int64_t st, const std::vector<std::vector<int64_t>>& dp_shapes) {
  const auto& k = cfg.compression;
  const int64_t d = e.dims.dp;
  g.compresses_dp = stage_compresses_dp(k.dp_stages, st, e.dims.pp, k.dp.name != "none", /*auto: modelled as all*/ true);
  g.dp_reducer = g.compresses_dp ? spec_text(k.dp) : "none";
  if (k.diloco_on()) {  // no per-step DP reduction (grad_sync.h); the outer step is stage_outer_bytes'
    g.dp_reducer = "(diloco)";
    return;
  }
  const auto reducer = build_reducer([&] { return make_dp_reducer(cfg, g.compresses_dp); }, "compression.dp", k.dp);
  ReducerPlan plan = reducer->plan(dp_shapes, plan_context(o, d));
  g.dp = sent_bytes(plan.steps, d);
  g.dp_steps = std::move(plan.steps);
  if (!k.fused_embedding && g.holds_word_embedding && !g.compresses_dp) {
    g.dp_word_embedding_share = all_reduce_bytes(d, in.emb_elements * in.dp_raw_beta);
  }
}

// Embedding: the pair sync (baseline) or the FE group all-reduce, plain or through compression.embedding.
void stage_embedding_bytes(StageTrafficEstimate& g, const Config& cfg, TrafficEstimate& e, const StageInputs& in,
                           const TrafficModelOptions& o, int64_t st) {
  const auto& k = cfg.compression;
  if (!g.holds_word_embedding) return;
  // The group GradientSync reduces over, as the layout builds it (RankLayout::embedding_group: the
  // first and last stage's pair; fused_embedding_group: that pair x every DP replica), seen from
  // this stage's rank (TP 0, DP 0).
  const RankLayout layout(e.dims, e.ranks_per_node);
  const int rank = static_cast<int>(st) * e.dims.tp * e.dims.dp;
  const int64_t n = static_cast<int64_t>(
      layout.group(k.fused_embedding ? GroupKind::kFusedEmbedding : GroupKind::kEmbedding, rank).size());
  g.embedding_group = n;
  if (k.embedding.name == "none") {  // grad_sync.h: a plain sum of the fp32 gradient
    g.embedding_steps = {collective_step(CollectiveKind::kAllReduce, in.emb_elements * in.grad_beta, "word-embedding all-reduce")};
    g.embedding = sent_bytes(g.embedding_steps, n);
    return;
  }
  const auto reducer = build_reducer(
      [&] {
        Registry<GradReducer> registry;
        register_builtin_grad_reducers(registry);
        return registry.create(k.embedding.name, k.embedding.options);
      },
      "compression.embedding", k.embedding);
  ReducerPlan plan = reducer->plan({{in.vp / e.dims.tp, cfg.model.hidden_size}}, plan_context(o, n));
  g.embedding = sent_bytes(plan.steps, n);
  g.embedding_steps = std::move(plan.steps);
}

// dp_strategy: diloco (harness/train/outer_sync.h): each fragment's outer reducer over its parameters
// once per period of H steps, and the tied copy's broadcast when fragment 0 lands; per step, the
// period's bytes ÷ H (rounded down).
void stage_outer_bytes(StageTrafficEstimate& g, const Config& cfg, TrafficEstimate& e, const StageInputs& in,
                       const TrafficModelOptions& o, int64_t st) {
  const auto& k = cfg.compression;
  if (!k.diloco_on()) return;
  const int64_t d = e.dims.dp, F = k.diloco.fragments, H = k.diloco.inner_steps;
  const bool tied_copy = st == e.dims.pp - 1 && st > 0;
  const StageRange range = stage_range(cfg, static_cast<int>(st));
  std::vector<std::vector<std::vector<int64_t>>> shapes(F);
  for (const auto& prm : stage_parameter_shapes(cfg, static_cast<int>(st))) {
    if (prm.word_embedding && tied_copy) continue;
    shapes[outer_fragment_of(prm.name, range, cfg.model.num_layers, F)].push_back(prm.shape);
  }
  int64_t period = 0;
  g.outer_steps.assign(F, {});
  for (int64_t f = 0; f < F; ++f) {
    if (shapes[f].empty()) continue;
    const auto reducer = build_reducer(
        [&] {
          Registry<GradReducer> registry;
          register_builtin_grad_reducers(registry);
          return registry.create(k.diloco.outer.name, k.diloco.outer.options);
        },
        "diloco.outer", k.diloco.outer);
    g.outer_steps[f] = reducer->plan(shapes[f], plan_context(o, d)).steps;
    period += sent_bytes(g.outer_steps[f], d);
  }
  g.outer = period / H;
  if (g.holds_word_embedding && e.dims.pp > 1) {
    g.tied_copy_steps = {collective_step(CollectiveKind::kBroadcast, in.emb_elements * 4, "tied copy broadcast")};
    g.embedding += sent_bytes(g.tied_copy_steps, 2) / H;
  }
}

StageTrafficEstimate estimate_stage(const Config& cfg, TrafficEstimate& e, const StageInputs& in,
                                    const TrafficModelOptions& o, int64_t st) {
  const auto& k = cfg.compression;
  const int64_t t = e.dims.tp, p = e.dims.pp, m = e.micro_batches;
  const int64_t s = cfg.model.seq_len, b = cfg.train.micro_batch_size;
  StageTrafficEstimate g;
  const bool first = st == 0, last = st == p - 1;
  g.layers = cfg.stage_layer_counts()[st];
  g.holds_word_embedding = first || last;
  std::vector<std::vector<int64_t>> dp_shapes;
  for (const auto& prm : stage_parameter_shapes(cfg, static_cast<int>(st))) {
    g.parameters += prm.numel();
    if (k.fused_embedding && prm.word_embedding) continue;
    dp_shapes.push_back(prm.shape);
    g.dp_elements += prm.numel();
  }
  // TP: per micro-batch L_k·k_TP layer all-reduces, the embedding's forward all-reduce (first
  // stage), the tied output layer's backward all-reduce and 3 cross-entropy all-reduces (last).
  if (t > 1) {
    const auto ar = CollectiveKind::kAllReduce;
    g.tp_message_bytes = e.message_elements * in.tp_beta;
    g.tp_per_layer_forward = 2;
    g.tp_per_layer_backward = e.k_tp - 2;
    if (first) g.tp_forward_extra.push_back(collective_step(ar, g.tp_message_bytes, "embedding all-reduce"));
    if (last) {
      g.tp_forward_extra.push_back(collective_step(ar, s * b * 4, "cross-entropy max"));
      g.tp_forward_extra.push_back(collective_step(ar, s * b * in.ce_beta, "cross-entropy sum"));
      g.tp_forward_extra.push_back(collective_step(ar, s * b * in.ce_beta, "cross-entropy target logit"));
      g.tp_backward_extra.push_back(collective_step(ar, g.tp_message_bytes, "output layer all-reduce"));
    }
    const int64_t per_mb = g.layers * e.k_tp * LinkEmulator::ring_send_bytes(ar, g.tp_message_bytes, static_cast<int>(t)) +
                           sent_bytes(g.tp_forward_extra, t) + sent_bytes(g.tp_backward_extra, t);
    g.tp = m * per_mb;
  }
  stage_pp_bytes(g, cfg, e, in, st);
  stage_dp_bytes(g, cfg, e, in, o, st, dp_shapes);
  stage_embedding_bytes(g, cfg, e, in, o, st);
  stage_outer_bytes(g, cfg, e, in, o, st);
  return g;
}

// Per rank: the stage's components on the links of this rank's groups.
RankTrafficEstimate rank_traffic(const RankLayout& layout, const TrafficEstimate& e, bool fused_embedding, int r) {
  RankTrafficEstimate re;
  re.rank = r;
  re.coord = layout.coord(r);
  re.node = layout.node_of(r);
  const auto& g = e.stages[re.coord.pp];
  const auto link = [&](GroupKind kind) { return static_cast<int>(layout.group_link(layout.group(kind, r))); };
  auto add = [&](Traffic cls, int lk, int64_t v) { re.bytes[static_cast<int>(cls)][lk] += v; };
  const int tp_link = link(GroupKind::kTensorParallel), pp_link = link(GroupKind::kPipelineParallel);
  add(Traffic::kTensorParallel, tp_link, g.tp);
  add(Traffic::kPipelineForward, pp_link, g.pp_fwd_send);
  add(Traffic::kPipelineForward, tp_link, g.pp_fwd_gather);
  add(Traffic::kPipelineBackward, pp_link, g.pp_bwd_send);
  add(Traffic::kPipelineBackward, tp_link, g.pp_bwd_gather);
  add(Traffic::kDataParallel, link(GroupKind::kDataParallel), g.dp);
  add(Traffic::kOuter, link(GroupKind::kDataParallel), g.outer);
  if (g.embedding > 0) {
    add(Traffic::kEmbedding, link(fused_embedding ? GroupKind::kFusedEmbedding : GroupKind::kEmbedding), g.embedding);
  }
  return re;
}

}  // namespace

TrafficEstimate estimate_traffic(const Config& cfg, const TrafficModelOptions& o) {
  check_traffic_inputs(cfg, o);
  TrafficEstimate e = estimate_frame(cfg, o);
  const RankLayout layout(e.dims, e.ranks_per_node);
  const StageInputs in = stage_inputs(cfg, e, o);
  for (int64_t st = 0; st < e.dims.pp; ++st) e.stages.push_back(estimate_stage(cfg, e, in, o, st));
  for (int r = 0; r < layout.world(); ++r) {
    RankTrafficEstimate re = rank_traffic(layout, e, cfg.compression.fused_embedding, r);
    for (int c = 0; c < kNumTraffic; ++c) {
      for (int l = 0; l < 2; ++l) e.cluster[c][l] += re.bytes[c][l];
    }
    e.ranks.push_back(re);
  }
  return e;
}

namespace {

// Σ over stages of a per-GPU component, times the GPUs of a stage.
int64_t stage_sum(const TrafficEstimate& e, int64_t StageTrafficEstimate::*field, int64_t per_stage) {
  int64_t sum = 0;
  for (const auto& g : e.stages) sum += per_stage * (g.*field);
  return sum;
}

// The most LEP bytes any GPU holds (stages differ: stage 0 sends no gradient backward).
int64_t most_lep_bytes(const TrafficEstimate& e) {
  int64_t most = 0;
  for (const auto& g : e.stages) most = std::max(most, g.lep_bytes);
  return most;
}

// CB: cfg's backward codec, else the paper's (the `cb` scheme's lowrank rank 16).
void cb_rows(PaperTrafficRows& rows, const Config& cfg, const Config& base, const TrafficEstimate& own,
             const TrafficModelOptions& o) {
  const int64_t t = own.dims.tp, per_stage = own.dims.tp * own.dims.dp;
  CompressionConfig cb;
  apply_compression_scheme(cb, "cb");
  CompressorSpec cb_codec;
  set_spec(cb_codec, cfg.compression.pipeline_backward.name != "none" ? cfg.compression.pipeline_backward : cb.pipeline_backward);
  rows.cb_codec = spec_text(cb_codec);
  rows.cb_label = cb_codec.name == cb.pipeline_backward.name ? "CB" : cb_codec.name;
  try {
    const auto codec = make_act_codec(cb_codec.name, pipeline_codec_options(cfg, cb_codec));
    rows.pp_message_cb = t * codec->payload_bytes(own.slice_elements);
    for (const BackwardPhases phases : {BackwardPhases::kEpilogue, BackwardPhases::kAll}) {
      Config v = detached_copy(base);
      set_spec(v.compression.pipeline_backward, cb_codec);
      v.compression.backward_phases = phases;
      const TrafficEstimate cb_estimate = estimate_traffic(v, o);
      const int64_t total = stage_sum(cb_estimate, &StageTrafficEstimate::pp_bwd_send, per_stage);
      (phases == BackwardPhases::kAll ? rows.pp_backward_cb_all : rows.pp_backward_cb_epilogue) = total;
      if (phases == BackwardPhases::kEpilogue && cfg.compression.pipeline_backward.name == "none") {
        rows.lep_per_gpu = most_lep_bytes(cb_estimate);  // cfg has no CB of its own: the paper's
      }
    }
  } catch (const std::exception& ex) {
    rows.notes.push_back(fmt::format("CB rows: {}", ex.what()));
  }
}

// FE alone, then FE+SC: cfg's DP reducer and stages when it compresses DP, else `cb_fe_sc`'s.
void fe_sc_rows(PaperTrafficRows& rows, const Config& cfg, const Config& base, const TrafficEstimate& own,
                const TrafficModelOptions& o) {
  const int64_t t = own.dims.tp, d = own.dims.dp, p = own.dims.pp;
  Config fe = detached_copy(base);
  fe.compression.fused_embedding = true;
  rows.embedding_total_fe = estimate_traffic(fe, o).cluster_total(Traffic::kEmbedding);
  const int64_t holders = (p > 1 ? 2 : 1) * t * d;  // ranks with a word-embedding copy
  const int64_t emb_bytes = cfg.padded_vocab_size() / t * cfg.model.hidden_size * gradient_element_bytes(o);  // E·β
  rows.embedding_total_fe_reference = holders > 1 ? 2 * (holders - 1) * emb_bytes : 0;  // one group of them all
  CompressionConfig fesc;
  apply_compression_scheme(fesc, "cb_fe_sc");
  Config v = detached_copy(fe);
  const bool own_dp = cfg.compression.dp.name != "none";
  set_spec(v.compression.dp, own_dp ? cfg.compression.dp : fesc.dp);
  v.compression.dp_stages = own_dp ? cfg.compression.dp_stages : fesc.dp_stages;
  rows.fe_sc_reducer = spec_text(v.compression.dp);
  rows.fe_sc_stages = v.compression.dp_stages.text();
  const TrafficEstimate fs = estimate_traffic(v, o);
  for (const auto& g : fs.stages) rows.dp_per_gpu_fe_sc.push_back(g.dp);
  rows.dp_total_fe_sc = fs.cluster_total(Traffic::kDataParallel);
  if (!o.reference_powersgd) {  // the reducer's own plan under the reference's rule: does it differ?
    TrafficModelOptions every = o;
    every.reference_powersgd = true;
    const int64_t reference = estimate_traffic(v, every).cluster_total(Traffic::kDataParallel);
    if (reference != rows.dp_total_fe_sc) {
      rows.notes.push_back(fmt::format(
          "the FE+SC DP reducer keeps some matrices raw by its own rule (powersgd: rows·cols / ((rows+cols)·r) < "
          "min_compression_rate); the reference compresses every >=2-D gradient (docs/design.md §6.2): "
          "--reference-powersgd models that ({} instead of {} DP bytes per iteration)",
          reference, rows.dp_total_fe_sc));
    }
  }
}

}  // namespace

PaperTrafficRows paper_traffic_rows(const Config& cfg, const TrafficModelOptions& o) {
  PaperTrafficRows rows;
  const TrafficEstimate own = estimate_traffic(cfg, o);
  const int64_t per_stage = own.dims.tp * own.dims.dp;  // GPUs per stage
  Config base = detached_copy(cfg);
  apply_compression_scheme(base.compression, "baseline");
  const TrafficEstimate b = estimate_traffic(base, o);
  for (const auto& g : b.stages) rows.stage_parameters.push_back(g.parameters);
  rows.pp_message = own.message_elements * activation_element_bytes(cfg, o);
  rows.pp_forward_total = stage_sum(b, &StageTrafficEstimate::pp_fwd_send, per_stage);
  rows.pp_backward_baseline = stage_sum(b, &StageTrafficEstimate::pp_bwd_send, per_stage);
  for (const auto& g : b.stages) rows.dp_per_gpu_baseline.push_back(g.dp);
  rows.dp_total_baseline = b.cluster_total(Traffic::kDataParallel);
  rows.embedding_total_baseline =
      b.cluster_total(Traffic::kEmbedding) + stage_sum(b, &StageTrafficEstimate::dp_word_embedding_share, per_stage);
  rows.tp_total = own.cluster_total(Traffic::kTensorParallel);
  rows.lep_per_gpu = most_lep_bytes(own);  // replaced by the CB variant's when cfg has no CB (cb_rows)
  cb_rows(rows, cfg, base, own, o);
  rows.fe_sc_apply = !cfg.compression.diloco_on();
  if (rows.fe_sc_apply) fe_sc_rows(rows, cfg, base, own, o);
  return rows;
}

}  // namespace optcc

// Analytic traffic per iteration (traffic_estimate.h). Every formula here restates, for one rank, the
// collectives and sends the runtime issues; the header lists them class by class.
#include "harness/tools/traffic_estimate.h"

#include "models/precision.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>

#include "compression/act_codec.h"
#include "compression/grad_reducer.h"
#include "compression/options.h"
#include "compression/powersgd.h"
#include "compression/elementwise_reducer.h"
#include "harness/parallel/schedule.h"

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

CommStep collective(CollectiveKind kind, int64_t bytes, std::string what) {
  CommStep c;
  c.kind = kind;
  c.bytes = bytes;
  c.what = std::move(what);
  return c;
}

CommStep arithmetic(std::string codec, double flops, double memory_bytes, std::string what) {
  CommStep c;
  c.compute = true;
  c.flops = flops;
  c.memory_bytes = memory_bytes;
  c.codec = std::move(codec);
  c.what = std::move(what);
  return c;
}

int64_t total_numel(const std::vector<std::vector<int64_t>>& shapes) {
  int64_t numel = 0;
  for (const auto& s : shapes) numel += product(s);
  return numel;
}

ReducerPlan none_reducer_plan(const std::vector<std::vector<int64_t>>& shapes, int64_t beta) {
  // NoneReducer: one flat all-reduce in the gradient dtype.
  return {true, {collective(CollectiveKind::kAllReduce, total_numel(shapes) * beta, "gradient all-reduce")}, ""};
}

// powersgd.h steps 2-8 (the reducer's plan): matrices [shape[0], numel/shape[0]] with
// r = min(rank, rows, cols) and rows·cols / ((rows+cols)·r) >= min_compression_rate go low-rank.
// Arithmetic per matrix: P = MQ 2·rows·cols·r, Q = MᵀP̂ 2·rows·cols·r, P̂Qᵀ 2·rows·cols·r,
// orthogonalisation (MGS) 2·rows·r²; element-wise: M = grad + EF and the EF update, fp32.
ReducerPlan powersgd_plan(const CompressorSpec& spec, const std::vector<std::vector<int64_t>>& shapes,
                          const TrafficModelOptions& o) {
  PowerSgdOptions opt = PowerSgdOptions::from_yaml(spec.options);
  if (o.step < opt.warmup_steps) return none_reducer_plan(shapes, gradient_element_bytes(o));
  if (o.reference_powersgd) opt.min_compression_rate = 0.0;
  int64_t p_numel = 0, q_numel = 0, raw_numel = 0;
  double gemm = 0, orth = 0, low_numel = 0;
  for (const auto& s : shapes) {
    const int64_t numel = product(s);
    const int64_t rows = s.size() >= 2 ? s[0] : 0;
    const int64_t cols = rows > 0 ? numel / rows : 0;
    const int64_t r = std::min({opt.rank, rows, cols});
    const bool worth = r > 0 && double(rows) * double(cols) / (double(rows + cols) * double(r)) >=
                                    opt.min_compression_rate;
    if (worth) {
      p_numel += rows * r, q_numel += cols * r;
      gemm += 2.0 * double(rows) * double(cols) * double(r);
      orth += 2.0 * double(rows) * double(r) * double(r);
      low_numel += double(numel);
    } else {
      raw_numel += numel;
    }
  }
  const double ef = opt.error_feedback ? 3.0 * 4.0 * low_numel : 0.0;  // read grad and EF, write M
  // Steps 5-7: P (sum), raw (sum), Q (sum): three all-reduces, fp32 as the runtime sends them
  // (β = --element-bytes when given: the paper's all-fp16 messages).
  const int64_t beta = gradient_element_bytes(o);
  return {true,
          {arithmetic("powersgd", gemm, ef + 4.0 * low_numel, "M = grad + EF, P = MQ"),
           collective(CollectiveKind::kAllReduce, beta * p_numel, "P all-reduce"),
           collective(CollectiveKind::kAllReduce, beta * raw_numel, "raw all-reduce"),
           arithmetic("powersgd", orth + gemm, 4.0 * low_numel, "orthogonalise P, Q = MᵀP"),
           collective(CollectiveKind::kAllReduce, beta * q_numel, "Q all-reduce"),
           arithmetic("powersgd", gemm, ef + 4.0 * low_numel, "out = PQᵀ, EF update")},
          ""};
}

// elementwise_reducer.h: tensor i (N elements) raw when N < min_numel or compressed_bytes(N) >= 4N;
// compressed messages of all tensors in ONE collective (randomk: all-reduce; topk, qsgd, signsgd:
// all-gather), raw tensors in one fp32 all-reduce. The per-tensor byte formula is the reducer's own.
// Arithmetic: element-wise passes (read the gradient, write the message), no FLOPs counted.
ReducerPlan elementwise_plan(const Registry<GradReducer>& registry, const CompressorSpec& spec,
                             const std::vector<std::vector<int64_t>>& shapes, const TrafficModelOptions& o) {
  auto reducer = registry.create(spec.name, spec.options);
  const auto* ew = dynamic_cast<const ElementwiseReducer*>(reducer.get());
  if (!ew) return {false, {}, fmt::format("DP reducer '{}' is not an element-wise reducer", spec.name)};
  const int64_t min_numel = option_value<int64_t>(spec.options, spec.name, "min_numel", 0);
  int64_t compressed = 0, raw = 0, packed = 0;
  for (const auto& s : shapes) {
    const int64_t numel = product(s);
    const int64_t c = ew->compressed_bytes(numel);
    if (numel < min_numel || c >= 4 * numel) {
      raw += numel;
    } else {
      compressed += c, packed += numel;
    }
  }
  const bool reduce = spec.name == "randomk";
  const auto kind = reduce ? CollectiveKind::kAllReduce : CollectiveKind::kAllGather;
  return {true,
          {arithmetic(spec.name, 0.0, 8.0 * double(packed), "encode"),
           collective(kind, compressed, reduce ? "compressed all-reduce" : "compressed all-gather"),
           collective(CollectiveKind::kAllReduce, gradient_element_bytes(o) * raw, "raw all-reduce"),
           arithmetic(spec.name, 0.0, 8.0 * double(packed), "decode")},
          ""};
}

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

ReducerPlan reducer_plan(const CompressorSpec& spec, const std::vector<std::vector<int64_t>>& shapes, int64_t n,
                         const TrafficModelOptions& o) {
  (void)n;  // the operations do not depend on the group size; the bytes one rank sends do (sent_bytes)
  const std::string& name = spec.name;
  if (name == "none") return none_reducer_plan(shapes, gradient_element_bytes(o));
  const int64_t numel = total_numel(shapes);
  if (name == "fp16" || name == "bf16") {  // cast_reducer.h: Gloo (CPU) all-gathers the bf16 bits
    const auto kind = name == "bf16" && o.gloo ? CollectiveKind::kAllGather : CollectiveKind::kAllReduce;
    return {true, {arithmetic(name, 0.0, 6.0 * double(numel), "cast"), collective(kind, 2 * numel, name + " gradients")}, ""};
  }
  if (name == "powersgd") return powersgd_plan(spec, shapes, o);
  Registry<GradReducer> registry;
  register_builtin_grad_reducers(registry);
  if (registry.contains(name) && (name == "topk" || name == "randomk" || name == "qsgd" || name == "signsgd")) {
    return elementwise_plan(registry, spec, shapes, o);
  }
  return {false, {},
          fmt::format("reducer '{}' is not modelled{}", name,
                      registry.contains(name) ? "" : " (not registered in this build)")};
}

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

namespace {

}  // namespace

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
  const auto& k = cfg.compression;
  if (k.backward_phases != "all" && k.backward_phases != "epilogue") {
    throw ConfigError(fmt::format("config error: compression.backward_phases = '{}': must be all or epilogue",
                                  k.backward_phases));
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

// The arithmetic of one compressed pipeline message of `slice` elements (ActCodec encode on the
// sender, decode on the receiver). lowrank (codecs.h), matrix [rows, cols], rank r: encode P = MQ
// and Q = MᵀP̂ 4·rows·cols·r plus orthogonalisation 2·rows·r², and with LEP the error x − P̂Qᵀ
// another 2·rows·cols·r; decode P̂Qᵀ 2·rows·cols·r. Every codec: one fp32 pass over the message to
// read it and one to write it (element-wise codecs: nothing else).
void codec_arithmetic(StageInputs& in, const ActCodec& codec, const CompressorSpec& spec, int64_t slice, bool lep) {
  double encode = 0, decode = 0;
  if (spec.name == "lowrank") {
    const auto shapes = codec.wire_shapes(slice);  // P̂ [rows, r], Q [cols, r]
    const double rows = double(shapes.at(0).at(0)), r = double(shapes.at(0).at(1)), cols = double(shapes.at(1).at(0));
    encode = 4.0 * rows * cols * r + 2.0 * rows * r * r + (lep ? 2.0 * rows * cols * r : 0.0);
    decode = 2.0 * rows * cols * r;
  }
  in.cb_encode = {arithmetic(spec.name, encode, 8.0 * double(slice), "encode")};
  in.cb_decode = {arithmetic(spec.name, decode, 8.0 * double(slice), "decode")};
}

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
  if (bwd) codec_arithmetic(in, *bwd, k.pipeline_backward, slice, k.lep != "off");
  try {
    in.schedule = make_schedule(cfg.parallel.schedule);
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

// PP: sends on the pipeline link, the receiver's all-gather on the TP link (stage_link.h), LEP.
void stage_pp_bytes(StageTrafficEstimate& g, const Config& cfg, const TrafficEstimate& e, const StageInputs& in,
                    int64_t st) {
  const auto& k = cfg.compression;
  const int64_t t = e.dims.tp, p = e.dims.pp, m = e.micro_batches, slice = e.slice_elements, beta = in.beta;
  const bool first = st == 0, last = st == p - 1;
  g.pp_fwd_message = last ? 0 : in.fwd_bytes;
  g.pp_gather_bytes = e.scatter_gather ? slice * beta : 0;
  g.cb_encode = in.cb_encode;
  g.cb_decode = in.cb_decode;
  if (!last) g.pp_fwd_send = m * in.fwd_bytes;
  if (!first && e.scatter_gather) g.pp_fwd_gather = m * all_gather_bytes(t, slice * beta);
  if (!first) {
    for (int mb = 0; mb < m; ++mb) {
      const bool compressed =
          in.bwd_codec && (k.backward_phases == "all" ||
                           backward_send_is_epilogue(*in.schedule, static_cast<int>(st), static_cast<int>(p),
                                                     static_cast<int>(m), mb));
      g.backward_sends += 1;
      g.backward_compressed += compressed;
      g.pp_bwd_send += compressed ? in.bwd_bytes_compressed : slice * beta;
      g.pp_bwd_messages.push_back(compressed ? in.bwd_bytes_compressed : slice * beta);
      g.pp_bwd_compressed.push_back(compressed);
    }
  }
  if (!last && e.scatter_gather) g.pp_bwd_gather = m * all_gather_bytes(t, slice * beta);
  if (g.backward_compressed > 0) {  // pipeline_codec.h: fp32 buffers of one slice
    if (k.lep == "lazy") g.lep_bytes = slice * 4;
    if (k.lep == "per_microbatch") g.lep_bytes = g.backward_compressed * slice * 4;
  }
}

// DP: SC picks the reducer per stage (grad_sync.h GradientSync). False (and a note) when the
// reducer's bytes are not modelled.
bool stage_dp_bytes(StageTrafficEstimate& g, const Config& cfg, TrafficEstimate& e, const StageInputs& in,
                    const TrafficModelOptions& o, int64_t st, const std::vector<std::vector<int64_t>>& dp_shapes) {
  const auto& k = cfg.compression;
  const int64_t d = e.dims.dp;
  g.compresses_dp = st < in.way && k.dp.name != "none";
  const CompressorSpec none_spec;
  const CompressorSpec& dp_spec = g.compresses_dp ? k.dp : none_spec;
  g.dp_reducer = spec_text(dp_spec);
  ReducerPlan dpb = reducer_plan(dp_spec, dp_shapes, d, o);
  if (dp_spec.name == "none" && in.dp_raw_beta < 4 && o.element_bytes == 0) {
    // grad_reduce_dtype: compute (NoneReducer's 16-bit wire): Communicator::all_reduce_summing_in_fp32
    // pads the buffer to d equal chunks; the all-reduce's X is the padded tensor.
    const int64_t numel = total_numel(dp_shapes), chunk = (numel + d - 1) / d;
    dpb = {true, {collective(CollectiveKind::kAllReduce, chunk * d * in.dp_raw_beta, "gradient all-reduce (16-bit wire, fp32 sum)")}, ""};
  }
  if (!dpb.modelled) e.notes.push_back(fmt::format("dp on stage {}: {}", st, dpb.note));
  g.dp = sent_bytes(dpb.steps, d);
  g.dp_steps = std::move(dpb.steps);
  if (!k.fused_embedding && g.holds_word_embedding && dp_spec.name == "none") {
    g.dp_word_embedding_share = all_reduce_bytes(d, in.emb_elements * in.dp_raw_beta);
  }
  return dpb.modelled;
}

// Embedding: the pair sync (baseline) or the FE group all-reduce. False (and a note) when the
// reducer's bytes are not modelled.
bool stage_embedding_bytes(StageTrafficEstimate& g, const Config& cfg, TrafficEstimate& e, const StageInputs& in,
                           const TrafficModelOptions& o) {
  const auto& k = cfg.compression;
  if (!g.holds_word_embedding) return true;
  const int64_t p = e.dims.pp, d = e.dims.dp;
  const int64_t n = k.fused_embedding ? (p > 1 ? 2 * d : d) : (p > 1 ? 2 : 1);
  g.embedding_group = n;
  if (k.embedding.name == "none") {
    g.embedding_steps = {collective(CollectiveKind::kAllReduce, in.emb_elements * in.grad_beta, "word-embedding all-reduce")};
    g.embedding = sent_bytes(g.embedding_steps, n);
    return true;
  }
  ReducerPlan eb = reducer_plan(k.embedding, {{in.vp / e.dims.tp, cfg.model.hidden_size}}, n, o);
  if (!eb.modelled) e.notes.push_back(fmt::format("embedding: {}", eb.note));
  g.embedding = sent_bytes(eb.steps, n);
  g.embedding_steps = std::move(eb.steps);
  return eb.modelled;
}

StageTrafficEstimate estimate_stage(const Config& cfg, TrafficEstimate& e, const StageInputs& in,
                                    const TrafficModelOptions& o, int64_t st, bool& dp_modelled, bool& emb_modelled) {
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
    if (first) g.tp_forward_extra.push_back(collective(ar, g.tp_message_bytes, "embedding all-reduce"));
    if (last) {
      g.tp_forward_extra.push_back(collective(ar, s * b * 4, "cross-entropy max"));
      g.tp_forward_extra.push_back(collective(ar, s * b * in.ce_beta, "cross-entropy sum"));
      g.tp_forward_extra.push_back(collective(ar, s * b * in.ce_beta, "cross-entropy target logit"));
      g.tp_backward_extra.push_back(collective(ar, g.tp_message_bytes, "output layer all-reduce"));
    }
    const int64_t per_mb = g.layers * e.k_tp * LinkEmulator::ring_send_bytes(ar, g.tp_message_bytes, static_cast<int>(t)) +
                           sent_bytes(g.tp_forward_extra, t) + sent_bytes(g.tp_backward_extra, t);
    g.tp = m * per_mb;
  }
  stage_pp_bytes(g, cfg, e, in, st);
  if (!stage_dp_bytes(g, cfg, e, in, o, st, dp_shapes)) dp_modelled = false;
  if (!stage_embedding_bytes(g, cfg, e, in, o)) emb_modelled = false;
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
  bool dp_modelled = true, emb_modelled = true;
  for (int64_t st = 0; st < e.dims.pp; ++st) e.stages.push_back(estimate_stage(cfg, e, in, o, st, dp_modelled, emb_modelled));
  e.modelled[static_cast<int>(Traffic::kDataParallel)] = dp_modelled;
  e.modelled[static_cast<int>(Traffic::kEmbedding)] = emb_modelled;
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

// CB: cfg's backward codec, else the paper's (the `cb` scheme's lowrank rank 16).
void cb_rows(PaperTrafficRows& rows, const Config& cfg, const Config& base, const TrafficEstimate& own,
             const TrafficModelOptions& o) {
  const int64_t t = own.dims.tp, per_stage = own.dims.tp * own.dims.dp;
  CompressionConfig cb;
  apply_compression_scheme(cb, "cb");
  CompressorSpec cb_codec;
  set_spec(cb_codec, cfg.compression.pipeline_backward.name != "none" ? cfg.compression.pipeline_backward : cb.pipeline_backward);
  rows.cb_codec = spec_text(cb_codec);
  try {
    const auto codec = make_act_codec(cb_codec.name, pipeline_codec_options(cfg, cb_codec));
    rows.pp_message_cb = t * codec->payload_bytes(own.slice_elements);
    for (const char* phases : {"epilogue", "all"}) {
      Config v = detached_copy(base);
      set_spec(v.compression.pipeline_backward, cb_codec);
      v.compression.backward_phases = phases;
      const int64_t total = stage_sum(estimate_traffic(v, o), &StageTrafficEstimate::pp_bwd_send, per_stage);
      (std::string(phases) == "all" ? rows.pp_backward_cb_all : rows.pp_backward_cb_epilogue) = total;
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
  if (v.compression.dp.name == "powersgd" && !o.reference_powersgd) {
    rows.notes.push_back(fmt::format(
        "DP PowerSGD keeps a matrix raw when rows·cols / ((rows+cols)·r) < min_compression_rate ({}); the reference "
        "compresses every >=2-D gradient (spec §6.2): --reference-powersgd models that",
        PowerSgdOptions::from_yaml(v.compression.dp.options).min_compression_rate));
  }
  rows.fe_sc_stages = v.compression.dp_stages;
  const TrafficEstimate fs = estimate_traffic(v, o);
  if (fs.modelled[static_cast<int>(Traffic::kDataParallel)]) {
    for (const auto& g : fs.stages) rows.dp_per_gpu_fe_sc.push_back(g.dp);
    rows.dp_total_fe_sc = fs.cluster_total(Traffic::kDataParallel);
  } else {
    for (const auto& n : fs.notes) rows.notes.push_back("FE+SC rows: " + n);
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
  rows.lep_per_gpu = own.slice_elements * 4;
  cb_rows(rows, cfg, base, own, o);
  fe_sc_rows(rows, cfg, base, own, o);
  return rows;
}

}  // namespace optcc

// Analytic traffic: the bytes one training iteration sends, by traffic class and link, per rank and
// for the whole cluster, computed from the config alone (no process group, no data, no tensors).
// `optcc traffic --config ...` prints it (traffic_report.h); docs/design.md §9 is the reference for the arithmetic.
//
// The model mirrors what the runtime meters (harness/parallel/communicator.h), call for call:
//   - byte conventions per rank: all-reduce of X over n ranks 2(n-1)·X/n (integer division per
//     collective, as Communicator::all_reduce), all-gather (n-1)·X, send X, receive 0;
//   - a group's link is RankLayout::group_link of its members (inter-node when any two sit on
//     different nodes), so e.g. PP sends are "inter" as soon as the pipeline group spans nodes;
//   - parameter shapes per TP rank come from stage_parameter_shapes() below, which lists what
//     GptModel (models/gpt.h) registers; the DP and embedding reducers' operations are their own
//     plans (GradReducer::plan, compression/comm_plan.h), the pipeline codecs' bytes
//     and arithmetic come from the codec objects themselves (ActCodec::payload_bytes,
//     encode_arithmetic), the epilogue-only decision from the schedule (schedule.h
//     backward_send_is_epilogue) through the pipeline policy's rule, and the LEP buffers from the
//     policy (PipelinePolicy::compresses_backward_send, lep_buffers; compression/pipeline_policy.h).
// Per class (stage k of p, m micro-batches, N = s·b·h elements per message, β bytes per element,
// slice = N/t with scatter-gather (t > 1, t | N), else N):
//   tp         m·[(L_k·k_TP + [k=0] + [k=p-1])·AR_t(N·β) + [k=p-1]·3·AR_t(s·b·4)], k_TP = 4
//              (2 forward, 2 backward all-reduces per layer; optcc does not recompute) or 6 with
//              options.recompute (the paper's runs: + 2 recomputed forward). The last term is the
//              vocab-parallel cross-entropy's 3 all-reduces of [s·b] fp32 that docs/design.md §9 neglects.
//              compression.tp fp16/bf16: 2 bytes per element except the max all-reduce.
//   pp_fwd     [k<p-1]·m sends on the pipeline link (slice·β, or the forward codec's payload)
//              + [k>0]·m all-gathers of (t-1)·slice·β on the TP link (scatter-gather only).
//   pp_bwd     [k>0]·m sends (compressed ones: the backward codec's payload, e.g. lowrank
//              4·r·(rows+cols)) + [k<p-1]·m all-gathers of (t-1)·slice·β on the TP link.
//   dp         the stage's DP reducer (compression.dp when SC's stage_compresses_dp says so, else none) over its DP
//              gradient list (every parameter, minus the word embedding under FE) on the DP group.
//   embedding  baseline: the 2-rank pair all-reduce of E·β (E = Vp·h/t) on the first and last
//              stage (p > 1); FE: one all-reduce of E·β over the 2d-rank FE group (d when p = 1).
//   control    not modelled (grad norm, loss, non-finite flags: a few scalars per step).
// Iteration = one optimizer step in steady state (after any reducer warm-up; see options.step).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "compression/comm_plan.h"
#include "harness/parallel/communicator.h"
#include "harness/config/config.h"
#include "harness/parallel/layout.h"
#include "harness/parallel/link_emulator.h"

namespace optcc {

/// One parameter of a pipeline stage as one tensor-parallel rank holds it (every TP rank of a
/// stage holds the same shapes).
struct ParamShape {
  std::string name;            // the GptModel::named_parameters() key, e.g. "blocks.0.attn.qkv.weight"
  std::vector<int64_t> shape;  // this TP rank's shard
  bool word_embedding = false;  // the tied word embedding [Vp/t, h] (first and last stage)
  int64_t numel() const;
};

/// The parameters GptModel registers on pipeline stage `stage` (0-based) for `cfg`, per TP rank,
/// in named_parameters() order (t = parallel.tp, h = hidden_size, Vp = padded_vocab_size(),
/// S = max_position_embeddings or seq_len, layers = stage_layer_counts()[stage]):
///   first stage:  position_embedding [S, h] (replicated over TP), embedding.weight [Vp/t, h]
///   last stage:   embedding.weight [Vp/t, h] (its own tied copy when pp > 1)
///   each layer i: blocks.i.ln1.{weight,bias} [h], attn.qkv.weight [3h/t, h], attn.qkv.bias [3h/t],
///                 attn.proj.weight [h, h/t], attn.proj.bias [h], ln2.{weight,bias} [h],
///                 mlp.fc1.weight [4h/t, h], mlp.fc1.bias [4h/t], mlp.fc2.weight [h, 4h/t],
///                 mlp.fc2.bias [h]   (i is the stage-local index, as in the model)
///   last stage:   final_ln.{weight,bias} [h]
/// So Θ_k = layers·(12h²/t + 7h/t + 6h) + [first](E + S·h) + [last](E + 2h), E = Vp·h/t (docs/design.md §9).
/// REQUIRES 0 <= stage < parallel.pp (std::out_of_range otherwise); h, 4h and Vp divisible by t.
std::vector<ParamShape> stage_parameter_shapes(const Config& cfg, int stage);

struct TrafficModelOptions;
/// Bytes per activation element the model counts: o.element_bytes when set, else the compute
/// dtype's of train.precision (models/precision.h).
int64_t activation_element_bytes(const Config& cfg, const TrafficModelOptions& o);
/// Bytes per gradient element: o.element_bytes when set, else 4 (fp32 master gradients).
int64_t gradient_element_bytes(const TrafficModelOptions& o);
/// Bytes per element of the uncompressed DP gradient all-reduce: o.element_bytes when set, else
/// parallel.grad_reduce_dtype's (compute: train.precision's compute dtype; fp32: 4).
int64_t uncompressed_dp_element_bytes(const Config& cfg, const TrafficModelOptions& o);

struct TrafficModelOptions {
  bool recompute = false;      // k_TP = 6 (full activation recomputation, as the paper's runs)
  /// β: bytes per activation and gradient element. 0 (default): activations (pipeline messages,
  /// TP all-reduces) in train.precision's compute dtype, gradients (DP, embedding) in fp32, as a
  /// run meters them; N > 0: both N (e.g. 2 for the paper's all-fp16 Megatron runs).
  int64_t element_bytes = 0;
  int64_t ranks_per_node = 0;  // 0: parallel.ranks_per_node, or 8 (the paper's nodes) if that is 0
  /// DP PowerSGD as the reference (docs/design.md §6.2): every ≥2-D gradient compressed, i.e. the reducer's
  /// min_compression_rate treated as 0. Off: the configured rule (default 2.0, BR-04).
  bool reference_powersgd = false;
  /// The global step being modelled: reducers whose warm-up covers it reduce raw. Default: after
  /// any warm-up.
  int64_t step = std::numeric_limits<int64_t>::max();
  bool gloo = false;  // CPU / Gloo: the bf16 DP reducer all-gathers instead of all-reducing
};

/// Σ ring_send_bytes over the collectives of `steps` on a group of `n` ranks (0 when n < 2).
int64_t sent_bytes(const std::vector<CommStep>& steps, int64_t n);

using ClassLinkBytes = std::array<std::array<int64_t, 2>, kNumTraffic>;  // [Traffic][Link]

/// One rank's bytes per iteration.
struct RankTrafficEstimate {
  int rank = 0;
  RankCoord coord;
  int node = 0;
  ClassLinkBytes bytes{};  // what this rank sends, by class and by its group's link
  int64_t total() const;
  int64_t of(Traffic cls) const { return bytes[static_cast<int>(cls)][0] + bytes[static_cast<int>(cls)][1]; }
};

/// Per GPU of one stage (all its TP and DP ranks alike), link aside.
struct StageTrafficEstimate {
  int64_t layers = 0;
  int64_t parameters = 0;      // Θ_k: elements per TP rank
  int64_t dp_elements = 0;     // of those, handed to the DP reducer (FE removes the word embedding)
  bool holds_word_embedding = false;
  std::string dp_reducer;      // the reducer this stage uses ("none" for SC-raw stages)
  bool compresses_dp = false;  // stage_compresses_dp() (compression/stage_selection.h); auto modelled as all
  int64_t tp = 0;              // bytes per GPU per iteration, by component
  int64_t pp_fwd_send = 0, pp_fwd_gather = 0;
  int64_t pp_bwd_send = 0, pp_bwd_gather = 0;
  int64_t backward_sends = 0, backward_compressed = 0;  // messages to stage k-1 per iteration
  int64_t dp = 0;
  int64_t dp_word_embedding_share = 0;  // baseline only: 2(d-1)/d·E·β of the DP all-reduce (docs/design.md §9)
  int64_t embedding = 0;       // dp_strategy: diloco adds the tied copy's broadcast, averaged per step
  int64_t outer = 0;           // dp_strategy: diloco: the outer reducers' bytes over a period ÷ H (floor)
  int64_t lep_bytes = 0;       // LEP buffers held at most (PipelinePolicy::lep_buffers() fp32 slices)

  // The operations behind these bytes, per TP rank (the simulator replays them):
  int64_t tp_message_bytes = 0;              // one layer all-reduce: N·β (the whole activation)
  int64_t tp_per_layer_forward = 0;          // all-reduces per layer and micro-batch: 2 (0 when t = 1)
  int64_t tp_per_layer_backward = 0;         // k_TP - 2
  std::vector<CommStep> tp_forward_extra;    // per micro-batch: embedding (first), cross-entropy (last)
  std::vector<CommStep> tp_backward_extra;   // per micro-batch: the tied output layer (last)
  int64_t pp_fwd_message = 0;                // one forward send (codec payload or slice·β)
  std::vector<int64_t> pp_bwd_messages;      // [v*m] bytes of the gradient of (chunk c, micro-batch i), at
                                             // c*m + i, to the previous virtual stage (0 where none is sent)
  std::vector<bool> pp_bwd_compressed;       // [v*m] whether that gradient is compressed (CB)
  int64_t pp_gather_bytes = 0;               // the receiver's TP all-gather input (slice·β; 0 without
                                             // scatter-gather)
  std::vector<CommStep> cb_encode, cb_decode;  // compute of one compressed gradient, sender / receiver
  std::vector<CommStep> dp_steps;            // the DP reducer's call
  std::vector<CommStep> embedding_steps;     // the embedding sync (first and last stage)
  int64_t embedding_group = 0;               // its group size (2, 2d under FE, 1 when p = 1 and no FE)
  /// dp_strategy: diloco: [F] the outer reducer's call for fragment f's parameters on this stage
  /// (empty when it holds none), and the tied copy's broadcast when fragment 0 lands (first and
  /// last stage, pp > 1). A sync step carries one of them; the other steps none.
  std::vector<std::vector<CommStep>> outer_steps;
  std::vector<CommStep> tied_copy_steps;
};

struct TrafficEstimate {
  ParallelDims dims;
  int ranks_per_node = 8;
  int64_t micro_batches = 0;     // m per pipeline per iteration
  int64_t message_elements = 0;  // N = s·b·h
  int64_t slice_elements = 0;    // what one TP rank sends per message (N/t with scatter-gather)
  bool scatter_gather = false;
  int64_t k_tp = 4;
  std::vector<StageTrafficEstimate> stages;  // [pp]
  std::vector<RankTrafficEstimate> ranks;    // [world], index = global rank
  ClassLinkBytes cluster{};                  // Σ over ranks
  std::array<bool, kNumTraffic> modelled{};  // false: the class's bytes are unknown (see notes)
  std::vector<std::string> notes;            // assumptions, and what is not modelled and why

  int64_t cluster_total(Traffic cls) const;
  int64_t cluster_total() const;  // all modelled classes
  /// The rank (tp 0, dp 0) of `stage`: the per-GPU figure of that stage.
  const RankTrafficEstimate& gpu(int stage) const;
};

/// Bytes per iteration for `cfg` (model.vocab_size must be known: > 0). Validates nothing beyond
/// what it needs; throws ConfigError for settings it cannot model consistently (an unknown codec,
/// a codec whose matrix view does not fit the message, ...).
TrafficEstimate estimate_traffic(const Config& cfg, const TrafficModelOptions& o = {});

/// A copy of `c` whose compressor options are deep copies: YAML nodes alias, so changing the
/// compression section of a plain copy (apply_compression_scheme) writes through to `c`.
Config detached_copy(const Config& c);

/// The rows of docs/design.md §9's worked-numbers table for `cfg`'s model and layout. Rows that compare
/// techniques evaluate estimate_traffic() on variants of `cfg`: its compression reset to the
/// baseline, plus CB (cfg's pipeline_backward codec, or the paper's lowrank rank 16 when cfg has
/// none) in epilogue or all phases, or plus FE+SC (cfg's dp reducer and dp_stages when cfg
/// compresses DP, else the `cb_fe_sc` scheme's PowerSGD rank 128 on stages 0..2).
struct PaperTrafficRows {
  std::vector<int64_t> stage_parameters;  // Θ_k per TP rank
  int64_t pp_message = 0;                 // N·β: one inter-stage message, all TP ranks
  int64_t pp_message_cb = -1;             // t × the CB codec's payload of one slice (-1: n/a)
  std::string cb_codec;                   // the CB codec used, as YAML
  std::string cb_label;                   // "CB" when that codec is CB's (the cb scheme's), else its
                                          // name (e.g. "hadamard"): what the rows' labels call it
  bool fe_sc_apply = true;                // false under dp_strategy diloco: FE and SC act on the
                                          // every-step DP reduction, which DiLoCo does not run
  int64_t pp_forward_total = 0;           // cluster, the stage-to-stage hop (sends) only
  int64_t pp_backward_baseline = 0, pp_backward_cb_epilogue = -1, pp_backward_cb_all = -1;
  std::vector<int64_t> dp_per_gpu_baseline;  // per stage
  std::vector<int64_t> dp_per_gpu_fe_sc;     // per stage (empty: n/a)
  int64_t dp_total_baseline = 0, dp_total_fe_sc = -1;
  std::string fe_sc_reducer;                 // the DP reducer of the FE+SC variant, as YAML
  std::string fe_sc_stages;                  // its dp_stages
  int64_t embedding_total_baseline = 0;      // pair sync + word-embedding share of DP (cluster)
  int64_t embedding_total_fe = 0;            // FE with per-TP-rank groups (optcc, docs/design.md §5.3)
  int64_t embedding_total_fe_reference = 0;  // the reference's single group: 2(n-1)·E·β
  int64_t tp_total = 0;                      // TP class, cluster (cfg's k_TP)
  int64_t lep_per_gpu = 0;                   // the most LEP bytes a GPU holds under cfg's lep mode: cfg's
                                             // CB, else the CB rows' epilogue variant (PipelinePolicy::lep_buffers() slices)
  std::vector<std::string> notes;
};
PaperTrafficRows paper_traffic_rows(const Config& cfg, const TrafficModelOptions& o = {});

}  // namespace optcc

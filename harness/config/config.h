// Experiment configuration: one struct per YAML section, each field with its unit, default and effect.
//
// A config file (experiments/*.yaml) is a small diff over these defaults. Loading rules:
//   * every key must be known; an unknown key is an error that lists the section's keys;
//   * a value must have the default's type (`--set section.key=value` too);
//   * `model.preset` is applied first, so explicit model keys override the preset's sizes;
//   * `validate()` checks cross-field rules before any work starts.
// Every error is a ConfigError whose message names the key, the value, the rule and the fix.
// The effective config (after presets and overrides) is written with every result (`to_yaml`).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "compression/pipeline_policy.h"
#include "compression/stage_selection.h"

namespace optcc {

/// Thrown for any bad configuration input; what() is a complete, user-facing message.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// `model:` GPT architecture (Megatron-style, pre-LayerNorm, tied input/output embedding).
struct ModelConfig {
  std::string preset = "tiny";   // size preset (models/presets.h); its sizes fill the fields below
  int64_t num_layers = 2;        // transformer blocks
  int64_t hidden_size = 64;      // h; MLP inner size is 4h
  int64_t num_heads = 2;         // attention heads; h % heads == 0 and heads % parallel.tp == 0
  int64_t seq_len = 64;          // tokens per sample (s)
  int64_t max_position_embeddings = 0;  // learned positions; 0 = seq_len
  int64_t vocab_size = 0;        // true vocabulary; 0 = read from the dataset's <prefix>.json
  int64_t vocab_divisor = 128;   // vocab is padded to a multiple of vocab_divisor * tp (BR-15)
  double hidden_dropout = 0.1;   // dropout after attention/MLP and on embeddings, probability
  double attention_dropout = 0.1;  // dropout on attention probabilities
  double init_std = 0.02;        // N(0, init_std) init; output projections use init_std/sqrt(2L)
  std::string attention = "auto";  // auto | explicit | fused: how attention is computed (models/gpt.h
                                   // AttentionKernel; fused: LibTorch >= 2.0, attention_dropout 0)
  template <class V> void visit(V&& v);
};

/// `parallel:` process layout: tp · pp · dp ranks (harness/parallel/layout.h).
struct ParallelConfig {
  int64_t tp = 1;              // tensor-parallel size
  int64_t pp = 1;              // pipeline-parallel size (stages)
  int64_t dp = 1;              // data-parallel size
  int64_t ranks_per_node = 0;  // ranks per node for intra/inter-node accounting; 0 = local world
  std::vector<int64_t> stage_layers;  // explicit layers per stage; empty = even split
  std::string schedule = "1f1b";     // pipeline schedule: 1f1b (Megatron, non-interleaved) | gpipe |
                                      // interleaved_1f1b | zb_h1 (harness/parallel/schedule.h)
  int64_t virtual_stages = 1;         // model chunks per stage (v): 1, or >= 2 with interleaved_1f1b,
                                      // whose stage k holds layers of virtual stages k, p + k, ...
  double timeout_seconds = 120.0;     // rendezvous and per-collective timeout, s; a dead rank ends
                                      // the run within this time
  std::string interface;              // network interface the Gloo groups listen on (e.g. eth0,
                                      // ib0); "" = GLOO_SOCKET_IFNAME when set, else the interface
                                      // routed to MASTER_ADDR (harness/parallel/distributed.h)
  std::string device = "auto";        // where tensors live: auto | cpu | cuda (cuda:LOCAL_RANK % GPUs);
                                      // auto = cuda in a CUDA build that sees a GPU, else cpu
  std::string grad_reduce_dtype = "fp32";  // dtype of the uncompressed DP gradient all-reduce on the
                                          // wire: fp32 | compute (train.precision's; fp32 runs: fp32).
                                          // compute sums in fp32 all the same (harness/train/grad_sync.h)
  std::string backend = "auto";       // c10d backend of every group: auto | gloo | nccl; auto = nccl
                                      // when each local rank has its own GPU, else gloo (Gloo carries
                                      // CUDA tensors too). Rules: harness/parallel/device.h
                                      // resolve_placement; cuda / nccl need a CUDA build
  template <class V> void visit(V&& v);
};

/// `train:` optimisation and schedule. Steps are optimizer steps (one global batch each).
struct TrainConfig {
  int64_t micro_batch_size = 4;    // sequences per micro-batch (b)
  int64_t global_batch_size = 8;   // sequences per step (B) = micro_batch_size * micro-batches * dp
  int64_t train_steps = 100;       // optimizer steps to run
  double lr = 1.0e-3;              // peak learning rate
  double min_lr = 1.0e-4;          // cosine decay floor
  int64_t warmup_steps = 10;       // linear warm-up from 0 to lr
  int64_t decay_steps = 0;         // cosine decay length after warm-up ends; 0 = train_steps
  double weight_decay = 0.01;      // decoupled (AdamW); not applied to biases and LayerNorm
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1.0e-8;
  double clip_grad = 1.0;          // global L2 norm clip; 0 = off
  int64_t seed = 1234;             // model init, dropout and data shuffle seed
  int64_t eval_interval = 50;      // N > 0: validation at step 0, every N steps and at the end; 0 = only at the end
  int64_t eval_iters = 10;         // validation micro-batches per evaluation
  int64_t threads = 0;             // intra-op CPU threads per rank; 0 = cores / local ranks
  std::string precision = "fp32";  // compute dtype: fp32 | bf16 | fp16 (fp32 master weights,
                                   // optimizer and compressor state; models/precision.h). fp16
                                   // scales the loss dynamically (below; harness/train/loss_scaler.h)
                                   // and needs a GPU or LibTorch 2.x (1.13 has no CPU fp16 GEMM)
  double loss_scale_initial = 65536.0;    // fp16 only: the loss scale S at step 0
  int64_t loss_scale_growth_interval = 1000;  // fp16 only: steps without overflow before S doubles
  double loss_scale_backoff = 0.5;        // fp16 only: S *= backoff on an overflow, in (0, 1)
  double loss_scale_min = 1.0;            // fp16 only: floor of S
  int64_t max_skipped_steps = 20;         // a run skipping more steps than this in a row (inf/NaN
                                          // gradients, any precision) stops with an error; 0 = never
  bool skip_nonfinite = false;            // fp32/bf16: inf/NaN gradients stop the run, naming the rank,
                                          // step and tensor (false), or skip the step like an fp16
                                          // overflow (true). fp16 always skips (its loss scale backs off)
  template <class V> void visit(V&& v);
};

/// `data:` corpus, tokenizer and indexed dataset.
struct DataConfig {
  std::string dir = "data";                // cache root: raw packages, corpus JSONL, index caches
  std::vector<std::string> sources = {"nlp-corpus", "brown"};  // built-in names or .jsonl/.txt paths
  std::string prefix = "data/corpus";      // indexed dataset <prefix>.bin/.idx/.json/.model
  int64_t vocab_size = 8000;               // SentencePiece vocabulary size (data prepare)
  std::string tokenizer_type = "unigram";  // SentencePiece model: unigram | bpe
  std::string split = "949,50,1";          // train,valid,test document weights
  template <class V> void visit(V&& v);
};

/// A compressor and its options. In YAML either a name (`dp: powersgd`) or a mapping with the
/// name and the compressor's options (`dp: {name: powersgd, rank: 4, error_feedback: true}`).
/// Copies are deep: a YAML::Node is a reference, and assigning to one writes through to every
/// copy sharing it, so copying a Config and changing the copy must not touch the original.
struct CompressorSpec {
  std::string name = "none";
  YAML::Node options;  // the compressor's own keys (validated by the compressor's factory)

  CompressorSpec() = default;
  CompressorSpec(const CompressorSpec& o) : name(o.name), options(clone(o.options)) {}
  CompressorSpec& operator=(const CompressorSpec& o) {
    if (this != &o) {
      name = o.name;
      options.reset(clone(o.options));  // rebind, never write through
    }
    return *this;
  }

 private:
  static YAML::Node clone(const YAML::Node& n) { return n.IsDefined() ? YAML::Clone(n) : YAML::Node(); }
};

/// `compression:` compressor per traffic class and the Optimus-CC techniques (docs/design.md §2-§6);
/// `none` everywhere (the default) is the uncompressed baseline, bit-identical to it.
///   dp                 GradReducer (compression/grad_reducer.h registry): none, fp16, bf16,
///                      powersgd, topk, randomk, qsgd, signsgd.
///   dp_stages          SC (docs/design.md §6.5): `all` (every stage compresses its DP gradients), an
///                      integer `way` (stages 0..way-1 compress, the rest reduce raw), or `auto`:
///                      a calibration step before training measures each stage's schedule end
///                      and raw DP all-reduce time, and stage k compresses iff its raw all-reduce
///                      would end after stage 0's compressed one (docs/design.md §6.5's rule
///                      T_raw(k) > (end_0 − end_k) + T_dp(0)); the choice is logged, stored in the
///                      results and the checkpoints (a resumed run keeps it).
///   embedding          GradReducer for the tied-embedding synchronisation (pair or FE group).
///   fused_embedding    FE (docs/design.md §5.2): word-embedding gradients leave the DP reduction; one
///                      all-reduce over {first, last stage} x all DP replicas per TP rank, ÷ dp.
///   pipeline_forward   ActCodec (compression/act_codec.h) for inter-stage activations.
///   pipeline_backward  ActCodec for inter-stage activation gradients; `lowrank` = CB (docs/design.md §2).
///   backward_phases    which backward sends are compressed: `all` or `epilogue` (docs/design.md §4).
///   lep                error feedback of compressed backward sends (docs/design.md §3): `lazy` (one buffer
///                      per rank, the paper), `off` (NON-LEP), `per_microbatch` (one per slot, m
///                      buffers), `lazy_iteration` (one buffer, dropped at the end of every
///                      iteration), `lazy_decay` (one buffer, carried scaled by lep_decay);
///                      see compression/pipeline_policy.h. Both names are parsed when the config
///                      is loaded; an unknown one is refused there, naming the known ones.
///   lep_decay          β in (0, 1] of lep: lazy_decay (1 = lazy bit for bit); only with lazy_decay.
///   tp                 tensor-parallel all-reduces: none, fp16 or bf16 (cast on the wire).
///   scheme             a named row of the paper applied before the other keys of the section:
///                      baseline | cb | cb_fe | cb_fe_sc | cb_nonlep (docs/design.md §8.1); "" = none.
///                      A scheme keeps dp_strategy and the diloco: section as they are.
///   dp_strategy        how data-parallel replicas agree: `allreduce` (a reducer over the gradients
///                      of every step, compression.dp) or `diloco` (each replica takes
///                      diloco.inner_steps optimizer steps alone, then the replicas average their
///                      outer gradients: the `diloco:` section, harness/train/outer_sync.h).
///                      diloco needs compression.dp: none and fused_embedding: false.

/// `diloco:` DiLoCo and Streaming DiLoCo across the data-parallel replicas (compression.dp_strategy:
/// diloco; harness/train/outer_sync.h has the algorithm). Only read under diloco; any key set
/// otherwise is refused.
///   inner_steps     H >= 1: optimizer steps each replica takes alone between two syncs of a fragment.
///   outer_lr        > 0: the outer SGD's learning rate on the averaged outer gradient.
///   outer_momentum  in [0, 1): the outer SGD's momentum (0: none).
///   nesterov        Nesterov momentum (needs outer_momentum > 0 to act).
///   fragments       F in [1, min(H, model.num_layers)]: the model's layers cut into F contiguous
///                   fragments (embeddings with the first, the final LayerNorm with the last), synced
///                   on a staggered schedule: fragment f after the steps t with t mod H = floor((f+1)H/F) mod H.
///                   1 = DiLoCo.
///   sync_delay      tau in [0, H): a fragment's outer update is applied tau steps after its outer
///                   gradient was taken (Streaming DiLoCo's overlap); 0 = at once.
///   mix             alpha in [0, 1]: the applied fragment becomes alpha * local + (1 - alpha) * global
///                   (0 = the global value, as DiLoCo).
///   outer           GradReducer (compression/grad_reducer.h) of the outer gradients over the DP group,
///                   traffic class `outer`: none (fp32), fp16, bf16, qsgd, powersgd, ...
struct DilocoConfig {
  int64_t inner_steps = 16;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool nesterov = true;
  int64_t fragments = 1;
  int64_t sync_delay = 0;
  double mix = 0.0;
  CompressorSpec outer;
  template <class V> void visit(V&& v);
};

struct CompressionConfig {
  std::string scheme = "";
  CompressorSpec dp;
  DpStages dp_stages;  // parsed at load (compression/stage_selection.h)
  CompressorSpec embedding;
  bool fused_embedding = false;
  CompressorSpec pipeline_forward;
  CompressorSpec pipeline_backward;
  BackwardPhases backward_phases = BackwardPhases::kAll;  // parsed at load (compression/pipeline_policy.h)
  LepMode lep = LepMode::kLazy;
  double lep_decay = 1.0;
  CompressorSpec tp;
  std::string dp_strategy = "allreduce";  // allreduce | diloco
  DilocoConfig diloco;  // the `diloco:` section (a section of its own in the file, for_each_section)
  template <class V> void visit(V&& v);
  bool diloco_on() const { return dp_strategy == "diloco"; }
  /// backward_phases, lep and lep_decay as the one policy object the pipeline codec and the traffic
  /// model apply.
  PipelinePolicy pipeline_policy() const { return {backward_phases, lep, lep_decay}; }
};

/// The scheme names `compression.scheme` accepts, and applying one (resets the section first).
std::vector<std::string> compression_scheme_names();
/// Throws ConfigError naming the known schemes when `name` is unknown.
void apply_compression_scheme(CompressionConfig& c, const std::string& name);

/// True when the section compresses no traffic class (every compressor `none`, no FE) and the
/// replicas all-reduce every step (dp_strategy allreduce): the uncompressed baseline, whatever
/// `scheme` says.
bool compresses_nothing(const CompressionConfig& c);

/// What a run compresses, in one short label: the name a run goes by in the log, the results
/// files' root attribute `compression`, `optcc sweep --json`, the results index, tables and legends.
///   baseline           compresses_nothing();
///   a scheme's name    the section acts exactly as that scheme (compression_scheme_names()) does,
///                      whether or not `scheme` names it, e.g. cb_fe_sc;
///   `S with ...`       `scheme` names S (not baseline) and other settings changed it: what differs
///                      from S, e.g. `cb_fe_sc with dp=powersgd(error_feedback=true,rank=16,warmup_steps=0)`
///                      or `cb with backward_phases=all lep=off`;
///   else               the settings that differ from the uncompressed default, with the config's
///                      own key names and the compressor's options (keys sorted), space-separated,
///                      e.g. `dp=powersgd(rank=4)`, `dp=topk(fraction=0.01) dp_stages=2`,
///                      `pipeline_backward=lowrank(rank=8) backward_phases=epilogue lep=off`.
/// Under dp_strategy: diloco the last word is `dp_strategy=diloco(<every diloco: key, sorted>)`,
/// e.g. `cb with dp_strategy=diloco(fragments=2,inner_steps=16,...)`.
/// Settings that act on nothing are left out (lep without a compressed backward, dp_stages with
/// dp none), so two runs that compress alike get one label.
std::string compression_label(const CompressionConfig& c);

/// `network:` link emulation (docs/architecture.md §5; the cost model is in harness/parallel/link_emulator.h).
///   emulate                delay every transfer of tp, pp_fwd, pp_bwd, dp and embedding traffic to
///                          what the declared links allow; computation runs at this machine's speed.
///                          Needs both bandwidths (directly or from `profile`). Refused when the
///                          ranks span more than one host (the shared NICs live in one machine's
///                          shared memory, and real links would only add to the declared ones).
///   profile                a preset of the four link keys: "" (none) or paper-a100-ib200
///                          (docs/design.md §8.1: 25 GB/s per node, NVLink 300 GB/s; network_profile_names()). A link
///                          key set explicitly (file or --set) wins, in whatever order the two come.
///   intra_node_gbps        GB/s (1e9 bytes/s) of the link between two ranks of one node, per
///                          direction; every pair has its own (NVLink-like, nothing shared).
///   inter_node_gbps        GB/s of one node's NIC, per direction, SHARED by all ranks of that node
///                          (the paper's 8 GPUs behind one 200 Gb/s HCA): concurrent transfers queue.
///   intra_node_latency_us  µs per message or ring step inside a node.
///   inter_node_latency_us  µs per message or ring step between nodes.
///   scale                  multiplies every emulated time (latency and transfer); > 0, default 1.
///                          Puts a CPU-sized model into the paper's communication/compute ratio;
///                          each experiment that uses it states how its value was chosen.
///   match_regime           "" (off), or a paper run's config file (e.g. experiments/paper/gpt-2.5b.yaml):
///                          the run derives `scale` when it starts, so that its baseline spends the
///                          same share of its iteration in inter-node traffic as that run on the
///                          `profile`'s cluster, whatever this CPU's speed (harness/perfmodel/regime.h:
///                          its ranks measure this machine for ~10 s, the simulator matches the
///                          share), and sets both latencies to the profile's / scale. Needs emulate
///                          and a profile; `scale` and the latency keys must then be left unset. The
///                          derived values are logged and recorded (root attribute network_regime;
///                          the recorded config holds the derived scale with match_regime "").
///                          `from:<results file>` reuses the links an earlier run derived (its
///                          recorded scale and latencies; same profile), measuring nothing: the
///                          second run of a comparison then runs on the first one's links.
///   skip                   traffic classes whose transfers are skipped (tp, pp_fwd, pp_bwd, dp,
///                          embedding; optcc's addition, docs/design.md §8.3): no real operation and no emulated time,
///                          shapes kept (a skipped receive yields zeros, a skipped all-reduce leaves
///                          the local tensor). Works with or without emulate; the results are
///                          marked `trainable_result = false`.
/// With emulate false and skip empty nothing of this is constructed (no clock reads, no shared
/// memory); the declared links are then only recorded in the results (and the log says so).
/// network.match_regime's prefix for reusing a recorded regime: `from:<results file>`.
inline constexpr char kRecordedRegimePrefix[] = "from:";

struct NetworkConfig {
  bool emulate = false;
  std::string profile = "";
  double intra_node_gbps = 0.0;
  double inter_node_gbps = 0.0;
  double intra_node_latency_us = 0.0;
  double inter_node_latency_us = 0.0;
  double scale = 1.0;
  std::string match_regime = "";
  std::vector<std::string> skip;
  std::vector<std::string> explicit_keys;  // not a YAML key: link keys and scale set by a file or
                                           // --set; a profile never overwrites a link key, and
                                           // match_regime refuses them (config_io.cpp)
  template <class V> void visit(V&& v);
};

/// Profile names `network.profile` accepts ("" is none).
std::vector<std::string> network_profile_names();
/// Applies profile `name` to the four link keys of `n` except those in n.explicit_keys; "" resets
/// them (the non-explicit ones) to 0. Throws ConfigError naming the known profiles. load_config()
/// calls it; code that sets `profile` on a Config must call it too.
void apply_network_profile(NetworkConfig& n, const std::string& name);
/// The traffic class names `network.skip` accepts: tp, pp_fwd, pp_bwd, dp, embedding, outer (communicator.h).
std::vector<std::string> network_skip_names();
struct Config;
/// The network section's rules (profile known, bandwidths/latencies >= 0, scale > 0, emulate needs
/// both bandwidths, skip names known and unique); Config::validate() calls it. Throws ConfigError.
void validate_network_config(const Config& c);

/// `log:` progress lines and the HDF5 results file.
struct LogConfig {
  std::string dir = "results";   // results/<run_name>.h5
  std::string run_name = "";     // "" = config file stem
  int64_t interval = 10;         // steps between progress lines and HDF5 flushes
  std::string level = "info";    // spdlog level: debug | info | warn
  bool lep_orthogonality = false;  // Fig. 11 diagnostic on the last stage (/lep_orthogonality)
  bool lep_diagnostics = false;    // per compressed backward send, every sending rank (/lep_diagnostics)
  std::vector<int64_t> timeline_steps;  // steps (1-based, as logged) whose per-rank events go to
                                        // /timeline and /breakdown (harness/parallel/timeline.h); [] = none,
                                        // and then no event is recorded at all
  template <class V> void visit(V&& v);
};

/// `checkpoint:` periodic, atomic checkpoints (model, optimizer, RNG, data position, step).
struct CheckpointConfig {
  std::string dir = "";    // "" = results/ckpt/<run_name>
  int64_t interval = 0;    // steps between checkpoints; 0 = none (a final one is still written
                           // when `save_final` is true)
  bool save_final = false; // write a checkpoint after the last step
  int64_t keep = 2;        // most recent checkpoints kept on disk; 0 = keep all
  template <class V> void visit(V&& v);
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  DataConfig data;
  CompressionConfig compression;
  NetworkConfig network;
  LogConfig log;
  CheckpointConfig checkpoint;
  std::string source_path;  // the YAML file this came from ("" = defaults only)

  /// Cross-field rules for a run on `world_size` ranks. Throws ConfigError naming key, value,
  /// rule and fix. Call once the vocabulary is known (after `resolve_vocab`). `limits`: kThisBuild
  /// (runs) also refuses what this build cannot run (a GPU device or backend on a CPU build, fp16
  /// compute without fp16 GEMMs); kAnyBuild (analytic tools: traffic model, simulator) does not.
  enum class BuildLimits { kThisBuild, kAnyBuild };
  void validate(int64_t world_size = 1, BuildLimits limits = BuildLimits::kThisBuild) const;
  /// Only the parallel section's rules (tp*pp*dp == world_size, ...), for launchers.
  void validate_layout(int64_t world_size) const;
  /// Transformer layers of each pipeline stage (explicit list or even split), sum = num_layers.
  std::vector<int64_t> stage_layer_counts() const;
  /// Micro-batches per step and per data-parallel replica: B / (b * dp).
  int64_t num_micro_batches() const;
  /// Vocabulary padded to a multiple of vocab_divisor * tp (BR-15).
  int64_t padded_vocab_size() const;
  std::string run_name() const;
  std::string checkpoint_dir() const;
};

/// Loads `path` over the defaults, then applies `overrides` ("section.key=value", in order).
/// A key written twice in one mapping of `node`, at any depth (yaml-cpp keeps both and lookups
/// see the first): "<dotted.path> (lines A and B)" for the first such key in document order, ""
/// when every mapping's keys are distinct. Config files, --set values and experiment files are
/// checked with it before they are read.
std::string repeated_yaml_key(const YAML::Node& node);

/// Throws ConfigError (unknown key, repeated key, wrong type, unreadable file) before any work starts.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
/// The same from YAML text (e.g. the effective config a checkpoint stores); `origin` names the text
/// in errors. source_path stays "" (set log.run_name to keep a run's name). Throws ConfigError.
Config load_config_text(const std::string& yaml, const std::string& origin,
                        const std::vector<std::string>& overrides = {});
/// Applies one "section.key=value" override in place.
void apply_override(Config& cfg, const std::string& assignment);
/// The effective config as YAML text (all sections, all keys).
std::string to_yaml(const Config& cfg);
/// A compressor spec as one line of YAML: `powersgd` or `{name: powersgd, rank: 4}`.
std::string to_yaml_value(const CompressorSpec& spec);

/// The options handed to make_act_codec() for a pipeline codec: the user's, plus the model's message
/// sizes (hidden, seq_len, micro-batch size) where the codec takes them and the user gave none
/// (act_codec_options() in compression/act_codec.h).
YAML::Node pipeline_codec_options(const Config& c, const CompressorSpec& spec);

/// SC (docs/design.md §6.5): compression.dp_stages.way(parallel.pp), the number of leading stages
/// that compress DP gradients: pp for `all`, the integer way capped at pp, or -1 for `auto`
/// (decided at run time). Which stage compresses is stage_compresses_dp()'s (compression/stage_selection.h).
int64_t sc_way(const Config& c);
/// The precision name ("fp32", "bf16", "fp16") the uncompressed DP gradient all-reduce carries:
/// train.precision's with parallel.grad_reduce_dtype: compute, else "fp32" (an fp32 run's compute
/// is fp32). The gradient sync, the traffic model and the log read it from here.
std::string uncompressed_dp_dtype(const Config& c);
/// If model.vocab_size is 0, reads it from <data.prefix>.json; throws ConfigError if unavailable.
/// Any other value is left as it is (a negative one for validate() to reject).
void resolve_vocab(Config& cfg);

/// Before the first step (the trainer's open_data): every token id of the dataset must index the
/// embedding, i.e. 0 ≤ min_token_id and max_token_id < model.vocab_size (after resolve_vocab);
/// and the .bin must fit the .json next to it (max_token_id < dataset_vocab_size when that is
/// known, > 0). Throws ConfigError naming both sizes, model.vocab_size / data.vocab_size and the
/// fix, instead of LibTorch's "index out of range in self" at the first forward.
/// Also refuses a dataset prepared with another tokenizer: dataset_vocab_size > 0 (from <prefix>.json)
/// must equal model.vocab_size (check_tokenizer_vocab).
void check_dataset_vocab(const Config& cfg, int64_t min_token_id, int64_t max_token_id, int64_t dataset_vocab_size);

/// The tokenizer record rule alone: a dataset whose <prefix>.json says vocab_size V > 0 was tokenized
/// with a V-piece vocabulary, and trains only a model with model.vocab_size == V (ids below the
/// vocabulary size are not enough: an 8k-piece corpus fits a 50257-row embedding and is still the
/// wrong data). Throws ConfigError naming both sizes, the dataset and the fix. V <= 0: nothing known.
void check_tokenizer_vocab(const Config& cfg, int64_t dataset_vocab_size);

/// <prefix>.json's vocab_size, as `optcc data prepare` records it; 0 when the file does not exist.
/// Throws ConfigError when it exists but holds no readable vocab_size.
int64_t prepared_vocab_size(const std::string& prefix);

}  // namespace optcc

#include "harness/config/config_fields.h"

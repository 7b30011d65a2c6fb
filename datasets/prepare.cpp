#include "datasets/prepare.h"

#include <atomic>
#include <chrono>
#include <numeric>
#include <random>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "datasets/documents.h"
#include "datasets/indexed_dataset.h"
#include "datasets/io_util.h"

namespace optcc::data {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void say(const PrepareLogFn& log, const std::string& msg) {
  if (log) log(msg);
}

// Token ids of every document (EOD appended), tokenized on `threads` threads in document order.
std::vector<std::vector<int>> tokenize_all(const Tokenizer& tok, const std::vector<std::string>& docs, int threads) {
  std::vector<std::vector<int>> ids(docs.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&] {
    try {
      for (size_t i; !failed && (i = next.fetch_add(64)) < docs.size();)
        for (size_t k = i; k < std::min(docs.size(), i + 64); ++k) {
          ids[k] = tok.encode(docs[k]);
          ids[k].push_back(tok.eod_id());
        }
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return ids;
}

// Document write order: identity, or a Fisher-Yates permutation from mt19937_64(seed) (rejection-
// sampled bounds, so the order is the same with every standard library).
std::vector<size_t> document_order(size_t n, bool shuffle, uint64_t seed) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  if (!shuffle) return order;
  std::mt19937_64 rng(seed);
  for (size_t i = n; i > 1; --i) {
    const uint64_t bound = i, threshold = (0 - bound) % bound;
    uint64_t r;
    do r = rng(); while (r < threshold);
    std::swap(order[i - 1], order[r % bound]);
  }
  return order;
}

}  // namespace

PrepareSummary prepare_dataset(const PrepareOptions& o, const PrepareLogFn& log) {
  if (o.inputs.empty()) throw std::invalid_argument("prepare: no --input given");
  if (o.output_prefix.empty()) throw std::invalid_argument("prepare: --output-prefix is empty");
  PrepareSummary sum;
  const auto parent = std::filesystem::path(o.output_prefix).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);

  // 1. Read and validate every input before spending minutes on training.
  auto t0 = Clock::now();
  std::vector<std::string> docs;
  nlohmann::json sources = nlohmann::json::array();
  std::vector<size_t> source_end;  // docs index where each input ends
  for (const auto& path : o.inputs) {
    int64_t empty = 0;
    auto part = read_documents(path, o.json_key, &empty);
    if (part.empty()) throw std::runtime_error(fmt::format("{}: no documents (empty input?)", path));
    say(log, fmt::format("{}: {} documents{}", path, part.size(), empty ? fmt::format(" ({} empty skipped)", empty) : ""));
    sources.push_back({{"path", path}, {"documents", part.size()}});
    for (auto& d : part) docs.push_back(std::move(d));
    source_end.push_back(docs.size());
  }
  sum.read_seconds = seconds_since(t0);

  // 2. Tokenizer: reuse unless asked to retrain.
  const std::string model_path = o.output_prefix + ".model";
  std::error_code ec;
  if (o.retrain || !std::filesystem::exists(model_path, ec)) {
    t0 = Clock::now();
    say(log, fmt::format("training {} SentencePiece model, vocab {}, on {} documents ...", o.tokenizer.model_type,
                         o.tokenizer.vocab_size, docs.size()));
    train_tokenizer(docs, o.output_prefix, o.tokenizer);
    sum.trained = true;
    sum.train_seconds = seconds_since(t0);
  }
  Tokenizer tok(model_path);
  sum.vocab_size = tok.vocab_size();
  if (!sum.trained && sum.vocab_size != o.tokenizer.vocab_size)
    say(log, fmt::format("reusing {} (vocab {}); --vocab-size {} ignored, pass --retrain to train anew", model_path,
                         sum.vocab_size, o.tokenizer.vocab_size));

  // 3. Tokenize, then write one sequence (= one document) per input document.
  t0 = Clock::now();
  const auto ids = tokenize_all(tok, docs, o.num_threads);
  const DType dtype = token_dtype_for_vocab(sum.vocab_size);
  sum.dtype = dtype_name(dtype);
  IndexedDatasetBuilder builder(o.output_prefix, dtype);
  std::vector<int64_t> seq;
  for (size_t i : document_order(ids.size(), o.shuffle_documents, o.tokenizer.seed)) {
    seq.assign(ids[i].begin(), ids[i].end());
    builder.add_sequence(seq);
    builder.end_document();
    sum.tokens += int64_t(seq.size());
  }
  builder.finalize();
  for (size_t src = 0, i = 0; src < source_end.size(); ++src) {
    int64_t tokens = 0;
    for (; i < source_end[src]; ++i) tokens += int64_t(ids[i].size());
    sources[src]["tokens"] = tokens;
  }
  sum.documents = int64_t(docs.size());
  sum.tokenize_seconds = seconds_since(t0);

  nlohmann::json meta = {{"vocab_size", sum.vocab_size}, {"eod_id", tok.eod_id()}, {"tokenizer_model", model_path},
                         {"documents", sum.documents}, {"tokens", sum.tokens}, {"dtype", sum.dtype},
                         {"document_order", o.shuffle_documents ? fmt::format("shuffled (seed {})", o.tokenizer.seed)
                                                                : std::string("input")},
                         {"sources", sources}};
  write_file_atomic(o.output_prefix + ".json", meta.dump(2) + "\n");
  return sum;
}

}  // namespace optcc::data

#include "datasets/prepare.h"

#include <atomic>
#include <chrono>
#include <numeric>
#include <random>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
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

struct TokenIds {
  int64_t tokens = 0, min = 0, max = -1;  // count and range of the ids written (max -1: none)
};

// Writes <prefix>.bin/.idx: one sequence (= one document) per entry of `ids`, in document_order().
TokenIds write_documents(const PrepareOptions& o, DType dtype, const std::vector<std::vector<int>>& ids) {
  IndexedDatasetBuilder builder(o.output_prefix, dtype);
  TokenIds r;
  int64_t lo = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> seq;
  for (size_t i : document_order(ids.size(), o.shuffle_documents, o.tokenizer.seed)) {
    seq.assign(ids[i].begin(), ids[i].end());
    for (int64_t id : seq) lo = std::min(lo, id), r.max = std::max(r.max, id);
    builder.add_sequence(seq);
    builder.end_document();
    r.tokens += int64_t(seq.size());
  }
  builder.finalize();
  r.min = r.max < 0 ? 0 : lo;
  return r;
}

// SHA-256 of the documents of one source (as read: after JSONL decoding), NUL-separated.
std::string documents_sha256(const std::vector<std::string>& docs, size_t begin, size_t end) {
  std::string all;
  for (size_t i = begin; i < end; ++i) all.append(docs[i]).push_back('\0');
  return sha256_hex(all.data(), all.size());
}

struct Inputs {
  std::vector<std::string> docs;                           // every input's documents, in order
  nlohmann::json sources = nlohmann::json::array();        // per input: {path, documents, sha256}
  std::vector<size_t> end;                                 // docs index where each input ends
};

// Reads and validates every input (errors name the file and line).
Inputs read_inputs(const PrepareOptions& o, const PrepareLogFn& log) {
  Inputs in;
  for (const auto& path : o.inputs) {
    int64_t empty = 0;
    auto part = read_documents(path, o.json_key, &empty);
    if (part.empty()) throw std::runtime_error(fmt::format("{}: no documents (empty input?)", path));
    say(log, fmt::format("{}: {} documents{}", path, part.size(), empty ? fmt::format(" ({} empty skipped)", empty) : ""));
    const size_t begin = in.docs.size();
    for (auto& d : part) in.docs.push_back(std::move(d));
    in.end.push_back(in.docs.size());
    in.sources.push_back({{"path", path}, {"documents", part.size()}, {"sha256", documents_sha256(in.docs, begin, in.docs.size())}});
  }
  return in;
}

// Everything the tokenizer model depends on: its settings and the content of every source, in
// order (a changed file, an added or removed source, or another order trains a different model).
nlohmann::json training_record(const PrepareOptions& o, const nlohmann::json& sources) {
  const auto& t = o.tokenizer;
  nlohmann::json src = nlohmann::json::array();
  for (const auto& s : sources) src.push_back({{"path", s["path"]}, {"documents", s["documents"]}, {"sha256", s["sha256"]}});
  return {{"vocab_size", t.vocab_size},         {"model_type", t.model_type},
          {"seed", t.seed},                     {"character_coverage", t.character_coverage},
          {"byte_fallback", t.byte_fallback},   {"hard_vocab_limit", t.hard_vocab_limit},
          {"input_sentence_size", t.input_sentence_size}, {"json_key", o.json_key},
          {"sources", src}};
}

std::string file_sha256(const std::string& path) {
  const std::string bytes = read_file(path);
  return sha256_hex(bytes.data(), bytes.size());
}

nlohmann::json read_json_or_null(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return nullptr;
  return nlohmann::json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
}

// How the sources differ: "content of a.jsonl changed" or "sources [a.jsonl] -> [a.jsonl, b.txt]".
std::string sources_change(const nlohmann::json& before, const nlohmann::json& now) {
  auto paths = [](const nlohmann::json& list) {
    std::vector<std::string> p;
    for (const auto& s : list) p.push_back(s.value("path", std::string("?")));
    return fmt::format("[{}]", fmt::join(p, ", "));
  };
  if (!before.is_array() || before.size() != now.size()) return fmt::format("sources {} -> {}", paths(before), paths(now));
  std::vector<std::string> changed;
  for (size_t i = 0; i < now.size(); ++i) {
    if (before[i].value("sha256", std::string()) != now[i]["sha256"].get<std::string>() ||
        before[i].value("documents", int64_t(-1)) != now[i]["documents"].get<int64_t>())
      changed.push_back(now[i]["path"].get<std::string>());
  }
  return changed.empty() ? "" : fmt::format("content of {} changed", fmt::join(changed, ", "));
}

// Why <prefix>.model must be trained (anew); "" to reuse it. `wanted` is training_record().
std::string train_reason(const PrepareOptions& o, const nlohmann::json& wanted, const std::string& model_path,
                         const PrepareLogFn& log) {
  std::error_code ec;
  if (o.retrain) return "--retrain given";
  if (!std::filesystem::exists(model_path, ec)) return fmt::format("no {} yet", model_path);
  const auto meta = read_json_or_null(o.output_prefix + ".json");
  const auto rec = meta.is_object() ? meta.value("tokenizer_training", nlohmann::json()) : nlohmann::json();
  if (!rec.is_object()) {  // an older optcc's or a hand-made .json: only the size can be compared
    const int have = Tokenizer(model_path).vocab_size();
    if (have != o.tokenizer.vocab_size && o.tokenizer.hard_vocab_limit)
      return fmt::format("{} has {} pieces, data.vocab_size (--vocab-size) asks for {}", model_path, have,
                         o.tokenizer.vocab_size);
    say(log, fmt::format("reusing {} ({} pieces); {}.json does not record what it was trained with, so only its "
                         "size was compared. Pass --retrain (`optcc data prepare --retrain`) to train anew",
                         model_path, have, o.output_prefix));
    return "";
  }
  const auto recorded_sha = rec.value("model_sha256", nlohmann::json());
  if (!recorded_sha.is_string() || recorded_sha.get<std::string>() != file_sha256(model_path))
    return fmt::format("{} is not the model {}.json records (replaced since)", model_path, o.output_prefix);
  std::vector<std::string> why;
  for (const auto& [key, value] : wanted.items()) {
    if (key == "sources") continue;
    if (!rec.contains(key) || rec[key] != value)
      why.push_back(fmt::format("{} {} -> {}", key, rec.contains(key) ? rec[key].dump() : "(unrecorded)", value.dump()));
  }
  const std::string src = sources_change(rec.value("sources", nlohmann::json()), wanted["sources"]);
  if (!src.empty()) why.push_back(src);
  if (why.empty()) say(log, fmt::format("reusing {}: trained with these settings on these sources", model_path));
  return fmt::format("{}", fmt::join(why, "; "));
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
  Inputs in = read_inputs(o, log);
  const std::vector<std::string>& docs = in.docs;
  nlohmann::json& sources = in.sources;
  const std::vector<size_t>& source_end = in.end;
  sum.read_seconds = seconds_since(t0);

  // 2. Tokenizer: reuse it only if it was trained with these settings on these sources.
  const std::string model_path = o.output_prefix + ".model";
  nlohmann::json record = training_record(o, sources);
  const std::string why = train_reason(o, record, model_path, log);
  if (!why.empty()) {
    t0 = Clock::now();
    say(log, fmt::format("training {} SentencePiece model, vocab {}, on {} documents ({}) ...",
                         o.tokenizer.model_type, o.tokenizer.vocab_size, docs.size(), why));
    train_tokenizer(docs, o.output_prefix, o.tokenizer);
    sum.trained = true;
    sum.train_seconds = seconds_since(t0);
  }
  record["model_sha256"] = file_sha256(model_path);
  Tokenizer tok(model_path);
  sum.vocab_size = tok.vocab_size();

  // 3. Tokenize, then write one sequence (= one document) per input document.
  t0 = Clock::now();
  const auto ids = tokenize_all(tok, docs, o.num_threads);
  const DType dtype = token_dtype_for_vocab(sum.vocab_size);
  sum.dtype = dtype_name(dtype);
  const TokenIds range = write_documents(o, dtype, ids);
  sum.tokens = range.tokens;
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
                         {"sources", sources},
                         // What the training binary checks before the first step (dataset_vocab):
                         {"min_token_id", range.min}, {"max_token_id", range.max},
                         {"index_sha256", IndexedDataset(o.output_prefix).index_digest()},
                         // What the tokenizer was trained with: a change retrains (train_reason).
                         {"tokenizer_training", record}};
  write_file_atomic(o.output_prefix + ".json", meta.dump(2) + "\n");
  return sum;
}

}  // namespace optcc::data

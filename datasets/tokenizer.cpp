#include "datasets/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

#include "datasets/io_util.h"

namespace optcc::data {
namespace {

constexpr size_t kMaxLineBytes = 2000;

// Writes the training lines of one document: its "\n"-separated lines, long ones cut at spaces.
void write_training_lines(std::ofstream& out, const std::string& doc) {
  size_t start = 0;
  while (start <= doc.size()) {
    size_t end = doc.find('\n', start);
    if (end == std::string::npos) end = doc.size();
    size_t a = start;
    while (end - a > kMaxLineBytes) {
      size_t cut = doc.rfind(' ', a + kMaxLineBytes);
      if (cut == std::string::npos || cut <= a) cut = a + kMaxLineBytes;
      out.write(doc.data() + a, std::streamsize(cut - a)) << '\n';
      a = cut + (doc[cut] == ' ');
    }
    if (end > a) out.write(doc.data() + a, std::streamsize(end - a)) << '\n';
    start = end + 1;
  }
}

// SentencePiece's "Vocabulary size too high (V). Please set it to a value <= N." names neither
// the config key nor the flag; say which setting to change and to what.
std::string training_error(const std::string& status, const std::string& model_prefix,
                           const TokenizerTrainOptions& o, size_t documents) {
  static const std::regex too_high("vocabulary size too high.*<= *([0-9]+)", std::regex::icase);
  std::smatch m;
  if (std::regex_search(status, m, too_high)) {
    return fmt::format("tokenizer {}: vocabulary size {} is too large for this corpus ({} documents): it yields at "
                       "most {} pieces. Fix: set data.vocab_size (`optcc data prepare`; --vocab-size for "
                       "`optcc-data prepare`) to at most {}, or add text to data.sources. (SentencePiece: {})",
                       model_prefix, o.vocab_size, documents, m[1].str(), m[1].str(), status);
  }
  return fmt::format("SentencePiece training for {} failed: {} (vocab_size {}, {} documents)", model_prefix, status,
                     o.vocab_size, documents);
}

}  // namespace

void train_tokenizer(const std::vector<std::string>& documents, const std::string& model_prefix,
                     const TokenizerTrainOptions& o) {
  if (o.model_type != "unigram" && o.model_type != "bpe")
    throw std::invalid_argument(fmt::format("model type '{}': expected unigram or bpe", o.model_type));
  // A fixed (not pid-unique) temp prefix: the model proto records its input and prefix paths, so a
  // fixed name keeps the .model bytes reproducible. Two concurrent trainings of one prefix would clash.
  const std::string tmp_prefix = model_prefix + ".training";
  const std::string text_path = tmp_prefix + ".txt";
  RemoveOnExit text_guard(text_path), model_guard(tmp_prefix + ".model"), vocab_guard(tmp_prefix + ".vocab");
  {
    std::ofstream out(text_path, std::ios::binary);
    if (!out) throw std::runtime_error(fmt::format("cannot create {}", text_path));
    for (const auto& d : documents) write_training_lines(out, d);
    if (!out.flush()) throw std::runtime_error(write_error(text_path));
  }
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned int>(o.seed));
  const std::unordered_map<std::string, std::string> args = {
      {"input", text_path},
      {"model_prefix", tmp_prefix},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"model_type", o.model_type},
      {"pad_id", "-1"}, {"unk_id", std::to_string(kUnkId)}, {"bos_id", "-1"}, {"eos_id", std::to_string(kEodId)},
      {"byte_fallback", o.byte_fallback ? "true" : "false"},
      {"character_coverage", fmt::format("{}", o.character_coverage)},
      {"input_sentence_size", std::to_string(o.input_sentence_size)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(o.num_threads)},
      {"hard_vocab_limit", o.hard_vocab_limit ? "true" : "false"},
      {"minloglevel", "1"},  // SentencePiece's per-iteration INFO lines are noise here
  };
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) throw std::runtime_error(training_error(status.ToString(), model_prefix, o, documents.size()));
  commit_file(tmp_prefix + ".vocab", model_prefix + ".vocab");
  commit_file(tmp_prefix + ".model", model_prefix + ".model");
}

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Tokenizer::Tokenizer(const std::string& model_path) : impl_(std::make_unique<Impl>()), path_(model_path) {
  const auto status = impl_->sp.Load(model_path);
  if (!status.ok())
    throw std::runtime_error(fmt::format("cannot load tokenizer {}: {} (run `optcc data prepare`)", model_path,
                                         status.ToString()));
  if (impl_->sp.unk_id() != kUnkId || impl_->sp.eos_id() != kEodId)
    throw std::runtime_error(fmt::format("tokenizer {}: unk_id {} / eos_id {}, expected {} / {}; retrain it with "
                                         "`optcc-data prepare --retrain`", model_path, impl_->sp.unk_id(),
                                         impl_->sp.eos_id(), kUnkId, kEodId));
}

Tokenizer::~Tokenizer() = default;

int Tokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }

std::vector<int> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error(fmt::format("{}: encode failed: {}", path_, status.ToString()));
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string text;
  const auto status = impl_->sp.Decode(ids, &text);
  if (!status.ok()) throw std::runtime_error(fmt::format("{}: decode failed: {}", path_, status.ToString()));
  return text;
}

std::string Tokenizer::id_to_piece(int id) const { return impl_->sp.IdToPiece(id); }

}  // namespace optcc::data

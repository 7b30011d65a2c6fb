// SentencePiece tokenizer (optcc_tokenizer library). Never link this into a LibTorch binary: Debian's
// libsentencepiece carries its own protobuf and aborts next to LibTorch's (docs/architecture.md §7).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace optcc::data {

// Special ids fixed for every optcc tokenizer: no <pad>, no <s>; </s> marks the end of a document.
constexpr int kUnkId = 0;
constexpr int kEodId = 1;

struct TokenizerTrainOptions {
  int vocab_size = 8000;                // pieces including <unk>, </s> and the 256 byte-fallback pieces
  std::string model_type = "unigram";   // "unigram" | "bpe"
  uint64_t seed = 1234;                 // SentencePiece's random generator (sentence sampling/shuffling)
  int num_threads = 2;                  // trainer threads
  int64_t input_sentence_size = 2000000;  // at most this many training lines, sampled with shuffling
  double character_coverage = 0.9995;  // rarer characters fall back to bytes
  bool byte_fallback = true;            // unknown characters become <0xNN> pieces instead of <unk>
  bool hard_vocab_limit = true;         // false: vocab_size is a soft limit (tiny corpora in tests)
};

// Trains a model on `documents` and writes <model_prefix>.model and <model_prefix>.vocab (atomically:
// trained under a temp prefix, then renamed). Documents are fed as lines: split at "\n", and long lines
// cut at spaces into pieces of <= 2000 bytes (SentencePiece skips lines over max_sentence_length).
// Throws std::runtime_error with SentencePiece's message on failure; a vocabulary too large for the
// text says so with the largest size the text allows and the setting to change (data.vocab_size).
void train_tokenizer(const std::vector<std::string>& documents, const std::string& model_prefix,
                     const TokenizerTrainOptions& options);

// A loaded model. Encode/decode are const and safe to call from several threads.
class Tokenizer {
 public:
  // Throws std::runtime_error naming the path if the model cannot be loaded, or if its special ids
  // differ from kUnkId/kEodId (a model not trained by optcc-data).
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  int vocab_size() const;
  int eod_id() const { return kEodId; }
  std::vector<int> encode(const std::string& text) const;   // no EOD appended
  std::string decode(const std::vector<int>& ids) const;
  std::string id_to_piece(int id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace optcc::data

// `optcc-data prepare`: text/JSONL documents -> SentencePiece model + Megatron indexed dataset.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "datasets/tokenizer.h"

namespace optcc::data {

struct PrepareOptions {
  std::vector<std::string> inputs;   // .jsonl (one {"<json_key>": text} per line) or .txt (blank-line separated)
  std::string output_prefix;         // writes <prefix>.model/.vocab, <prefix>.bin/.idx, <prefix>.json
  std::string json_key = "text";     // JSONL field holding the text
  TokenizerTrainOptions tokenizer;   // used only when (re)training
  bool retrain = false;              // true: train even if <prefix>.model could be reused
  // Write documents in a seeded random order (tokenizer.seed) rather than input order. Splits take
  // contiguous document ranges (data.split), so without this a "949,50,1" split of nlp-corpus then
  // Brown would validate on Brown only. Off: the exact input order, as Megatron's preprocessing.
  bool shuffle_documents = true;
  int num_threads = 2;               // tokenization threads
};

struct PrepareSummary {
  int64_t documents = 0;
  int64_t tokens = 0;                 // including one EOD per document
  int vocab_size = 0;
  std::string dtype;                  // "uint16" | "int32"
  bool trained = false;               // false when an existing model was reused
  double read_seconds = 0, train_seconds = 0, tokenize_seconds = 0;
};

using PrepareLogFn = std::function<void(const std::string&)>;

// Reads and validates every input first (errors name the file and line), trains or reuses the
// tokenizer, tokenizes each document with the end-of-document id (1) appended and writes one sequence
// per document (in a seeded shuffled order unless shuffle_documents is false), dtype uint16 when
// vocab < 65500 else int32. <prefix>.json records {vocab_size, eod_id, tokenizer_model, documents,
// tokens, dtype, sources[] (path, documents, tokens, sha256 of the documents), min_token_id,
// max_token_id, index_sha256 (of the .idx: dataset_vocab() trusts the ids only for this .idx),
// tokenizer_training (vocab_size, model_type, seed, character_coverage, byte_fallback,
// hard_vocab_limit, input_sentence_size, json_key, sources[], model_sha256)}.
// An existing <prefix>.model is reused only when <prefix>.json's tokenizer_training matches these
// options and sources and its model_sha256 matches the file; any difference (named in the log)
// trains anew, as does `retrain`. A .json without that record (older optcc): reused when the
// model's size equals tokenizer.vocab_size (or the limit is soft), else trained anew.
// Throws std::runtime_error / std::invalid_argument with the cause (train_tokenizer: a vocabulary
// the corpus cannot fill names data.vocab_size and the largest size it can).
PrepareSummary prepare_dataset(const PrepareOptions& options, const PrepareLogFn& log = {});

}  // namespace optcc::data

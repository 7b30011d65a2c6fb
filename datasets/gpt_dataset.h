// GPT training samples over an indexed dataset, following Megatron-LM's GPTDataset construction:
//
//   document index  the split's documents repeated for as many epochs as the requested samples need,
//                   each epoch shuffled (the last epoch shuffled on its own when it contributes less
//                   than 80% of an epoch's samples, as Megatron does);
//   sample index    (position in the document index, token offset) where each sample starts; a sample
//                   holds seq_len + 1 tokens, consecutive samples share one token (the last input token
//                   of one is the first of the next), and samples run across document boundaries;
//   shuffle index   a permutation of the samples (the separate last epoch again shuffled on its own).
//
// Randomness: one std::mt19937_64 seeded with `seed`, used first for the document shuffles, then for
// the sample shuffle; shuffles are Fisher-Yates with rejection sampling (not std::shuffle, whose
// algorithm differs between standard libraries), so indices are identical on every platform. They
// differ from Megatron's numpy streams: data orders match Megatron's structure, not its exact order.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "datasets/indexed_dataset.h"

namespace optcc::data {

struct SplitRange { int64_t begin_doc = 0, end_doc = 0; };  // documents [begin, end)

// "949,50,1" (or "98,2,0", "1", "90/10": 1-3 non-negative weights, ',' or '/') -> train/valid/test
// document ranges by Megatron's rule: weights normalised; bounds[k+1] = bounds[k] + round(w_k * n);
// all bounds shifted so the last equals n (then clamped to stay within [0, n] and monotone).
// Throws std::invalid_argument naming `data.split` on malformed input (split_problem's reason).
std::array<SplitRange, 3> split_documents(int64_t num_documents, const std::string& split);

// Why `split` is malformed under split_documents' rule ("empty weight", "'x' is not a decimal
// number", "weight -1 is negative or not finite", "4 weights given", "the weights sum to 0"), or ""
// when it is well-formed. Throws nothing. Config validation uses it before any rank starts.
std::string split_problem(const std::string& split);

struct GptDatasetOptions {
  int64_t seq_len = 0;        // tokens per sample; each sample holds seq_len + 1 tokens
  int64_t num_samples = 0;    // samples wanted; documents are repeated for as many epochs as needed
  uint64_t seed = 1234;       // shuffle seed
  std::string cache_dir;      // where doc/sample/shuffle index files are cached ("" = no cache)
  std::string name;           // "train" | "valid" | "test" (part of the cache file name)
};

class GptDataset {
 public:
  // Builds the three indices, or loads them from cache_dir when a valid cache for the same
  // (index digest, document range, seq_len, num_samples, seed) exists; a fresh build is written there
  // atomically (temp file + rename), so ranks building concurrently are safe.
  // Throws std::invalid_argument for a bad range or options, std::runtime_error when the split holds
  // no tokens while num_samples > 0, or when the cache directory cannot be written.
  GptDataset(std::shared_ptr<const IndexedDataset> data, SplitRange docs, GptDatasetOptions opt);

  int64_t size() const { return opt_.num_samples; }          // == num_samples
  int64_t seq_len() const { return opt_.seq_len; }
  // Writes the seq_len + 1 tokens of sample `index` (in [0, size())) to out. Thread-safe.
  void sample(int64_t index, int64_t* out) const;

  // Diagnostics and tests.
  void sample_unshuffled(int64_t j, int64_t* out) const;    // j-th sample in stream order
  int64_t num_built_samples() const { return int64_t(shuffle_idx_.size()); }  // >= size()
  int64_t num_epochs() const { return num_epochs_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }
  const std::vector<int64_t>& document_order() const { return doc_idx_; }  // absolute document ids
  const std::vector<int64_t>& shuffle_index() const { return shuffle_idx_; }
  std::string cache_prefix() const;  // "<cache_dir>/gpt_<name>_<hash>" ("" without a cache)

 private:
  void build();
  bool load_cache(const std::string& key);
  void save_cache(const std::string& key) const;
  void read_document(int64_t doc, int64_t offset, int64_t length, int64_t* out) const;

  std::shared_ptr<const IndexedDataset> data_;
  SplitRange docs_;
  GptDatasetOptions opt_;
  std::string key_;                  // SHA-256 hex of everything the indices depend on
  int64_t tokens_per_epoch_ = 0, num_epochs_ = 0;
  bool loaded_from_cache_ = false;
  std::vector<int64_t> doc_idx_;     // [num_epochs * docs] absolute document ids in reading order
  std::vector<int64_t> sample_idx_;  // [(built + 1) * 2] (doc_idx position, token offset) pairs
  std::vector<int64_t> shuffle_idx_; // [built] permutation of stream-order samples
};

}  // namespace optcc::data

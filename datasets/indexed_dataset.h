// Megatron-LM compatible memory-mapped indexed dataset (MMapIndexedDataset, index version 1).
//
// <prefix>.bin: the tokens of every sequence, concatenated, little-endian, in `dtype`.
// <prefix>.idx, little-endian:
//   char[9]  magic "MMIDIDX\x00\x00"
//   uint64   version = 1
//   uint8    dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
//   uint64   N = number of sequences
//   uint64   D = length of the document index (documents + 1)
//   int32    sizes[N]      tokens per sequence
//   int64    pointers[N]   byte offset of each sequence in .bin (exclusive prefix sum of sizes*itemsize)
//   int64    doc_idx[D]    document d = sequences [doc_idx[d], doc_idx[d+1]); doc_idx[0]=0, doc_idx[D-1]=N
// Files written by Megatron's preprocess_data.py load here and vice versa.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace optcc::data {

enum class DType : uint8_t {
  kUInt8 = 1, kInt8 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5, kFloat64 = 6, kFloat32 = 7, kUInt16 = 8,
};

size_t dtype_size(DType dtype);             // bytes per token
const char* dtype_name(DType dtype);        // "uint16", ...
DType dtype_from_name(const std::string&);  // inverse of dtype_name; throws std::invalid_argument
bool dtype_is_integer(DType dtype);
// Megatron's choice for token ids: uint16 when vocab_size < 65500, else int32.
DType token_dtype_for_vocab(int64_t vocab_size);

// Writes <prefix>.bin/.idx. Both go to temp files first; finalize() renames them into place, so a
// crash never leaves a half-written dataset under the final names. Not thread-safe.
class IndexedDatasetBuilder {
 public:
  // Throws std::invalid_argument for a float dtype, std::runtime_error if the temp .bin cannot be created.
  IndexedDatasetBuilder(std::string prefix, DType dtype);
  ~IndexedDatasetBuilder();  // removes the temp files unless finalize() succeeded
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // Appends one sequence. Throws std::out_of_range naming the value, its position and the dtype when
  // a token does not fit the dtype (nothing is written in that case).
  void add_sequence(const int64_t* tokens, size_t count);
  void add_sequence(const std::vector<int64_t>& tokens) { add_sequence(tokens.data(), tokens.size()); }
  // Closes the current document: the sequences added since the previous end_document() form it.
  void end_document();
  // Writes the .idx and moves both files into place. Pending sequences (added after the last
  // end_document()) are closed into a final document. Throws std::runtime_error on I/O errors.
  void finalize();

  int64_t num_sequences() const { return int64_t(sizes_.size()); }
  int64_t num_documents() const { return int64_t(doc_idx_.size()) - 1; }

  // Concatenates datasets (same dtype, else std::runtime_error naming both) into output_prefix,
  // appending each input's document index shifted by the sequences before it (BR-17).
  static void merge(const std::vector<std::string>& input_prefixes, const std::string& output_prefix);

 private:
  std::string prefix_, bin_tmp_;
  DType dtype_;
  std::ofstream bin_;
  std::vector<int32_t> sizes_;     // [N] tokens per sequence
  std::vector<int64_t> doc_idx_;   // [D] starts with 0
  std::vector<char> buf_;          // conversion buffer for one sequence
  bool finalized_ = false;
};

// Read-only view of <prefix>.bin/.idx through mmap. The constructor validates the whole index (see
// the .cpp for the list of checks) and throws std::runtime_error with the file, the check, the found
// and expected values and a hint. Thread-safe for concurrent reads.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  struct SequenceRange { int64_t begin = 0, end = 0; };  // sequences [begin, end)

  const std::string& prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_idx_ - 1; }
  int64_t total_tokens() const { return total_tokens_; }
  int64_t bin_bytes() const { return int64_t(bin_size_); }

  int64_t sequence_length(int64_t i) const;            // tokens; throws std::out_of_range
  SequenceRange document_range(int64_t d) const;       // throws std::out_of_range
  int64_t document_tokens(int64_t d) const;            // sum of the document's sequence lengths
  // Copies tokens [offset, offset+length) of sequence i, widened to int64, into out[0..length).
  // Throws std::out_of_range when the range is outside the sequence.
  void read(int64_t i, int64_t offset, int64_t length, int64_t* out) const;
  std::vector<int64_t> read(int64_t i) const;          // the whole sequence

  // SHA-256 (hex) of the .idx bytes: identifies the layout (sizes, documents, dtype) for caches.
  std::string index_digest() const;

  // Smallest and largest token id in the .bin: one sequential pass over the mapped file (about a
  // second per GB). {0, -1} for a dataset without tokens.
  struct TokenRange { int64_t min = 0, max = -1; };
  TokenRange token_range() const;

 private:
  void validate_index(size_t idx_size);
  void validate_data();
  friend class IndexedDatasetBuilder;  // merge() copies the mapped .bin

  std::string prefix_, idx_path_, bin_path_;
  const char* idx_map_ = nullptr;
  size_t idx_size_ = 0;
  const char* bin_map_ = nullptr;
  size_t bin_size_ = 0;
  DType dtype_ = DType::kUInt16;
  size_t itemsize_ = 2;
  int64_t num_sequences_ = 0, num_doc_idx_ = 0, total_tokens_ = 0;
  // The arrays sit at unaligned offsets of the mapped .idx (the header is 34 bytes), so they are
  // read through memcpy accessors rather than typed pointers.
  const char* sizes_ = nullptr;     // int32[N]
  const char* pointers_ = nullptr;  // int64[N]
  const char* doc_idx_ = nullptr;   // int64[D]
  int32_t size_at(int64_t i) const;
  int64_t pointer_at(int64_t i) const;
  int64_t doc_idx_at(int64_t d) const;
};

// The token ids of a dataset and the vocabulary it was prepared for: what the training binary
// checks against model.vocab_size before the first step (harness: check_dataset_vocab).
// <prefix>.json, as `prepare` writes it, records min_token_id, max_token_id and index_sha256; when
// its index_sha256 equals ds.index_digest() (the .json describes this .bin/.idx) those are used,
// else the .bin is scanned (token_range(); e.g. Megatron-made datasets, or older .json files).
struct DatasetVocab {
  int64_t min_token_id = 0, max_token_id = -1;  // max -1: no tokens
  int64_t vocab_size = 0;      // <prefix>.json "vocab_size"; 0 without a readable .json
  bool from_metadata = false;  // ids read from <prefix>.json rather than scanned
};
DatasetVocab dataset_vocab(const IndexedDataset& ds);

}  // namespace optcc::data

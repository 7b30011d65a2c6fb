// Test fixtures: a small learnable corpus written as a real indexed dataset, and temp dirs.
#pragma once

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "datasets/indexed_dataset.h"

namespace optcc::testing {

/// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("optcc-test-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// Writes <prefix>.bin/.idx/.json: `docs` documents of 20-120 tokens from a noisy deterministic
/// chain (next = (3*prev + 1) % vocab with 10% random tokens), ending with EOD id 1. A model can
/// learn it quickly, so "loss falls" tests are short.
inline void write_synthetic_corpus(const std::string& prefix, int64_t vocab, int64_t docs,
                                   uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  data::IndexedDatasetBuilder builder(prefix, data::DType::kUInt16);
  int64_t tokens = 0;
  for (int64_t d = 0; d < docs; ++d) {
    const int64_t len = 20 + static_cast<int64_t>(rng() % 100);
    std::vector<int64_t> doc;
    int64_t t = 2 + static_cast<int64_t>(rng() % (vocab - 2));
    for (int64_t i = 0; i < len; ++i) {
      doc.push_back(t);
      t = (rng() % 10 == 0) ? 2 + static_cast<int64_t>(rng() % (vocab - 2)) : 2 + (3 * t + 1) % (vocab - 2);
    }
    doc.push_back(1);
    tokens += static_cast<int64_t>(doc.size());
    builder.add_sequence(doc);
    builder.end_document();
  }
  builder.finalize();
  std::ofstream(prefix + ".json") << "{\"vocab_size\": " << vocab << ", \"eod_id\": 1, \"documents\": "
                                  << docs << ", \"tokens\": " << tokens << ", \"dtype\": \"uint16\"}\n";
}

}  // namespace optcc::testing

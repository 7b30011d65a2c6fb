#include "datasets/gpt_dataset.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

#include "datasets/io_util.h"

namespace optcc::data {
namespace {

constexpr char kCacheMagic[8] = {'O', 'P', 'T', 'C', 'C', 'I', 'X', '1'};
constexpr int64_t kMaxDocIndexEntries = int64_t(1) << 28;  // 2 GiB of int64: beyond that, something is off

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

[[noreturn]] void bad_split(const std::string& split, const std::string& why) {
  throw std::invalid_argument(fmt::format(
      "data.split: '{}' is malformed: {}; expected 1-3 non-negative weights separated by ',' or '/', "
      "e.g. \"949,50,1\" (train, valid, test)", split, why));
}

// The 1-3 weights of `split` (split_documents' rule), or empty with `why` set when malformed.
std::vector<double> split_weights(const std::string& split, std::string& why) {
  std::vector<double> weights;
  size_t start = 0;
  while (true) {
    const size_t end = split.find_first_of(",/", start);
    const std::string piece = trim(split.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (piece.empty()) {
      why = "empty weight";
      return {};
    }
    char* stop = nullptr;
    const double w = std::strtod(piece.c_str(), &stop);  // decimal only: strtod alone takes 0x1p3, nan, inf
    if (*stop != '\0' || piece.find_first_not_of("0123456789.eE+-") != std::string::npos) {
      why = fmt::format("'{}' is not a decimal number", piece);
      return {};
    }
    if (!std::isfinite(w) || w < 0) {
      why = fmt::format("weight {} is negative or not finite", piece);
      return {};
    }
    weights.push_back(w);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (weights.size() > 3) {
    why = fmt::format("{} weights given", weights.size());
    return {};
  }
  if (weights[0] + (weights.size() > 1 ? weights[1] : 0.0) + (weights.size() > 2 ? weights[2] : 0.0) <= 0) {
    why = "the weights sum to 0";
    return {};
  }
  return weights;
}

// Uniform integer in [0, bound) by rejection sampling: exact, and the same on every platform.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  while (true) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

// Fisher-Yates over v[begin, end).
void shuffle_range(std::vector<int64_t>& v, size_t begin, size_t end, std::mt19937_64& rng) {
  for (size_t i = end - begin; i > 1; --i) std::swap(v[begin + i - 1], v[begin + uniform_below(rng, i)]);
}

std::string encode_cache(const std::string& key, const std::vector<int64_t>& v) {
  std::string bytes(kCacheMagic, sizeof kCacheMagic);
  bytes += key;
  const uint64_t n = v.size();
  bytes.append(reinterpret_cast<const char*>(&n), 8);
  bytes.append(reinterpret_cast<const char*>(v.data()), v.size() * 8);
  return bytes;
}

// False when the file is missing, from another key or malformed.
bool decode_cache(const std::string& path, const std::string& key, std::vector<int64_t>& v) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return false;
  const std::string bytes = read_file(path);
  const size_t head = sizeof kCacheMagic + key.size() + 8;
  if (bytes.size() < head || std::memcmp(bytes.data(), kCacheMagic, sizeof kCacheMagic) != 0 ||
      bytes.compare(sizeof kCacheMagic, key.size(), key) != 0)
    return false;
  uint64_t n = 0;
  std::memcpy(&n, bytes.data() + head - 8, 8);
  if (bytes.size() != head + n * 8) return false;
  v.resize(n);
  std::memcpy(v.data(), bytes.data() + head, n * 8);
  return true;
}

}  // namespace

std::string split_problem(const std::string& split) {
  std::string why;
  split_weights(split, why);
  return why;
}

std::array<SplitRange, 3> split_documents(int64_t num_documents, const std::string& split) {
  if (num_documents < 0) throw std::invalid_argument(fmt::format("split_documents: {} documents", num_documents));
  std::string why;
  std::vector<double> w = split_weights(split, why);
  if (w.empty()) bad_split(split, why);
  w.resize(3, 0.0);
  const double sum = w[0] + w[1] + w[2];
  std::array<int64_t, 4> bound{0, 0, 0, 0};
  for (int k = 0; k < 3; ++k)  // nearbyint rounds half to even, like Python's round()
    bound[k + 1] = bound[k] + int64_t(std::nearbyint(w[k] / sum * double(num_documents)));
  const int64_t diff = bound[3] - num_documents;
  for (int k = 1; k < 4; ++k) bound[k] = std::min(num_documents, std::max(bound[k - 1], bound[k] - diff));
  return {SplitRange{bound[0], bound[1]}, SplitRange{bound[1], bound[2]}, SplitRange{bound[2], bound[3]}};
}

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, SplitRange docs, GptDatasetOptions opt)
    : data_(std::move(data)), docs_(docs), opt_(std::move(opt)) {
  if (!data_) throw std::invalid_argument("GptDataset: null dataset");
  if (docs_.begin_doc < 0 || docs_.end_doc < docs_.begin_doc || docs_.end_doc > data_->num_documents())
    throw std::invalid_argument(fmt::format("GptDataset {}: document range [{}, {}) outside [0, {}) of {}",
                                            opt_.name, docs_.begin_doc, docs_.end_doc, data_->num_documents(),
                                            data_->prefix()));
  if (opt_.seq_len <= 0 || opt_.num_samples < 0)
    throw std::invalid_argument(fmt::format("GptDataset {}: seq_len {} must be > 0 and num_samples {} >= 0",
                                            opt_.name, opt_.seq_len, opt_.num_samples));
  for (int64_t d = docs_.begin_doc; d < docs_.end_doc; ++d) tokens_per_epoch_ += data_->document_tokens(d);
  if (opt_.num_samples == 0) return;
  if (tokens_per_epoch_ == 0)
    throw std::runtime_error(fmt::format(
        "GptDataset {}: documents [{}, {}) of {} hold no tokens but {} samples were requested; "
        "give this split a larger share in data.split or request 0 samples", opt_.name, docs_.begin_doc,
        docs_.end_doc, data_->prefix(), opt_.num_samples));
  // Megatron: the fewest epochs whose tokens give num_samples samples, (epochs*T - 1) / S >= N.
  num_epochs_ = (opt_.num_samples * opt_.seq_len + 1 + tokens_per_epoch_ - 1) / tokens_per_epoch_;
  const int64_t num_docs = docs_.end_doc - docs_.begin_doc;
  if (num_epochs_ > kMaxDocIndexEntries / num_docs)
    throw std::runtime_error(fmt::format(
        "GptDataset {}: {} samples of {} tokens need {} epochs over {} tokens ({} documents); request fewer "
        "samples or use a larger corpus", opt_.name, opt_.num_samples, opt_.seq_len, num_epochs_,
        tokens_per_epoch_, num_docs));

  const std::string desc = fmt::format("optcc-gpt-index v1|{}|docs {} {}|seq_len {}|samples {}|seed {}",
                                       data_->index_digest(), docs_.begin_doc, docs_.end_doc, opt_.seq_len,
                                       opt_.num_samples, opt_.seed);
  key_ = sha256_hex(desc.data(), desc.size());
  if (!opt_.cache_dir.empty() && load_cache(key_)) {
    loaded_from_cache_ = true;
    return;
  }
  build();
  if (!opt_.cache_dir.empty()) save_cache(key_);
}

void GptDataset::build() {
  const int64_t S = opt_.seq_len, T = tokens_per_epoch_, E = num_epochs_;
  const int64_t num_docs = docs_.end_doc - docs_.begin_doc;
  // Megatron shuffles a last epoch that contributes < 80% of an epoch's samples on its own, so the
  // partial epoch's documents are not mixed into (and do not dilute) the full epochs.
  bool separate_last_epoch = false;
  int64_t samples_before_last = 0;
  if (E > 1) {
    samples_before_last = ((E - 1) * T - 1) / S;
    const int64_t last_epoch_samples = opt_.num_samples - samples_before_last;
    const int64_t samples_per_epoch = (T - 1) / S;
    separate_last_epoch = last_epoch_samples < int64_t(0.80 * double(samples_per_epoch));
  }
  std::mt19937_64 rng(opt_.seed);

  doc_idx_.resize(size_t(E * num_docs));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t d = 0; d < num_docs; ++d) doc_idx_[size_t(e * num_docs + d)] = docs_.begin_doc + d;
  const size_t full = separate_last_epoch ? size_t((E - 1) * num_docs) : doc_idx_.size();
  shuffle_range(doc_idx_, 0, full, rng);
  shuffle_range(doc_idx_, full, doc_idx_.size(), rng);

  // Sample index: walk the document stream, each sample consuming S + 1 tokens and the next one
  // starting on the last token of the previous (so targets and the next inputs share a token).
  const int64_t built = (E * T - 1) / S;
  sample_idx_.assign(size_t(2 * (built + 1)), 0);
  int64_t pos = 0, offset = 0;
  for (int64_t s = 1; s <= built; ++s) {
    int64_t remaining = S + 1;
    while (remaining != 0) {
      if (pos >= int64_t(doc_idx_.size())) throw std::logic_error("GptDataset: sample index ran past the documents");
      const int64_t doc_left = data_->document_tokens(doc_idx_[size_t(pos)]) - offset;
      remaining -= doc_left;
      if (remaining <= 0) {
        offset += remaining + doc_left - 1;
        remaining = 0;
      } else {
        ++pos, offset = 0;
      }
    }
    sample_idx_[size_t(2 * s)] = pos, sample_idx_[size_t(2 * s + 1)] = offset;
  }

  shuffle_idx_.resize(size_t(built));
  for (int64_t i = 0; i < built; ++i) shuffle_idx_[size_t(i)] = i;
  const size_t first = separate_last_epoch ? size_t(samples_before_last) : shuffle_idx_.size();
  shuffle_range(shuffle_idx_, 0, first, rng);
  shuffle_range(shuffle_idx_, first, shuffle_idx_.size(), rng);
}

std::string GptDataset::cache_prefix() const {
  if (opt_.cache_dir.empty() || key_.empty()) return "";
  std::string name = opt_.name.empty() ? "split" : opt_.name;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return fmt::format("{}/gpt_{}_{}", opt_.cache_dir, name, key_.substr(0, 16));
}

bool GptDataset::load_cache(const std::string& key) {
  const std::string p = cache_prefix();
  std::vector<int64_t> doc, sample, shuffle;
  if (!decode_cache(p + "_doc_idx.bin", key, doc) || !decode_cache(p + "_sample_idx.bin", key, sample) ||
      !decode_cache(p + "_shuffle_idx.bin", key, shuffle))
    return false;
  // Cheap structural checks; anything off means a stale or damaged cache, which is rebuilt.
  const int64_t built = (num_epochs_ * tokens_per_epoch_ - 1) / opt_.seq_len;
  if (int64_t(doc.size()) != num_epochs_ * (docs_.end_doc - docs_.begin_doc) ||
      int64_t(sample.size()) != 2 * (built + 1) || int64_t(shuffle.size()) != built)
    return false;
  for (int64_t d : doc)
    if (d < docs_.begin_doc || d >= docs_.end_doc) return false;
  for (size_t i = 0; i < sample.size(); i += 2)
    if (sample[i] < 0 || sample[i] >= int64_t(doc.size())) return false;
  std::vector<bool> seen(shuffle.size(), false);
  for (int64_t s : shuffle) {
    if (s < 0 || s >= built || seen[size_t(s)]) return false;
    seen[size_t(s)] = true;
  }
  doc_idx_ = std::move(doc), sample_idx_ = std::move(sample), shuffle_idx_ = std::move(shuffle);
  return true;
}

void GptDataset::save_cache(const std::string& key) const {
  std::error_code ec;
  std::filesystem::create_directories(opt_.cache_dir, ec);
  if (ec)
    throw std::runtime_error(fmt::format("GptDataset {}: cannot create cache directory {}: {}", opt_.name,
                                         opt_.cache_dir, ec.message()));
  const std::string p = cache_prefix();
  write_file_atomic(p + "_doc_idx.bin", encode_cache(key, doc_idx_));
  write_file_atomic(p + "_sample_idx.bin", encode_cache(key, sample_idx_));
  write_file_atomic(p + "_shuffle_idx.bin", encode_cache(key, shuffle_idx_));
}

void GptDataset::read_document(int64_t doc, int64_t offset, int64_t length, int64_t* out) const {
  const IndexedDataset::SequenceRange r = data_->document_range(doc);
  for (int64_t i = r.begin; i < r.end && length > 0; ++i) {
    const int64_t n = data_->sequence_length(i);
    if (offset >= n) {
      offset -= n;
      continue;
    }
    const int64_t take = std::min(length, n - offset);
    data_->read(i, offset, take, out);
    out += take, length -= take, offset = 0;
  }
  if (length > 0) throw std::logic_error("GptDataset: read past the end of a document");
}

void GptDataset::sample_unshuffled(int64_t j, int64_t* out) const {
  if (j < 0 || j >= num_built_samples())
    throw std::out_of_range(fmt::format("GptDataset {}: sample {} out of range [0, {})", opt_.name, j,
                                        num_built_samples()));
  const int64_t p0 = sample_idx_[size_t(2 * j)], o0 = sample_idx_[size_t(2 * j + 1)];
  const int64_t p1 = sample_idx_[size_t(2 * j + 2)], o1 = sample_idx_[size_t(2 * j + 3)];
  // Guard the caller's buffer against a damaged (cached) index: the span must be exactly S + 1.
  int64_t span = o1 + 1 - o0;
  for (int64_t p = p0; p < p1; ++p) span += data_->document_tokens(doc_idx_[size_t(p)]);
  if (span != opt_.seq_len + 1)
    throw std::runtime_error(fmt::format("GptDataset {}: sample {} spans {} tokens, expected {}; delete the "
                                         "index cache {}* and retry", opt_.name, j, span, opt_.seq_len + 1,
                                         cache_prefix()));
  if (p0 == p1) return read_document(doc_idx_[size_t(p0)], o0, o1 - o0 + 1, out);
  int64_t n = data_->document_tokens(doc_idx_[size_t(p0)]) - o0;
  read_document(doc_idx_[size_t(p0)], o0, n, out);
  out += n;
  for (int64_t p = p0 + 1; p < p1; ++p) {
    n = data_->document_tokens(doc_idx_[size_t(p)]);
    read_document(doc_idx_[size_t(p)], 0, n, out);
    out += n;
  }
  read_document(doc_idx_[size_t(p1)], 0, o1 + 1, out);
}

void GptDataset::sample(int64_t index, int64_t* out) const {
  if (index < 0 || index >= size())
    throw std::out_of_range(fmt::format("GptDataset {}: sample {} out of range [0, {})", opt_.name, index, size()));
  sample_unshuffled(shuffle_idx_[size_t(index)], out);
}

}  // namespace optcc::data

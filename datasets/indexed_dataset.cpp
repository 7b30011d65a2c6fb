#include "datasets/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "datasets/io_util.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the .bin/.idx format is little-endian");

namespace optcc::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, N, D
constexpr const char* kRebuildHint =
    "The file is damaged or was not written as a Megatron mmap dataset; re-run `optcc data prepare` "
    "(or `optcc-data prepare`) to rebuild it.";

[[noreturn]] void fail(const std::string& path, const std::string& check, const std::string& found,
                       const std::string& expected, const char* hint = kRebuildHint) {
  throw std::runtime_error(fmt::format("indexed dataset {}: {} check failed: found {}, expected {}. {}",
                                       path, check, found, expected, hint));
}

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool dtype_code_valid(uint8_t code) { return code >= 1 && code <= 8; }

// Range of token ids a dtype can hold (integer dtypes only).
void dtype_range(DType dtype, int64_t& lo, int64_t& hi) {
  switch (dtype) {
    case DType::kUInt8: lo = 0, hi = 255; return;
    case DType::kInt8: lo = -128, hi = 127; return;
    case DType::kInt16: lo = -32768, hi = 32767; return;
    case DType::kUInt16: lo = 0, hi = 65535; return;
    case DType::kInt32: lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max(); return;
    default: lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max(); return;
  }
}

template <typename T>
void narrow(const int64_t* in, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) {
    T v = T(in[i]);
    std::memcpy(out + i * sizeof(T), &v, sizeof(T));
  }
}

template <typename T>
void widen(const char* in, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = int64_t(load<T>(in + i * sizeof(T)));
}

// Writes the .idx for `sizes`/`doc_idx` to `path` (pointers derived from sizes).
void write_index(const std::string& path, DType dtype, const std::vector<int32_t>& sizes,
                 const std::vector<int64_t>& doc_idx) {
  std::string bytes(kMagic, sizeof kMagic);
  auto put = [&bytes](const void* p, size_t n) { bytes.append(static_cast<const char*>(p), n); };
  const uint64_t n = sizes.size(), d = doc_idx.size();
  const uint8_t code = uint8_t(dtype);
  put(&kVersion, 8), put(&code, 1), put(&n, 8), put(&d, 8);
  put(sizes.data(), n * sizeof(int32_t));
  std::vector<int64_t> pointers(n);
  int64_t offset = 0;
  for (size_t i = 0; i < n; ++i) pointers[i] = offset, offset += int64_t(sizes[i]) * int64_t(dtype_size(dtype));
  put(pointers.data(), n * sizeof(int64_t));
  put(doc_idx.data(), d * sizeof(int64_t));
  write_file_atomic(path, bytes);
}

struct Mapping {
  const char* data = nullptr;
  size_t size = 0;
};

Mapping map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error(fmt::format("indexed dataset {}: cannot open: {}. Run `optcc data prepare` "
                                         "to create it, or check data.prefix.", path, std::strerror(errno)));
  struct stat st {};
  ::fstat(fd, &st);
  Mapping m;
  m.size = size_t(st.st_size);
  if (m.size > 0) {
    void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw std::runtime_error(fmt::format("indexed dataset {}: mmap failed: {}", path, std::strerror(errno)));
    }
    m.data = static_cast<const char*>(p);
  }
  ::close(fd);
  return m;
}

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kUInt8: case DType::kInt8: return 1;
    case DType::kInt16: case DType::kUInt16: return 2;
    case DType::kInt32: case DType::kFloat32: return 4;
    case DType::kInt64: case DType::kFloat64: return 8;
  }
  throw std::invalid_argument(fmt::format("unknown dtype code {}", int(dtype)));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat64: return "float64";
    case DType::kFloat32: return "float32";
    case DType::kUInt16: return "uint16";
  }
  return "unknown";
}

DType dtype_from_name(const std::string& name) {
  for (int code = 1; code <= 8; ++code)
    if (name == dtype_name(DType(code))) return DType(code);
  throw std::invalid_argument(fmt::format("unknown dtype '{}' (uint8, int8, int16, uint16, int32, int64)", name));
}

bool dtype_is_integer(DType dtype) { return dtype != DType::kFloat32 && dtype != DType::kFloat64; }

DType token_dtype_for_vocab(int64_t vocab_size) { return vocab_size < 65500 ? DType::kUInt16 : DType::kInt32; }

// ---- builder -----------------------------------------------------------------------------------

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string prefix, DType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype), doc_idx_{0} {
  if (!dtype_is_integer(dtype))
    throw std::invalid_argument(fmt::format("{}: dtype {} cannot hold token ids; use uint16 or int32",
                                            prefix_, dtype_name(dtype)));
  bin_tmp_ = temp_path_for(prefix_ + ".bin");
  bin_.open(bin_tmp_, std::ios::binary | std::ios::trunc);
  if (!bin_) throw std::runtime_error(fmt::format("cannot create {}: {}", bin_tmp_, std::strerror(errno)));
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!finalized_) {
    bin_.close();
    std::remove(bin_tmp_.c_str());
  }
}

void IndexedDatasetBuilder::add_sequence(const int64_t* tokens, size_t count) {
  if (finalized_) throw std::logic_error(prefix_ + ": add_sequence after finalize");
  if (count > size_t(std::numeric_limits<int32_t>::max()))
    throw std::out_of_range(fmt::format("{}: sequence of {} tokens exceeds the int32 size field", prefix_, count));
  int64_t lo, hi;
  dtype_range(dtype_, lo, hi);
  for (size_t i = 0; i < count; ++i) {
    if (tokens[i] < lo || tokens[i] > hi)
      throw std::out_of_range(fmt::format(
          "{}: token {} at position {} of sequence {} does not fit dtype {} (range {}..{}); "
          "use int32 for vocabularies of 65500 or more", prefix_, tokens[i], i, sizes_.size(),
          dtype_name(dtype_), lo, hi));
  }
  buf_.resize(count * dtype_size(dtype_));
  switch (dtype_) {
    case DType::kUInt8: narrow<uint8_t>(tokens, count, buf_.data()); break;
    case DType::kInt8: narrow<int8_t>(tokens, count, buf_.data()); break;
    case DType::kInt16: narrow<int16_t>(tokens, count, buf_.data()); break;
    case DType::kUInt16: narrow<uint16_t>(tokens, count, buf_.data()); break;
    case DType::kInt32: narrow<int32_t>(tokens, count, buf_.data()); break;
    default: narrow<int64_t>(tokens, count, buf_.data()); break;
  }
  bin_.write(buf_.data(), std::streamsize(buf_.size()));
  if (!bin_) throw std::runtime_error(write_error(bin_tmp_));
  sizes_.push_back(int32_t(count));
}

void IndexedDatasetBuilder::end_document() { doc_idx_.push_back(int64_t(sizes_.size())); }

void IndexedDatasetBuilder::finalize() {
  if (finalized_) return;
  if (doc_idx_.back() != int64_t(sizes_.size())) end_document();
  bin_.flush();
  if (!bin_) throw std::runtime_error(write_error(bin_tmp_));
  bin_.close();
  // .bin first: a reader that sees the new .idx also sees the new .bin.
  commit_file(bin_tmp_, prefix_ + ".bin");
  finalized_ = true;
  write_index(prefix_ + ".idx", dtype_, sizes_, doc_idx_);
}

void IndexedDatasetBuilder::merge(const std::vector<std::string>& inputs, const std::string& output) {
  if (inputs.empty()) throw std::invalid_argument("merge: no input datasets");
  std::vector<std::unique_ptr<IndexedDataset>> datasets;
  for (const auto& p : inputs) datasets.push_back(std::make_unique<IndexedDataset>(p));
  const DType dtype = datasets[0]->dtype();
  for (const auto& ds : datasets)
    if (ds->dtype() != dtype)
      throw std::runtime_error(fmt::format("merge: {} has dtype {} but {} has dtype {}; all inputs must share "
                                           "one dtype (re-run prepare with the same tokenizer)", ds->prefix(),
                                           dtype_name(ds->dtype()), inputs[0], dtype_name(dtype)));

  const std::string bin_path = output + ".bin", bin_tmp = temp_path_for(bin_path);
  RemoveOnExit guard(bin_tmp);
  std::vector<int32_t> sizes;
  std::vector<int64_t> doc_idx{0};
  {
    std::ofstream bin(bin_tmp, std::ios::binary | std::ios::trunc);
    if (!bin) throw std::runtime_error(fmt::format("cannot create {}: {}", bin_tmp, std::strerror(errno)));
    for (const auto& ds : datasets) {
      const int64_t base = int64_t(sizes.size());  // sequences before this input
      for (int64_t i = 0; i < ds->num_sequences(); ++i) sizes.push_back(int32_t(ds->sequence_length(i)));
      for (int64_t d = 0; d < ds->num_documents(); ++d) doc_idx.push_back(base + ds->document_range(d).end);
      bin.write(ds->bin_map_, std::streamsize(ds->bin_size_));
    }
    bin.flush();
    if (!bin) throw std::runtime_error(write_error(bin_tmp));
  }
  commit_file(bin_tmp, bin_path);
  guard.release();
  write_index(output + ".idx", dtype, sizes, doc_idx);
}

// ---- reader ------------------------------------------------------------------------------------

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix), idx_path_(prefix + ".idx"), bin_path_(prefix + ".bin") {
  Mapping idx = map_file(idx_path_);
  idx_map_ = idx.data, idx_size_ = idx.size;
  try {
    Mapping bin = map_file(bin_path_);
    bin_map_ = bin.data, bin_size_ = bin.size;
    validate_index(idx_size_);
    validate_data();
  } catch (...) {
    if (idx_map_) ::munmap(const_cast<char*>(idx_map_), idx_size_);
    if (bin_map_) ::munmap(const_cast<char*>(bin_map_), bin_size_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  if (idx_map_) ::munmap(const_cast<char*>(idx_map_), idx_size_);
  if (bin_map_) ::munmap(const_cast<char*>(bin_map_), bin_size_);
}

int32_t IndexedDataset::size_at(int64_t i) const { return load<int32_t>(sizes_ + i * 4); }
int64_t IndexedDataset::pointer_at(int64_t i) const { return load<int64_t>(pointers_ + i * 8); }
int64_t IndexedDataset::doc_idx_at(int64_t d) const { return load<int64_t>(doc_idx_ + d * 8); }

// Header and array lengths, then the document index.
void IndexedDataset::validate_index(size_t idx_size) {
  const std::string& f = idx_path_;
  if (idx_size < kHeaderBytes) fail(f, "header size", fmt::format("{} bytes", idx_size), fmt::format(">= {} bytes", kHeaderBytes));
  if (std::memcmp(idx_map_, kMagic, sizeof kMagic) != 0) {
    std::string found;
    for (size_t i = 0; i < sizeof kMagic; ++i)
      found += std::isprint(static_cast<unsigned char>(idx_map_[i])) ? std::string(1, idx_map_[i])
                                                                     : fmt::format("\\x{:02x}", uint8_t(idx_map_[i]));
    fail(f, "magic header", "\"" + found + "\"", "\"MMIDIDX\\x00\\x00\"",
         "Not a Megatron mmap index (the legacy lazy/cached formats start with \"TNTIDX\"); re-run "
         "`optcc data prepare` to rebuild it.");
  }
  const uint64_t version = load<uint64_t>(idx_map_ + 9);
  if (version != kVersion) fail(f, "index version", std::to_string(version), std::to_string(kVersion));
  const uint8_t code = load<uint8_t>(idx_map_ + 17);
  if (!dtype_code_valid(code)) fail(f, "dtype code", std::to_string(code), "1..8 (Megatron DType)");
  dtype_ = DType(code);
  if (!dtype_is_integer(dtype_))
    fail(f, "dtype code", fmt::format("{} ({})", code, dtype_name(dtype_)), "an integer dtype for token ids");
  itemsize_ = dtype_size(dtype_);
  const uint64_t n = load<uint64_t>(idx_map_ + 18), d = load<uint64_t>(idx_map_ + 26);
  // Bound n and d before multiplying so a corrupted count cannot overflow the expected length.
  const uint64_t room = idx_size - kHeaderBytes;
  if (n > room / 12 || d > room / 8 || n * 12 + d * 8 != room) {
    const bool huge = n > room / 12 || d > room / 8;
    fail(f, "index length", fmt::format("{} bytes", idx_size),
         fmt::format("{}{} bytes for the {} sequences and {} document-index entries the header declares",
                     huge ? "more than " : "", huge ? idx_size : kHeaderBytes + n * 12 + d * 8, n, d));
  }
  num_sequences_ = int64_t(n), num_doc_idx_ = int64_t(d);
  sizes_ = idx_map_ + kHeaderBytes;
  pointers_ = sizes_ + 4 * n;
  doc_idx_ = pointers_ + 8 * n;

  if (d < 1) fail(f, "document index length", "0 entries", ">= 1 entry (documents + 1)");
  if (doc_idx_at(0) != 0) fail(f, "document index start", std::to_string(doc_idx_at(0)), "0");
  for (int64_t k = 1; k < num_doc_idx_; ++k)
    if (doc_idx_at(k) < doc_idx_at(k - 1))
      fail(f, "document index order", fmt::format("doc_idx[{}]={} < doc_idx[{}]={}", k, doc_idx_at(k), k - 1, doc_idx_at(k - 1)),
           "non-decreasing entries");
  if (doc_idx_at(num_doc_idx_ - 1) != num_sequences_)
    fail(f, "document index end (last entry = number of sequences)", std::to_string(doc_idx_at(num_doc_idx_ - 1)),
         std::to_string(num_sequences_),
         "A merge that concatenated sizes without the document index leaves this (BR-17); re-run "
         "`optcc-data merge` or `optcc data prepare`.");
}

// Sizes against the .bin length (catches truncation and a wrong dtype code), then every pointer.
void IndexedDataset::validate_data() {
  const std::string& f = idx_path_;
  int64_t tokens = 0;
  for (int64_t i = 0; i < num_sequences_; ++i) {
    if (size_at(i) < 0) fail(f, "sequence size", fmt::format("sizes[{}]={}", i, size_at(i)), ">= 0");
    tokens += size_at(i);
  }
  total_tokens_ = tokens;
  const uint64_t need = uint64_t(tokens) * itemsize_;
  if (need != bin_size_)
    fail(bin_path_, ".bin length", fmt::format("{} bytes", bin_size_),
         fmt::format("{} bytes ({} tokens x {} bytes for dtype {} per {})", need, tokens, itemsize_,
                     dtype_name(dtype_), idx_path_),
         need > bin_size_ ? "The .bin is truncated, or the .idx dtype code does not match the payload; "
                            "re-run `optcc data prepare` to rebuild both files."
                          : "The .bin has bytes the index does not describe; re-run `optcc data prepare`.");
  int64_t expected = 0;
  for (int64_t i = 0; i < num_sequences_; ++i) {
    const int64_t p = pointer_at(i), end = p + int64_t(size_at(i)) * int64_t(itemsize_);
    if (p != expected) fail(f, "pointer", fmt::format("pointers[{}]={}", i, p), fmt::format("{} (prefix sum of sizes x itemsize)", expected));
    if (p < 0 || uint64_t(end) > bin_size_)
      fail(f, "sequence bounds", fmt::format("sequence {} ends at byte {}", i, end), fmt::format("<= {} (.bin length)", bin_size_));
    expected = end;
  }
}

int64_t IndexedDataset::sequence_length(int64_t i) const {
  if (i < 0 || i >= num_sequences_)
    throw std::out_of_range(fmt::format("{}: sequence {} out of range [0, {})", prefix_, i, num_sequences_));
  return size_at(i);
}

IndexedDataset::SequenceRange IndexedDataset::document_range(int64_t d) const {
  if (d < 0 || d >= num_documents())
    throw std::out_of_range(fmt::format("{}: document {} out of range [0, {})", prefix_, d, num_documents()));
  return {doc_idx_at(d), doc_idx_at(d + 1)};
}

int64_t IndexedDataset::document_tokens(int64_t d) const {
  const SequenceRange r = document_range(d);
  int64_t n = 0;
  for (int64_t i = r.begin; i < r.end; ++i) n += size_at(i);
  return n;
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t length, int64_t* out) const {
  const int64_t n = sequence_length(i);
  if (offset < 0 || length < 0 || offset + length > n)
    throw std::out_of_range(fmt::format("{}: read [{}, {}) of sequence {} with {} tokens", prefix_, offset,
                                        offset + length, i, n));
  const char* p = bin_map_ + pointer_at(i) + offset * int64_t(itemsize_);
  switch (dtype_) {
    case DType::kUInt8: widen<uint8_t>(p, length, out); break;
    case DType::kInt8: widen<int8_t>(p, length, out); break;
    case DType::kInt16: widen<int16_t>(p, length, out); break;
    case DType::kUInt16: widen<uint16_t>(p, length, out); break;
    case DType::kInt32: widen<int32_t>(p, length, out); break;
    default: widen<int64_t>(p, length, out); break;
  }
}

std::vector<int64_t> IndexedDataset::read(int64_t i) const {
  std::vector<int64_t> out(size_t(sequence_length(i)));
  read(i, 0, int64_t(out.size()), out.data());
  return out;
}

std::string IndexedDataset::index_digest() const { return sha256_hex(idx_map_, idx_size_); }

namespace {

template <typename T>
IndexedDataset::TokenRange scan_range(const char* p, size_t count) {
  T lo = std::numeric_limits<T>::max(), hi = std::numeric_limits<T>::lowest();
  constexpr size_t kBlock = 4096;  // memcpy into an aligned block: the mapped data may be unaligned
  T block[kBlock];
  for (size_t i = 0; i < count; i += kBlock) {
    const size_t n = std::min(kBlock, count - i);
    std::memcpy(block, p + i * sizeof(T), n * sizeof(T));
    for (size_t k = 0; k < n; ++k) lo = std::min(lo, block[k]), hi = std::max(hi, block[k]);
  }
  return {int64_t(lo), int64_t(hi)};
}

}  // namespace

IndexedDataset::TokenRange IndexedDataset::token_range() const {
  const size_t count = bin_size_ / itemsize_;
  if (count == 0) return {};
  switch (dtype_) {
    case DType::kUInt8: return scan_range<uint8_t>(bin_map_, count);
    case DType::kInt8: return scan_range<int8_t>(bin_map_, count);
    case DType::kInt16: return scan_range<int16_t>(bin_map_, count);
    case DType::kUInt16: return scan_range<uint16_t>(bin_map_, count);
    case DType::kInt32: return scan_range<int32_t>(bin_map_, count);
    case DType::kInt64: return scan_range<int64_t>(bin_map_, count);
    default:
      throw std::runtime_error(fmt::format("{}: dtype {} holds no token ids", bin_path_, dtype_name(dtype_)));
  }
}

DatasetVocab dataset_vocab(const IndexedDataset& ds) {
  DatasetVocab v;
  nlohmann::json meta;
  std::error_code ec;
  if (std::filesystem::exists(ds.prefix() + ".json", ec)) {
    meta = nlohmann::json::parse(read_file(ds.prefix() + ".json"), nullptr, /*allow_exceptions=*/false);
  }
  if (meta.is_object()) {
    const auto& vs = meta.value("vocab_size", nlohmann::json());
    if (vs.is_number_integer()) v.vocab_size = vs.get<int64_t>();
    const auto& lo = meta.value("min_token_id", nlohmann::json());
    const auto& hi = meta.value("max_token_id", nlohmann::json());
    const auto& digest = meta.value("index_sha256", nlohmann::json());
    if (lo.is_number_integer() && hi.is_number_integer() && digest.is_string() &&
        digest.get<std::string>() == ds.index_digest()) {
      v.min_token_id = lo.get<int64_t>(), v.max_token_id = hi.get<int64_t>();
      v.from_metadata = true;
      return v;
    }
  }
  const auto r = ds.token_range();
  v.min_token_id = r.min, v.max_token_id = r.max;
  return v;
}

}  // namespace optcc::data

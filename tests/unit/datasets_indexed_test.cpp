// IndexedDataset / IndexedDatasetBuilder: Megatron byte layout, round trips, merge (BR-17), corruption.
#include <cstring>
#include <filesystem>
#include <fstream>

#include "datasets/indexed_dataset.h"
#include "datasets/io_util.h"
#include "tests/unit/datasets_test_util.h"

namespace optcc::data {
namespace {

using testing::expect_error;

class IndexedDatasetTest : public testing::TempDirTest {
 protected:
  // One sequence per document, sequence i = [base, base+1, ...) of sizes[i] tokens.
  std::string write_docs(const std::string& name, const std::vector<int>& sizes, int64_t base = 10,
                         DType dtype = DType::kUInt16) {
    IndexedDatasetBuilder b(path(name), dtype);
    for (int n : sizes) {
      std::vector<int64_t> seq(static_cast<size_t>(n));
      for (auto& t : seq) t = base++;
      b.add_sequence(seq);
      b.end_document();
    }
    b.finalize();
    return path(name);
  }
  void patch(const std::string& file, size_t offset, const void* bytes, size_t n) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(offset));
    f.write(static_cast<const char*>(bytes), std::streamsize(n));
  }
};

TEST_F(IndexedDatasetTest, RoundTripUInt16WithMultiSequenceDocuments) {
  IndexedDatasetBuilder b(path("rt"), DType::kUInt16);
  b.add_sequence({1, 2, 3});
  b.add_sequence({4, 5});
  b.end_document();  // doc 0 = sequences 0, 1
  b.add_sequence({65535});
  b.end_document();  // doc 1 = sequence 2
  b.add_sequence(std::vector<int64_t>{});
  b.add_sequence({0, 7});
  b.finalize();      // doc 2 = sequences 3, 4 (closed by finalize)

  IndexedDataset ds(path("rt"));
  EXPECT_EQ(ds.dtype(), DType::kUInt16);
  EXPECT_EQ(ds.num_sequences(), 5);
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(ds.total_tokens(), 8);
  EXPECT_EQ(ds.bin_bytes(), 16);
  EXPECT_EQ(ds.sequence_length(0), 3);
  EXPECT_EQ(ds.sequence_length(3), 0);
  EXPECT_EQ(ds.document_range(0).begin, 0);
  EXPECT_EQ(ds.document_range(0).end, 2);
  EXPECT_EQ(ds.document_range(2).begin, 3);
  EXPECT_EQ(ds.document_range(2).end, 5);
  EXPECT_EQ(ds.document_tokens(0), 5);
  EXPECT_EQ(ds.read(0), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ds.read(2), (std::vector<int64_t>{65535}));
  EXPECT_EQ(ds.read(4), (std::vector<int64_t>{0, 7}));
  int64_t part[2];
  ds.read(0, 1, 2, part);
  EXPECT_EQ(part[0], 2);
  EXPECT_EQ(part[1], 3);
  EXPECT_THROW(ds.read(1, 1, 2, part), std::out_of_range);
  EXPECT_THROW(ds.sequence_length(5), std::out_of_range);
  EXPECT_THROW(ds.document_range(3), std::out_of_range);
}

TEST_F(IndexedDatasetTest, RoundTripInt32) {
  IndexedDatasetBuilder b(path("i32"), DType::kInt32);
  b.add_sequence({70000, -5, 2147483647});
  b.end_document();
  b.finalize();
  IndexedDataset ds(path("i32"));
  EXPECT_EQ(ds.dtype(), DType::kInt32);
  EXPECT_EQ(ds.bin_bytes(), 12);
  EXPECT_EQ(ds.read(0), (std::vector<int64_t>{70000, -5, 2147483647}));
}

// The exact bytes Megatron's MMapIndexedDataset.Index writer produces for sizes [2, 1], 2 documents.
TEST_F(IndexedDatasetTest, IndexBytesMatchMegatronLayout) {
  const std::string p = write_docs("layout", {2, 1});
  const std::string idx = read_file(p + ".idx");
  ASSERT_EQ(idx.size(), 34u + 2 * 4 + 2 * 8 + 3 * 8);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  auto u64 = [&](size_t off) { uint64_t v; std::memcpy(&v, idx.data() + off, 8); return v; };
  auto i32 = [&](size_t off) { int32_t v; std::memcpy(&v, idx.data() + off, 4); return v; };
  EXPECT_EQ(u64(9), 1u);                 // version
  EXPECT_EQ(uint8_t(idx[17]), 8);        // uint16
  EXPECT_EQ(u64(18), 2u);                // sequences
  EXPECT_EQ(u64(26), 3u);                // document index entries
  EXPECT_EQ(i32(34), 2);
  EXPECT_EQ(i32(38), 1);
  EXPECT_EQ(u64(42), 0u);                // pointers (bytes)
  EXPECT_EQ(u64(50), 4u);
  EXPECT_EQ(u64(58), 0u);                // doc_idx
  EXPECT_EQ(u64(66), 1u);
  EXPECT_EQ(u64(74), 2u);
  EXPECT_EQ(read_file(p + ".bin"), std::string("\x0a\x00\x0b\x00\x0c\x00", 6));
}

TEST_F(IndexedDatasetTest, TokenOutOfRangeForDtypeIsRejected) {
  IndexedDatasetBuilder b(path("bad"), DType::kUInt16);
  expect_error<std::out_of_range>([&] { b.add_sequence({1, 70000}); }, {"70000", "uint16", "position 1"});
  expect_error<std::out_of_range>([&] { b.add_sequence({-1}); }, {"-1", "uint16"});
  EXPECT_EQ(b.num_sequences(), 0);
  EXPECT_THROW(IndexedDatasetBuilder(path("f"), DType::kFloat32), std::invalid_argument);
}

TEST_F(IndexedDatasetTest, UnfinalizedBuilderLeavesNoFiles) {
  { IndexedDatasetBuilder b(path("gone"), DType::kUInt16); b.add_sequence({1}); }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 0);
}

// BR-17: A sizes [5,7,9] (3 docs) + B [4,4] (2 docs) -> 5 sequences, doc_idx [0,1,2,3,4,5].
TEST_F(IndexedDatasetTest, MergeConcatenatesDocumentIndex) {
  const std::string a = write_docs("a", {5, 7, 9}, 100), b = write_docs("b", {4, 4}, 500);
  IndexedDatasetBuilder::merge({a, b}, path("ab"));
  IndexedDataset m(path("ab"));
  ASSERT_EQ(m.num_sequences(), 5);
  ASSERT_EQ(m.num_documents(), 5);
  for (int64_t d = 0; d < 5; ++d) {
    EXPECT_EQ(m.document_range(d).begin, d);
    EXPECT_EQ(m.document_range(d).end, d + 1);
  }
  const std::vector<int64_t> sizes{5, 7, 9, 4, 4};
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(m.sequence_length(i), sizes[size_t(i)]);
  EXPECT_EQ(m.read(0).front(), 100);
  EXPECT_EQ(m.read(2).back(), 120);
  EXPECT_EQ(m.read(3), (std::vector<int64_t>{500, 501, 502, 503}));
  EXPECT_EQ(m.read(4), (std::vector<int64_t>{504, 505, 506, 507}));
}

TEST_F(IndexedDatasetTest, MergeKeepsMultiSequenceDocuments) {
  IndexedDatasetBuilder b(path("multi"), DType::kUInt16);
  b.add_sequence({1, 2});
  b.add_sequence({3});
  b.end_document();
  b.finalize();
  const std::string other = write_docs("one", {2});
  IndexedDatasetBuilder::merge({path("multi"), other, path("multi")}, path("m"));
  IndexedDataset m(path("m"));
  EXPECT_EQ(m.num_sequences(), 5);
  ASSERT_EQ(m.num_documents(), 3);
  EXPECT_EQ(m.document_range(1).begin, 2);
  EXPECT_EQ(m.document_range(2).begin, 3);
  EXPECT_EQ(m.document_range(2).end, 5);
  EXPECT_EQ(m.read(4), (std::vector<int64_t>{3}));
}

TEST_F(IndexedDatasetTest, MergeRejectsMixedDtypes) {
  const std::string a = write_docs("a16", {2}), b = write_docs("b32", {2}, 1, DType::kInt32);
  expect_error<std::runtime_error>([&] { IndexedDatasetBuilder::merge({a, b}, path("x")); }, {"int32", "uint16", b});
}

TEST_F(IndexedDatasetTest, BadMagicIsReported) {
  const std::string p = write_docs("c", {5, 7, 9});
  patch(p + ".idx", 0, "TNTIDX\0\0\0", 9);
  expect_error<std::runtime_error>([&] { IndexedDataset ds(p); }, {p + ".idx", "magic header", "TNTIDX", "MMIDIDX"});
}

TEST_F(IndexedDatasetTest, WrongVersionIsReported) {
  const std::string p = write_docs("c", {5});
  const uint64_t v = 2;
  patch(p + ".idx", 9, &v, 8);
  expect_error<std::runtime_error>([&] { IndexedDataset ds(p); }, {p + ".idx", "index version", "found 2", "expected 1"});
}

// BR-17: dtype code for int32 over a uint16 payload: sizes x 4 bytes exceed the .bin.
TEST_F(IndexedDatasetTest, DtypeCodeNotMatchingPayloadIsReported) {
  const std::string p = write_docs("c", {5, 7, 9});
  const uint8_t int32_code = 4;
  patch(p + ".idx", 17, &int32_code, 1);
  expect_error<std::runtime_error>([&] { IndexedDataset ds(p); },
                                   {p + ".bin", ".bin length", "found 42 bytes", "expected 84 bytes", "int32", "dtype code"});
}

TEST_F(IndexedDatasetTest, FloatDtypeCodeIsRejected) {
  const std::string p = write_docs("c", {4});
  const uint8_t float32_code = 7;
  patch(p + ".idx", 17, &float32_code, 1);
  expect_error<std::runtime_error>([&] { IndexedDataset ds(p); }, {"dtype code", "float32", "integer"});
}

TEST_F(IndexedDatasetTest, TruncatedBinIsReported) {
  const std::string p = write_docs("c", {5, 7, 9});
  std::filesystem::resize_file(p + ".bin", 42 - 2);
  expect_error<std::runtime_error>([&] { IndexedDataset ds(p); },
                                   {p + ".bin", ".bin length", "found 40 bytes", "expected 42 bytes", "truncated"});
}

TEST_F(IndexedDatasetTest, DocumentIndexNotEndingAtSequenceCountIsReported) {
  const std::string p = write_docs("c", {5, 7, 9});
  const int64_t last = 2;  // doc_idx [0,1,2,2]: N is 3
  patch(p + ".idx", std::filesystem::file_size(p + ".idx") - 8, &last, 8);
  expect_error<std::runtime_error>([&] { IndexedDataset ds(p); },
                                   {p + ".idx", "document index end", "found 2", "expected 3"});
}

TEST_F(IndexedDatasetTest, TruncatedIndexIsReported) {
  const std::string p = write_docs("c", {5, 7});
  std::filesystem::resize_file(p + ".idx", std::filesystem::file_size(p + ".idx") - 8);
  expect_error<std::runtime_error>([&] { IndexedDataset ds(p); }, {p + ".idx", "index length"});
  std::filesystem::resize_file(p + ".idx", 20);
  expect_error<std::runtime_error>([&] { IndexedDataset ds(p); }, {"header size"});
}

TEST_F(IndexedDatasetTest, InconsistentPointerIsReported) {
  const std::string p = write_docs("c", {5, 7});
  const int64_t bad = 8;  // pointers[1] should be 10
  patch(p + ".idx", 34 + 2 * 4 + 8, &bad, 8);
  expect_error<std::runtime_error>([&] { IndexedDataset ds(p); }, {"pointer", "pointers[1]=8", "10"});
}

TEST_F(IndexedDatasetTest, MissingFilesAreReported) {
  expect_error<std::runtime_error>([&] { IndexedDataset ds(path("nothing")); }, {path("nothing") + ".idx", "cannot open", "prepare"});
}

// The training binary's vocabulary check reads the token id range: scanned from the .bin, for
// every integer dtype (signed ones can hold negative ids), or taken from <prefix>.json only when
// the .json names this very .idx.
TEST_F(IndexedDatasetTest, TokenRangeScansEveryIntegerDtype) {
  for (DType dt : {DType::kUInt8, DType::kInt8, DType::kInt16, DType::kUInt16, DType::kInt32, DType::kInt64}) {
    IndexedDatasetBuilder b(path("r"), dt);
    const int64_t lo = dtype_name(dt)[0] == 'u' ? 3 : -5;
    b.add_sequence({7, lo, 100});
    b.add_sequence({9, 4});
    b.end_document();
    b.finalize();
    const auto r = IndexedDataset(path("r")).token_range();
    EXPECT_EQ(r.min, lo) << dtype_name(dt);
    EXPECT_EQ(r.max, 100) << dtype_name(dt);
  }
  IndexedDatasetBuilder empty(path("e"), DType::kUInt16);
  empty.finalize();
  const auto r = IndexedDataset(path("e")).token_range();
  EXPECT_EQ(r.max, -1);
}

TEST_F(IndexedDatasetTest, DatasetVocabTrustsOnlyAJsonThatNamesThisIndex) {
  const std::string p = write_docs("v", {5, 7, 3}, 250);  // ids 250..264
  IndexedDataset ds(p);
  DatasetVocab v = dataset_vocab(ds);  // no .json: scanned
  EXPECT_FALSE(v.from_metadata);
  EXPECT_EQ(v.min_token_id, 250);
  EXPECT_EQ(v.max_token_id, 264);
  EXPECT_EQ(v.vocab_size, 0);
  write_file_atomic(p + ".json", R"({"vocab_size": 300, "min_token_id": 0, "max_token_id": 299, "index_sha256": ")" +
                                     ds.index_digest() + "\"}");
  v = dataset_vocab(ds);  // its own index: the recorded range is used as it stands
  EXPECT_TRUE(v.from_metadata);
  EXPECT_EQ(v.max_token_id, 299);
  EXPECT_EQ(v.vocab_size, 300);
  write_file_atomic(p + ".json", R"({"vocab_size": 300, "min_token_id": 0, "max_token_id": 299, "index_sha256": "00"})");
  v = dataset_vocab(ds);  // another index's record: scanned
  EXPECT_FALSE(v.from_metadata);
  EXPECT_EQ(v.max_token_id, 264);
  EXPECT_EQ(v.vocab_size, 300);
  write_file_atomic(p + ".json", "not json");
  EXPECT_EQ(dataset_vocab(ds).max_token_id, 264);
}

}  // namespace
}  // namespace optcc::data

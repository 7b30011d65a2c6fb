// split_documents and GptDataset (document / sample / shuffle indices, cache).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "datasets/gpt_dataset.h"
#include "tests/unit/datasets_test_util.h"

namespace optcc::data {
namespace {

using testing::expect_error;

TEST(SplitDocuments, MegatronRule) {
  auto s = split_documents(1000, "949,50,1");
  EXPECT_EQ(s[0].begin_doc, 0);
  EXPECT_EQ(s[0].end_doc, 949);
  EXPECT_EQ(s[1].begin_doc, 949);
  EXPECT_EQ(s[1].end_doc, 999);
  EXPECT_EQ(s[2].begin_doc, 999);
  EXPECT_EQ(s[2].end_doc, 1000);

  s = split_documents(5500, "98,2,0");
  EXPECT_EQ(s[0].end_doc, 5390);
  EXPECT_EQ(s[1].end_doc, 5500);
  EXPECT_EQ(s[2].begin_doc, 5500);

  s = split_documents(7, "1");  // one weight: everything is train
  EXPECT_EQ(s[0].end_doc, 7);
  EXPECT_EQ(s[1].begin_doc, 7);
  EXPECT_EQ(s[2].end_doc, 7);

  s = split_documents(10, " 90 / 10 ");
  EXPECT_EQ(s[0].end_doc, 9);
  EXPECT_EQ(s[1].end_doc, 10);

  s = split_documents(3, "1,1,1");  // bounds stay monotone and end at n
  EXPECT_EQ(s[0].end_doc, 1);
  EXPECT_EQ(s[1].end_doc, 2);
  EXPECT_EQ(s[2].end_doc, 3);
}

TEST(SplitDocuments, MalformedInputNamesTheKey) {
  for (const char* bad : {"", "a,b", "1,2,3,4", "-1,2", "0,0,0", "1,,2", "1;2", "nan"})
    expect_error<std::invalid_argument>([&] { split_documents(100, bad); }, {"data.split", "949,50,1"});
}

TEST(SplitDocuments, OnlyDecimalWeights) {  // strtod alone reads these as 16, 8, inf
  for (const char* bad : {"0x10,1", "0x1p3,1", "inf,1", "1,infinity", "1,.nan"})
    expect_error<std::invalid_argument>([&] { split_documents(100, bad); }, {"data.split", "decimal"});
  EXPECT_EQ(split_documents(100, "090,010")[0].end_doc, 90);  // leading zeros stay decimal
}

// Documents of known lengths whose tokens are globally unique: doc d holds [1000*(d+1), ...).
class GptDatasetTest : public testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    IndexedDatasetBuilder b(path("ds"), DType::kUInt16);
    for (size_t d = 0; d < lengths_.size(); ++d) {
      std::vector<int64_t> seq(static_cast<size_t>(lengths_[d]));
      std::iota(seq.begin(), seq.end(), int64_t(1000 * (d + 1)));
      if (d == 2) {  // a document of two sequences
        b.add_sequence(std::vector<int64_t>(seq.begin(), seq.begin() + 3));
        b.add_sequence(std::vector<int64_t>(seq.begin() + 3, seq.end()));
      } else {
        b.add_sequence(seq);
      }
      b.end_document();
    }
    b.finalize();
    data_ = std::make_shared<const IndexedDataset>(path("ds"));
  }
  std::vector<int64_t> tokens_of(int64_t doc) const {
    std::vector<int64_t> t(static_cast<size_t>(lengths_[size_t(doc)]));
    std::iota(t.begin(), t.end(), 1000 * (doc + 1));
    return t;
  }
  GptDatasetOptions opts(int64_t seq_len, int64_t samples, uint64_t seed = 7, std::string cache = "") {
    GptDatasetOptions o;
    o.seq_len = seq_len, o.num_samples = samples, o.seed = seed, o.cache_dir = std::move(cache), o.name = "train";
    return o;
  }
  std::vector<std::vector<int64_t>> all_samples(const GptDataset& ds) const {
    std::vector<std::vector<int64_t>> out;
    for (int64_t i = 0; i < ds.size(); ++i) {
      out.emplace_back(static_cast<size_t>(ds.seq_len() + 1));
      ds.sample(i, out.back().data());
    }
    return out;
  }
  const std::vector<int64_t> lengths_{5, 3, 8, 1, 6, 4, 0};  // 27 tokens; doc 6 is empty
  std::shared_ptr<const IndexedDataset> data_;
};

// Stream-order samples are windows of S+1 tokens at stride S over the epoch-ordered document stream.
TEST_F(GptDatasetTest, SamplesAreOverlappingWindowsOfTheDocumentStream) {
  const int64_t S = 4;
  GptDataset ds(data_, SplitRange{0, 7}, opts(S, 6));
  EXPECT_EQ(ds.tokens_per_epoch(), 27);
  EXPECT_EQ(ds.num_epochs(), 1);
  EXPECT_EQ(ds.num_built_samples(), 6);  // (27 - 1) / 4
  std::vector<int64_t> stream;
  for (int64_t d : ds.document_order()) {
    auto t = tokens_of(d);
    stream.insert(stream.end(), t.begin(), t.end());
  }
  ASSERT_EQ(stream.size(), 27u);
  std::vector<int64_t> prev, cur(S + 1);
  for (int64_t j = 0; j < ds.num_built_samples(); ++j) {
    ds.sample_unshuffled(j, cur.data());
    EXPECT_EQ(cur, std::vector<int64_t>(stream.begin() + j * S, stream.begin() + j * S + S + 1)) << "sample " << j;
    if (!prev.empty()) {
      EXPECT_EQ(prev.back(), cur.front());  // one shared token
    }
    prev = cur;
  }
  // Shuffled access is a permutation of the stream-order samples.
  std::vector<int64_t> perm = ds.shuffle_index();
  std::sort(perm.begin(), perm.end());
  for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(perm[size_t(j)], j);
  std::vector<int64_t> a(S + 1), b(S + 1);
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.sample(i, a.data());
    ds.sample_unshuffled(ds.shuffle_index()[size_t(i)], b.data());
    EXPECT_EQ(a, b);
  }
}

// A hand-checked case: documents in stored order (a split of one epoch) crossing boundaries.
TEST_F(GptDatasetTest, SampleCrossingDocumentBoundariesHasExactTokens) {
  GptDataset ds(data_, SplitRange{0, 2}, opts(6, 1));  // docs 0 (5 tokens) + 1 (3 tokens): 8 tokens
  ASSERT_EQ(ds.num_built_samples(), 1);
  std::vector<int64_t> s(7);
  ds.sample(0, s.data());
  const int64_t first = ds.document_order()[0], second = ds.document_order()[1];
  std::vector<int64_t> expect = tokens_of(first), more = tokens_of(second);
  expect.insert(expect.end(), more.begin(), more.end());
  expect.resize(7);
  EXPECT_EQ(s, expect);
}

TEST_F(GptDatasetTest, DeterministicForSeedAndDifferentAcrossSeeds) {
  GptDataset a(data_, SplitRange{0, 7}, opts(3, 8, 11)), b(data_, SplitRange{0, 7}, opts(3, 8, 11));
  EXPECT_EQ(all_samples(a), all_samples(b));
  EXPECT_EQ(a.document_order(), b.document_order());
  bool differs = false;
  for (uint64_t seed = 12; seed < 20 && !differs; ++seed) {
    GptDataset c(data_, SplitRange{0, 7}, opts(3, 8, seed));
    differs = c.document_order() != a.document_order() || c.shuffle_index() != a.shuffle_index();
  }
  EXPECT_TRUE(differs);
}

TEST_F(GptDatasetTest, MoreSamplesThanOneEpochRepeatsDocuments) {
  // T = 27, S = 4: 20 samples need ceil((80 + 1) / 27) = 3 epochs; (3*27 - 1) / 4 = 20 built.
  GptDataset ds(data_, SplitRange{0, 7}, opts(4, 20));
  EXPECT_EQ(ds.num_epochs(), 3);
  EXPECT_EQ(ds.num_built_samples(), 20);
  std::map<int64_t, int> count;
  for (int64_t d : ds.document_order()) ++count[d];
  ASSERT_EQ(count.size(), 7u);
  for (auto& [doc, n] : count) EXPECT_EQ(n, 3) << "document " << doc;
  auto samples = all_samples(ds);
  for (const auto& s : samples) {  // every sample is a run of the (3-epoch) stream
    ASSERT_EQ(s.size(), 5u);
    for (int64_t t : s) EXPECT_GE(t, 1000);
  }
}

TEST_F(GptDatasetTest, SmallLastEpochIsShuffledSeparately) {
  // 7 samples: epoch 1 gives (27-1)/4 = 6; the last epoch adds 1 < 0.8 * 6 -> shuffled on its own.
  GptDataset ds(data_, SplitRange{0, 7}, opts(4, 7));
  ASSERT_EQ(ds.num_epochs(), 2);
  ASSERT_EQ(ds.num_built_samples(), 13);
  const auto& order = ds.document_order();
  std::vector<int64_t> first(order.begin(), order.begin() + 7), last(order.begin() + 7, order.end());
  std::sort(first.begin(), first.end());
  std::sort(last.begin(), last.end());
  EXPECT_EQ(first, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(last, first);
  std::vector<int64_t> head(ds.shuffle_index().begin(), ds.shuffle_index().begin() + 6);
  std::sort(head.begin(), head.end());
  EXPECT_EQ(head, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
}

TEST_F(GptDatasetTest, CacheHitGivesIdenticalSamples) {
  const std::string cache = path("cache");
  GptDataset a(data_, SplitRange{1, 6}, opts(3, 9, 5, cache));
  EXPECT_FALSE(a.loaded_from_cache());
  ASSERT_FALSE(a.cache_prefix().empty());
  EXPECT_TRUE(std::filesystem::exists(a.cache_prefix() + "_shuffle_idx.bin"));
  GptDataset b(data_, SplitRange{1, 6}, opts(3, 9, 5, cache));
  EXPECT_TRUE(b.loaded_from_cache());
  EXPECT_EQ(all_samples(a), all_samples(b));
  GptDataset other_seed(data_, SplitRange{1, 6}, opts(3, 9, 6, cache));
  EXPECT_FALSE(other_seed.loaded_from_cache());

  std::filesystem::resize_file(a.cache_prefix() + "_sample_idx.bin", 20);  // damaged cache is rebuilt
  GptDataset c(data_, SplitRange{1, 6}, opts(3, 9, 5, cache));
  EXPECT_FALSE(c.loaded_from_cache());
  EXPECT_EQ(all_samples(a), all_samples(c));
}

TEST_F(GptDatasetTest, SplitUsesOnlyItsDocuments) {
  GptDataset ds(data_, SplitRange{4, 6}, opts(2, 10));  // docs 4 (6 tokens) and 5 (4 tokens)
  for (const auto& s : all_samples(ds))
    for (int64_t t : s) EXPECT_TRUE((t >= 5000 && t < 5006) || (t >= 6000 && t < 6004)) << t;
}

TEST_F(GptDatasetTest, ErrorsAreExplicit) {
  expect_error<std::runtime_error>([&] { GptDataset(data_, SplitRange{6, 7}, opts(4, 1)); }, {"no tokens", "data.split"});
  GptDataset empty(data_, SplitRange{6, 7}, opts(4, 0));  // zero samples from an empty split is fine
  EXPECT_EQ(empty.size(), 0);
  EXPECT_THROW(GptDataset(data_, SplitRange{0, 8}, opts(4, 1)), std::invalid_argument);
  EXPECT_THROW(GptDataset(data_, SplitRange{0, 7}, opts(0, 1)), std::invalid_argument);
  GptDataset ds(data_, SplitRange{0, 7}, opts(4, 3));
  std::vector<int64_t> buf(5);
  EXPECT_THROW(ds.sample(3, buf.data()), std::out_of_range);
}

}  // namespace
}  // namespace optcc::data

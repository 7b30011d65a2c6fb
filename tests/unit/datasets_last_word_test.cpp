// Last-word prediction without SentencePiece (datasets/last_word.h): the .vocab reader, word
// boundaries from "▁", the target/context split and the items built from an indexed dataset.
#include <gtest/gtest.h>

#include <fstream>

#include "datasets/indexed_dataset.h"
#include "datasets/last_word.h"
#include "tests/unit/datasets_test_util.h"

namespace optcc::data {
namespace {

using testing::expect_error;

// id: 0 <unk>, 1 </s>, 2 ▁the, 3 ▁cat, 4 ▁sat, 5 ing, 6 ., 7 ▁, 8 <0x0A>, 9 ▁«, 10 é, 11 —, 12 ▁run, 13 ▁42
const std::vector<std::string> kPieces = {"<unk>", "</s>", "\u2581the", "\u2581cat", "\u2581sat", "ing", ".",
                                          "\u2581",  "<0x0A>", "\u2581\u00ab", "\u00e9", "\u2014", "\u2581run",
                                          "\u258142"};

class LastWord : public testing::TempDirTest {
 protected:
  PieceVocab vocab_{kPieces};
};

TEST_F(LastWord, ReadsTheVocabFileSentencePieceWrites) {
  {
    std::ofstream out(path("t.vocab"));
    for (const auto& p : kPieces) out << p << "\t-1.5\n";
  }
  const PieceVocab v = PieceVocab::read(path("t.vocab"));
  ASSERT_EQ(v.size(), 14);
  EXPECT_EQ(v.piece(3), "\u2581cat");
  EXPECT_EQ(v.piece(6), ".");
  EXPECT_THROW(v.piece(14), std::out_of_range);
  expect_error<std::runtime_error>([&] { PieceVocab::read(path("missing.vocab")); },
                                   {"missing.vocab", "optcc data prepare"});
  std::ofstream(path("bad.vocab")) << "\u2581a\t0\n\t-1\n";
  expect_error<std::runtime_error>([&] { PieceVocab::read(path("bad.vocab")); }, {"bad.vocab:2", "empty piece"});
}

TEST_F(LastWord, WordStartsAndWordContent) {
  const std::vector<bool> starts = {false, false, true, true, true, false, false, true, false, true, false, false,
                                    true,  true};
  const std::vector<bool> content = {false, false, true, true, true, true, false, false, false, false, true, false,
                                     true,  true};
  for (int64_t id = 0; id < vocab_.size(); ++id) {
    EXPECT_EQ(vocab_.starts_word(id), starts[id]) << vocab_.piece(id);
    EXPECT_EQ(vocab_.is_word_content(id), content[id]) << vocab_.piece(id);
  }
}

TEST_F(LastWord, SplitDropsTrailingNonWordsAndTakesTheLastWordStart) {
  auto split = [&](std::vector<int64_t> doc) { return split_last_word(doc, vocab_); };
  // "the cat sat." + EOD: target "▁sat", context "▁the ▁cat".
  auto s = split({2, 3, 4, 6, 1});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->context_end, 2);
  EXPECT_EQ(s->target_end, 3);
  // "the run" + "ing" + newline byte + EOD: a two-piece word.
  s = split({2, 12, 5, 8, 1});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->context_end, 1);
  EXPECT_EQ(s->target_end, 3);
  // "the 42 —" + lone "▁" + EOD: the number is the word.
  s = split({2, 13, 11, 7, 1});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->context_end, 1);
  EXPECT_EQ(s->target_end, 2);
  EXPECT_FALSE(split({3, 6, 1}));        // the only word has no context
  EXPECT_FALSE(split({6, 11, 8, 1}));    // no word at all
  EXPECT_FALSE(split({5, 10, 1}));       // word content but no word start before it
  EXPECT_THROW(split({2, 99}), std::out_of_range);
}

TEST_F(LastWord, ItemsTruncateTheContextAndSkipWhatCannotBeAsked) {
  IndexedDatasetBuilder b(path("d"), DType::kUInt16);
  for (const std::vector<int64_t>& doc : std::vector<std::vector<int64_t>>{
           {2, 3, 4, 6, 1},        // doc 0: target [4]
           {3, 6, 1},              // doc 1: skipped (no context)
           {2, 3, 2, 3, 12, 5, 1}, // doc 2: target [12, 5], context 4 tokens
           {2, 4, 1}}) {           // doc 3: target [4]
    b.add_sequence(doc);
    b.end_document();
  }
  b.finalize();
  const IndexedDataset ds(path("d"));
  int64_t skipped = -1;
  auto items = last_word_items(ds, 0, 4, vocab_, 0, /*seq_len=*/4, &skipped);
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(items[0].document, 0);
  EXPECT_EQ(items[0].input, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(items[0].first_target_pos, 1);
  EXPECT_EQ(items[0].target, (std::vector<int64_t>{4}));
  // Doc 2 needs 4 + 2 - 1 = 5 input tokens: the context keeps its last 3.
  EXPECT_EQ(items[1].document, 2);
  EXPECT_EQ(items[1].input, (std::vector<int64_t>{3, 2, 3, 12}));
  EXPECT_EQ(items[1].first_target_pos, 2);
  EXPECT_EQ(items[1].target, (std::vector<int64_t>{12, 5}));
  // A target longer than seq_len cannot be asked; max_documents stops after that many items.
  items = last_word_items(ds, 0, 4, vocab_, 0, /*seq_len=*/1, &skipped);
  EXPECT_EQ(items.size(), 2u);
  EXPECT_EQ(skipped, 2);
  items = last_word_items(ds, 1, 4, vocab_, 1, 8, &skipped);
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].document, 2);
  EXPECT_EQ(skipped, 1);
}

TEST_F(LastWord, CorrectOnlyWhenEveryTargetTokenIsPredicted) {
  LastWordItem item;
  item.input = {3, 2, 3, 12};
  item.first_target_pos = 2;
  item.target = {12, 5};
  const int64_t right[] = {0, 0, 12, 5};
  const int64_t half[] = {3, 2, 12, 6};
  const int64_t late[] = {0, 12, 5, 0};
  EXPECT_TRUE(last_word_correct(item, right));
  EXPECT_FALSE(last_word_correct(item, half));
  EXPECT_FALSE(last_word_correct(item, late));
}

}  // namespace
}  // namespace optcc::data

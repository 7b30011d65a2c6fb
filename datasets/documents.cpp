#include "datasets/documents.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace optcc::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

}  // namespace

std::vector<std::string> read_documents(const std::string& path, const std::string& json_key,
                                        int64_t* skipped_empty) {
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error(fmt::format("{}: cannot open input: {} (run `optcc data fetch` first?)", path,
                                         std::strerror(errno)));
  const bool jsonl = ends_with(path, ".jsonl") || ends_with(path, ".json");
  std::vector<std::string> docs;
  int64_t empty = 0;
  std::string line, current;
  int64_t line_no = 0;
  auto flush_text = [&] {
    if (!current.empty()) docs.push_back(std::move(current));
    current.clear();
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (!jsonl) {
      if (is_blank(line)) {
        flush_text();
      } else {
        if (!current.empty()) current += '\n';
        current += line;
      }
      continue;
    }
    if (is_blank(line)) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw std::runtime_error(fmt::format("{}:{}: not valid JSON ({})", path, line_no, e.what()));
    }
    if (!j.is_object()) throw std::runtime_error(fmt::format("{}:{}: expected a JSON object per line", path, line_no));
    auto it = j.find(json_key);
    if (it == j.end() || !it->is_string())
      throw std::runtime_error(fmt::format("{}:{}: no string field \"{}\" (set --json-key to the field holding "
                                           "the text)", path, line_no, json_key));
    std::string text = it->get<std::string>();
    if (text.empty()) {
      ++empty;
      continue;
    }
    docs.push_back(std::move(text));
  }
  if (in.bad()) throw std::runtime_error(fmt::format("{}: read error", path));
  if (!jsonl) flush_text();
  if (skipped_empty) *skipped_empty = empty;
  return docs;
}

void append_jsonl_document(std::string& out, const std::string& text) {
  nlohmann::json j = {{"text", text}};
  out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  out += '\n';
}

int64_t utf8_length(const std::string& text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace optcc::data

// Reading text documents for `optcc-data prepare`.
#pragma once

#include <string>
#include <vector>

namespace optcc::data {

// All documents of one input file, in file order:
//   *.jsonl / *.json : one JSON object per line, the document is the string under `json_key`
//                      (blank lines are skipped);
//   anything else    : plain text, documents separated by one or more blank lines (lines of a
//                      document keep their "\n").
// Documents whose text is empty are skipped (counted in `skipped_empty` when given).
// Throws std::runtime_error "<path>:<line>: <problem>" for a missing file, a line that is not JSON,
// not an object, or lacks a string `json_key`; nothing is returned for a partially valid file.
std::vector<std::string> read_documents(const std::string& path, const std::string& json_key = "text",
                                        int64_t* skipped_empty = nullptr);

// Appends {"text": text} and a newline to `out` (invalid UTF-8 replaced by U+FFFD).
void append_jsonl_document(std::string& out, const std::string& text);

// Number of Unicode code points in UTF-8 text (bytes 0b10xxxxxx are continuation bytes).
int64_t utf8_length(const std::string& text);

}  // namespace optcc::data

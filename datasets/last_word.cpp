#include "datasets/last_word.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <stdexcept>

namespace optcc::data {
namespace {

const std::string kWordStart = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's "▁"

bool begins_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// "<unk>", "</s>", "<0x0A>", ...: control, unknown and byte-fallback pieces.
bool is_special(const std::string& piece) { return piece.size() >= 3 && piece.front() == '<' && piece.back() == '>'; }

// The code point at text[i] (UTF-8) and its length in bytes; a malformed byte is returned as itself.
char32_t decode_utf8(const std::string& text, size_t i, size_t& len) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char c = b(0);
  len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  if (i + len > text.size()) len = 1;
  if (len == 1) return c;
  char32_t cp = c & (0x3F >> (len - 1));
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (b(k) & 0x3F);
  return cp;
}

// Non-ASCII code points that are no part of a word: Latin-1 punctuation and symbols (U+00A0-00BF,
// e.g. « » ¿), General Punctuation (U+2000-206F: dashes, curly quotes, ellipsis), the word-start
// mark "▁" (U+2581) and CJK punctuation (U+3000-303F). Every other non-ASCII code point counts as a
// letter (other scripts, accented letters).
bool is_non_word_symbol(char32_t c) {
  return (c >= 0xA0 && c <= 0xBF) || (c >= 0x2000 && c <= 0x206F) || c == 0x2581 || (c >= 0x3000 && c <= 0x303F);
}

// The document's tokens, all of its sequences.
std::vector<int64_t> document_tokens(const IndexedDataset& data, int64_t doc) {
  std::vector<int64_t> out;
  const auto r = data.document_range(doc);
  for (int64_t i = r.begin; i < r.end; ++i) {
    const auto seq = data.read(i);
    out.insert(out.end(), seq.begin(), seq.end());
  }
  return out;
}

}  // namespace

PieceVocab PieceVocab::read(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error(fmt::format("cannot read the tokenizer vocabulary {}. Fix: run `optcc data prepare` "
                                         "(SentencePiece writes <prefix>.vocab next to <prefix>.model)",
                                         path));
  }
  std::vector<std::string> pieces;
  std::string line;
  while (std::getline(in, line)) {
    const std::string piece = line.substr(0, line.find('\t'));
    if (piece.empty()) {
      throw std::runtime_error(fmt::format("{}:{}: empty piece (expected piece<TAB>score)", path, pieces.size() + 1));
    }
    pieces.push_back(piece);
  }
  if (pieces.empty()) throw std::runtime_error(fmt::format("{} holds no pieces", path));
  return PieceVocab(std::move(pieces));
}

const std::string& PieceVocab::piece(int64_t id) const {
  if (id < 0 || id >= size()) {
    throw std::out_of_range(fmt::format("token id {} is outside the tokenizer vocabulary of {} pieces", id, size()));
  }
  return pieces_[id];
}

bool PieceVocab::starts_word(int64_t id) const { return begins_with(piece(id), kWordStart); }

bool PieceVocab::is_word_content(int64_t id) const {
  const std::string& p = piece(id);
  if (is_special(p)) return false;
  const std::string text = starts_word(id) ? p.substr(kWordStart.size()) : p;
  for (size_t i = 0; i < text.size();) {
    size_t len = 1;
    const char32_t c = decode_utf8(text, i, len);
    i += len;
    if (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : !is_non_word_symbol(c)) return true;
  }
  return false;
}

std::optional<LastWordSplit> split_last_word(const std::vector<int64_t>& doc, const PieceVocab& vocab) {
  auto end = static_cast<int64_t>(doc.size());
  while (end > 0 && !vocab.is_word_content(doc[end - 1])) --end;  // EOD, punctuation, bytes
  if (end == 0) return std::nullopt;
  int64_t start = end - 1;
  while (start > 0 && !vocab.starts_word(doc[start])) --start;
  if (start == 0) return std::nullopt;  // no context before the word
  return LastWordSplit{start, end};
}

std::vector<LastWordItem> last_word_items(const IndexedDataset& data, int64_t begin_doc, int64_t end_doc,
                                          const PieceVocab& vocab, int64_t max_documents, int64_t seq_len,
                                          int64_t* skipped) {
  std::vector<LastWordItem> items;
  int64_t none = 0;
  for (int64_t d = begin_doc; d < end_doc && (max_documents == 0 || int64_t(items.size()) < max_documents); ++d) {
    const auto doc = document_tokens(data, d);
    const auto split = split_last_word(doc, vocab);
    const int64_t target_len = split ? split->target_end - split->context_end : 0;
    if (!split || target_len > seq_len) {
      ++none;
      continue;
    }
    // Input: context + target[0 .. n-2], at most seq_len tokens (the context's last ones).
    const int64_t input_end = split->target_end - 1;
    const int64_t input_begin = std::max<int64_t>(0, input_end - seq_len);
    LastWordItem item;
    item.document = d;
    item.input.assign(doc.begin() + input_begin, doc.begin() + input_end);
    item.first_target_pos = split->context_end - 1 - input_begin;
    item.target.assign(doc.begin() + split->context_end, doc.begin() + split->target_end);
    items.push_back(std::move(item));
  }
  if (skipped) *skipped = none;
  return items;
}

bool last_word_correct(const LastWordItem& item, const int64_t* argmax) {
  for (size_t j = 0; j < item.target.size(); ++j) {
    if (argmax[item.first_target_pos + static_cast<int64_t>(j)] != item.target[j]) return false;
  }
  return true;
}

}  // namespace optcc::data

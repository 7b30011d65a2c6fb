// LAMBADA-style last-word prediction on held-out documents (`optcc eval`), without SentencePiece:
// the word boundaries come from the tokenizer's `.vocab` text file, which SentencePiece training
// writes next to the `.model` (one "piece<TAB>score" line per id, in id order). The training binary
// must not link SentencePiece (docs/architecture.md §7), and it needs no more than the pieces' text.
//
// The task, per document (token ids as the indexed dataset holds them, EOD included):
//   1. Trailing tokens that carry no word are dropped: control and byte pieces ("<unk>", "<s>",
//      "</s>" = EOD, "<0x0A>", ...) and pieces with no letter or digit (punctuation, a lone "▁"),
//      so the target is the last word itself, as LAMBADA's targets are words.
//   2. The last word starts at the last remaining piece that begins with "▁" (U+2581, SentencePiece's
//      word-start mark) and runs to the end of what remains; it may span several pieces.
//   3. The context is every token before it (nothing is prepended). A document with no context
//      (the word is its first token) or no word is skipped.
// The model sees context + target[0 .. n-2] and must predict each target token greedily (argmax over
// the true vocabulary) at the position before it; the document counts as right when all n are.
// Accuracy = right / evaluated documents.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "datasets/indexed_dataset.h"

namespace optcc::data {

/// The pieces of a SentencePiece vocabulary, by id, read from its `.vocab` file.
class PieceVocab {
 public:
  /// Reads "piece<TAB>score" lines (score optional); line i is id i. Throws std::runtime_error
  /// naming the file when it cannot be read, is empty, or a line is empty.
  static PieceVocab read(const std::string& path);
  explicit PieceVocab(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}

  int64_t size() const { return static_cast<int64_t>(pieces_.size()); }
  /// The piece of `id`; throws std::out_of_range outside [0, size()).
  const std::string& piece(int64_t id) const;
  /// Whether the piece begins with "▁" (a word start).
  bool starts_word(int64_t id) const;
  /// Whether the piece is part of a word: not a control/byte piece ("<...>") and it holds a letter
  /// or digit (ASCII alphanumerics, or a non-ASCII character outside the punctuation blocks
  /// U+00A0-00BF, U+2000-206F, U+3000-303F and other than "▁").
  bool is_word_content(int64_t id) const;

 private:
  std::vector<std::string> pieces_;
};

/// The `.vocab` of dataset `prefix`'s tokenizer: `optcc data prepare` trains <prefix>.model, and
/// SentencePiece writes <prefix>.vocab with it.
inline std::string piece_vocab_path(const std::string& prefix) { return prefix + ".vocab"; }

/// Where the last word of a document sits: context tokens [0, context_end), target tokens
/// [context_end, target_end).
struct LastWordSplit {
  int64_t context_end = 0;
  int64_t target_end = 0;
};

/// The split of `doc` by the rules in the header comment; nullopt when the document has no word or
/// no context. Ids outside the vocabulary throw std::out_of_range.
std::optional<LastWordSplit> split_last_word(const std::vector<int64_t>& doc, const PieceVocab& vocab);

/// One task of the metric: the model input and what must come out.
struct LastWordItem {
  int64_t document = 0;           // absolute document id in the indexed dataset
  std::vector<int64_t> input;     // context (left-truncated to fit) + target without its last token
  int64_t first_target_pos = 0;   // position in `input` whose prediction is target[0]
  std::vector<int64_t> target;    // the last word's tokens
};

/// Items for documents [begin_doc, end_doc) in order, stopping after `max_documents` items (0: every
/// document), with inputs of at most `seq_len` tokens (a longer context keeps its last tokens; a target longer
/// than seq_len is skipped). `skipped` counts documents without an item (no word, no context, too
/// long). Throws std::out_of_range for ids outside `vocab`.
std::vector<LastWordItem> last_word_items(const IndexedDataset& data, int64_t begin_doc, int64_t end_doc,
                                          const PieceVocab& vocab, int64_t max_documents, int64_t seq_len,
                                          int64_t* skipped = nullptr);

/// Whether greedy predictions `argmax` (one per input position, argmax[i] = the prediction after
/// input[0..i]) reproduce every target token: argmax[first_target_pos + j] == target[j] for all j.
bool last_word_correct(const LastWordItem& item, const int64_t* argmax);

}  // namespace optcc::data

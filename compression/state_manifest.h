// Which tensor a piece of compressor state belongs to. Compressor state is per tensor (a DP
// reducer's error-feedback buffer and warm-start Q per gradient; the pipeline codec's LEP buffers
// and Q per message stream) and means nothing for another tensor. Checkpoints therefore store the
// (name, shape) list with the state, and loading compares it with the list the resumed run would
// use: a difference is refused (StateMismatch, naming the first differing entry), never remapped,
// so a changed setting (compression.fused_embedding, train.micro_batch_size, ...) cannot attach
// one tensor's residual to another. Fix for the user: resume with the settings the checkpoint was
// written with, or start fresh.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace optcc {

/// One tensor that compressor state is kept for: a parameter name ("blocks.0.ln1.weight") or a
/// state name ("lep.3"), and its shape.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool operator==(const TensorSpec& o) const { return name == o.name && shape == o.shape; }
  bool operator!=(const TensorSpec& o) const { return !(*this == o); }
};

/// "'blocks.0.ln1.weight' [64]".
std::string describe(const TensorSpec& t);
/// "[64, 32]".
std::string describe_shape(const std::vector<int64_t>& shape);

/// Saved compressor state does not belong to the tensors of this run; what() names the first
/// difference, e.g. "tensor 0: 'embedding.weight' [64, 32] in the checkpoint, 'blocks.0.ln1.weight'
/// [32] in this run".
class StateMismatch : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// The first difference between two ordered lists, "" when equal, e.g. "tensor 1: 'b' [16] in the
/// checkpoint, 'c' [8] in this run" (`where` names the two lists). With `names` false only counts
/// and shapes are compared (a caller that knows shapes but not names, e.g. reduce()).
struct ListNames {
  const char* saved = "in the checkpoint";
  const char* now = "in this run";
};
std::string first_difference(const std::vector<TensorSpec>& saved, const std::vector<TensorSpec>& now,
                             bool names = true, ListNames where = {});

/// Stores `specs` under `key` (key + ".names": the names joined by '\n'; key + ".shapes": int64
/// [Σ (1 + ndim)], each shape as its ndim followed by its sizes).
void write_tensor_specs(torch::serialize::OutputArchive& archive, const std::string& key,
                        const std::vector<TensorSpec>& specs);
/// The list written under `key`; nullopt when the archive has none. std::invalid_argument when
/// the two entries disagree (a corrupt archive).
std::optional<std::vector<TensorSpec>> read_tensor_specs(torch::serialize::InputArchive& archive,
                                                         const std::string& key);

}  // namespace optcc

// Model-size presets: the paper's GPT sizes (docs/design.md §8.1; Megatron-LM) and small sizes that
// train on a CPU in minutes. A preset fills model.{num_layers, hidden_size, num_heads, seq_len}.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace optcc {

struct ModelPreset {
  std::string name;
  int64_t num_layers;
  int64_t hidden_size;
  int64_t num_heads;
  int64_t seq_len;
  std::string note;  // what the preset is for
};

/// All presets, smallest first.
const std::vector<ModelPreset>& model_presets();
/// The preset called `name`, or nullptr.
const ModelPreset* find_model_preset(const std::string& name);
/// "tiny, mini, ..." for error messages.
std::string model_preset_names();

}  // namespace optcc

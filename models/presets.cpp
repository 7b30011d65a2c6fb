#include "models/presets.h"

namespace optcc {

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"tiny", 2, 64, 2, 64, "unit tests and smoke runs (~0.1M non-embedding parameters)"},
      {"mini", 4, 256, 4, 128, "CPU demo: trains on the corpus in minutes (3.1M non-embedding)"},
      {"small", 6, 512, 8, 256, "CPU experiments (19M non-embedding parameters)"},
      {"gpt-335m", 24, 1024, 16, 1024, "paper 335M (Megatron 345M shape)"},
      {"gpt-2.5b", 52, 1920, 24, 1024, "paper 2.5B (Optimus-CC Table 2)"},
      {"gpt-8.3b", 72, 3072, 24, 1024, "paper 8.3B (Optimus-CC Table 2)"},
      {"gpt-175b", 96, 12288, 96, 2048, "GPT-3 175B shape (Fig. 14 slices)"},
  };
  return presets;
}

const ModelPreset* find_model_preset(const std::string& name) {
  for (const auto& p : model_presets()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string model_preset_names() {
  std::string out;
  for (const auto& p : model_presets()) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

}  // namespace optcc

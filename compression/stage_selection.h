// Selective stage compression (SC, docs/design.md §6.5) as a typed setting and its rule: which
// pipeline stages reduce their DP gradients with compression.dp, the others reducing raw.
// compression.dp_stages is parsed into a DpStages once, when the config is loaded
// (harness/config/config_io.cpp); the trainer, GradientSync (harness/train/grad_sync.h) and the
// traffic model (harness/perfmodel/traffic_estimate.h) all decide through stage_compresses_dp().
#pragma once

#include <cstdint>
#include <string>

namespace optcc {

struct DpStages {
  enum class Kind { kAll, kAuto, kLeading };
  Kind kind = Kind::kAll;
  int64_t leading = 0;  // kLeading: stages 0..leading-1 compress (>= 1)

  static DpStages all() { return {}; }
  static DpStages automatic() { return {Kind::kAuto, 0}; }
  static DpStages first(int64_t n) { return {Kind::kLeading, n}; }
  /// How many leading stages of `stages` compress: all of them, min(leading, stages), or -1 for
  /// auto (a calibration step decides per stage at run time, harness/train/sc_choice.h).
  int64_t way(int64_t stages) const;
  /// The config's text: "all", "auto" or the integer.
  std::string text() const;
  bool operator==(const DpStages& o) const { return kind == o.kind && leading == o.leading; }
  bool operator!=(const DpStages& o) const { return !(*this == o); }
};

/// "all", "auto" or a positive integer (compression/options.h's integer rules: decimal, `010` is
/// 10). False with `why` otherwise (`out` untouched).
bool parse_dp_stages(const std::string& s, DpStages& out, std::string& why);

/// SC's rule: stage `stage` (0-based) of `stages` compresses its DP gradients iff compression.dp
/// compresses at all (`dp_compresses`: it is not `none`) and the stage is one of the leading
/// way(stages); under auto, iff `auto_choice` (the calibration's answer for this stage).
bool stage_compresses_dp(const DpStages& s, int64_t stage, int64_t stages, bool dp_compresses, bool auto_choice = false);

}  // namespace optcc

#include "compression/stage_selection.h"

#include <algorithm>

#include "compression/options.h"

namespace optcc {

int64_t DpStages::way(int64_t stages) const {
  switch (kind) {
    case Kind::kAll: return stages;
    case Kind::kAuto: return -1;
    case Kind::kLeading: return std::min(leading, stages);
  }
  return stages;
}

std::string DpStages::text() const {
  switch (kind) {
    case Kind::kAll: return "all";
    case Kind::kAuto: return "auto";
    case Kind::kLeading: return std::to_string(leading);
  }
  return "all";
}

bool parse_dp_stages(const std::string& s, DpStages& out, std::string& why) {
  if (s == "all" || s == "auto") {
    out = s == "all" ? DpStages::all() : DpStages::automatic();
    return true;
  }
  int64_t n = 0;
  if (!parse_integer_text(s, n, why)) return false;
  if (n < 1) {
    why = "a way of at least 1 stage";
    return false;
  }
  out = DpStages::first(n);
  return true;
}

bool stage_compresses_dp(const DpStages& s, int64_t stage, int64_t stages, bool dp_compresses, bool auto_choice) {
  if (!dp_compresses) return false;
  if (s.kind == DpStages::Kind::kAuto) return auto_choice;
  return stage < s.way(stages);
}

}  // namespace optcc

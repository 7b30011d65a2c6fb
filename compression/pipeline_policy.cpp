#include "compression/pipeline_policy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

namespace optcc {
namespace {

template <class E>
bool lookup(const std::vector<std::string>& names, const std::string& s, E& out) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == s) {
      out = static_cast<E>(i);
      return true;
    }
  }
  return false;
}

}  // namespace

const std::vector<std::string>& backward_phases_names() {
  static const std::vector<std::string> names = {"all", "epilogue"};  // BackwardPhases order
  return names;
}

const std::vector<std::string>& lep_mode_names() {
  static const std::vector<std::string> names = {"off", "lazy", "per_microbatch", "lazy_iteration",
                                                 "lazy_decay"};  // LepMode order
  return names;
}

std::string to_string(BackwardPhases p) { return backward_phases_names().at(static_cast<size_t>(p)); }
std::string to_string(LepMode m) { return lep_mode_names().at(static_cast<size_t>(m)); }

bool parse_name(const std::string& s, BackwardPhases& out) { return lookup(backward_phases_names(), s, out); }
bool parse_name(const std::string& s, LepMode& out) { return lookup(lep_mode_names(), s, out); }

BackwardPhases parse_backward_phases(const std::string& s) {
  BackwardPhases p;
  if (!parse_name(s, p)) {
    throw std::invalid_argument(fmt::format("backward_phases '{}' (known: {})", s, fmt::join(backward_phases_names(), ", ")));
  }
  return p;
}

LepMode parse_lep_mode(const std::string& s) {
  LepMode m;
  if (!parse_name(s, m)) throw std::invalid_argument(fmt::format("lep '{}' (known: {})", s, fmt::join(lep_mode_names(), ", ")));
  return m;
}

}  // namespace optcc

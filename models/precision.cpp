#include "models/precision.h"

#include <stdexcept>
#include <utility>

namespace optcc {
namespace {
const std::vector<std::pair<std::string, c10::ScalarType>>& table() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> t{
      {"fp32", c10::ScalarType::Float}, {"bf16", c10::ScalarType::BFloat16}, {"fp16", c10::ScalarType::Half}};
  return t;
}
}  // namespace

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [name, dtype] : table()) n.push_back(name);
    return n;
  }();
  return names;
}

c10::ScalarType precision_dtype(const std::string& name) {
  for (const auto& [n, dtype] : table()) {
    if (n == name) return dtype;
  }
  std::string accepted;
  for (const auto& n : precision_names()) accepted += (accepted.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown precision '" + name + "' (accepted: " + accepted + ")");
}

int precision_element_bytes(const std::string& name) {
  return static_cast<int>(c10::elementSize(precision_dtype(name)));
}

}  // namespace optcc

#include "compression/comm_plan.h"

#include <utility>

namespace optcc {

CommStep collective_step(CollectiveKind kind, int64_t bytes, std::string what) {
  CommStep c;
  c.kind = kind;
  c.bytes = bytes;
  c.what = std::move(what);
  return c;
}

CommStep arithmetic_step(std::string codec, double flops, double memory_bytes, std::string what) {
  CommStep c;
  c.compute = true;
  c.flops = flops;
  c.memory_bytes = memory_bytes;
  c.codec = std::move(codec);
  c.what = std::move(what);
  return c;
}

int64_t collective_bytes(const std::vector<CommStep>& steps) {
  int64_t sum = 0;
  for (const auto& s : steps) sum += s.compute ? 0 : s.bytes;
  return sum;
}

int64_t collective_count(const std::vector<CommStep>& steps) {
  int64_t n = 0;
  for (const auto& s : steps) n += s.compute ? 0 : 1;
  return n;
}

}  // namespace optcc

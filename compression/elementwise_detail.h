// Internal to compression/'s element-wise reducers (elementwise_reducer.h and the four
// *_reducer.cpp files): strict option reading, k of topk/randomk, counter-based generators and
// message helpers. Not part of any public contract.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "compression/options.h"

namespace optcc::elementwise {

// ---- options ----------------------------------------------------------------------------------

template <class T>
T option(const YAML::Node& o, const char* who, const char* key, T fallback, const char*) {
  return option_value<T>(o, who, key, fallback);  // strict: compression/options.h
}

template <class T>
void require(bool ok, const char* who, const char* key, T value, const char* rule) {
  if (!ok) throw std::invalid_argument(fmt::format("{}: option '{}' must be {}, got {}", who, key, rule, value));
}

inline bool has(const YAML::Node& o, const char* key) { return o && o.IsMap() && o[key]; }

// fraction/count of topk and randomk: exclusive in YAML; count > 0 wins in the struct.
template <class Options>
void read_k(const YAML::Node& o, const char* who, Options& p) {
  if (has(o, "fraction") && has(o, "count")) {
    throw std::invalid_argument(fmt::format("{}: options 'fraction' and 'count' exclude each other; give one", who));
  }
  p.fraction = option<double>(o, who, "fraction", p.fraction, "a number");
  p.count = option<int64_t>(o, who, "count", p.count, "an integer");
}

template <class Options>
void validate_k(const Options& p, const char* who) {
  require(p.fraction > 0 && p.fraction <= 1, who, "fraction", p.fraction, "in (0, 1]");
  require(p.count >= 0, who, "count", p.count, ">= 0 (0: use fraction)");
  require(p.min_numel >= 0, who, "min_numel", p.min_numel, ">= 0");
}

inline int64_t k_of(double fraction, int64_t count, int64_t numel) {
  if (count > 0) return std::min(count, numel);
  return std::clamp<int64_t>(std::llround(fraction * static_cast<double>(numel)), 1, std::max<int64_t>(numel, 1));
}

// ---- randomness: counter-based seeds, identical wherever the same triple is used ---------------

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A 64-bit key for (a, b, c): seeds a generator or a counter-based stream (raw_loops.h).
inline uint64_t stream_key(uint64_t a, int64_t b, uint64_t c) {
  return splitmix64(splitmix64(splitmix64(a) ^ static_cast<uint64_t>(b)) ^ c);
}

// A fresh CPU generator for (a, b, c). mt19937 keeps 32 bits of the seed, so two triples share a
// stream with probability 2^-32: harmless for sampling.
inline at::Generator generator_for(uint64_t a, int64_t b, uint64_t c) {
  return at::make_generator<at::CPUGeneratorImpl>(stream_key(a, b, c));
}

// ---- messages -----------------------------------------------------------------------------------

// A collective's input on the gradients' device (a no-op on the CPU) and its result back on the
// CPU, contiguous, for the raw loops.
inline torch::Tensor to_device(const torch::Tensor& host, const torch::Device& device) { return host.to(device); }
inline torch::Tensor to_host(const torch::Tensor& t) { return t.to(torch::kCPU).contiguous(); }

// kernels::select_topk as tensor operations, on any device and with no host synchronisation: the
// indices (int64, increasing) of the k largest |x| of a flat fp32 tensor, ties to the smallest
// indices, every NaN above +inf. The k largest keys |x|'s bits · 2³² + (2³² − 1 − index): a
// non-negative float's bits order as the float, and the index part breaks ties. The topk codec's
// and reducer's tensor forms (codecs.cpp, topk_reducer.cpp) both select through here.
inline torch::Tensor select_topk_tensor(const torch::Tensor& flat, int64_t k) {
  const auto mag = torch::where(flat.isnan(), torch::full_like(flat, std::numeric_limits<float>::quiet_NaN()),
                                flat.abs()).view(torch::kInt).to(torch::kLong);
  const auto index = torch::arange(flat.numel(), flat.options().dtype(torch::kLong));
  const auto key = mag * (int64_t{1} << 32) + ((int64_t{1} << 32) - 1 - index);
  return std::get<0>(torch::sort(std::get<1>(torch::topk(key, k, 0, /*largest=*/true, /*sorted=*/false))));
}

// y ÷ d as a true division on every device (a scalar divisor may become a multiplication by 1/d,
// which rounds differently from kernels::divide unless d is a power of two).
inline void divide_tensor(torch::Tensor& y, int64_t d) {
  y.div_(torch::full({1}, static_cast<float>(d), y.options()));
}

// fp32 values at byte offset `at` of a message (memcpy: offsets need not be aligned).
inline float float_at(const uint8_t* bytes, int64_t at) {
  float f;
  std::memcpy(&f, bytes + at, 4);
  return f;
}

}  // namespace optcc::elementwise

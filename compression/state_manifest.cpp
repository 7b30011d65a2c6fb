#include "compression/state_manifest.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sstream>

namespace optcc {

std::string describe_shape(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string describe(const TensorSpec& t) { return fmt::format("'{}' {}", t.name, describe_shape(t.shape)); }

std::string first_difference(const std::vector<TensorSpec>& saved, const std::vector<TensorSpec>& now, bool names,
                             ListNames where) {
  const size_t n = std::max(saved.size(), now.size());
  for (size_t i = 0; i < n; ++i) {
    const bool in_saved = i < saved.size(), in_now = i < now.size();
    if (in_saved && in_now && saved[i].shape == now[i].shape && (!names || saved[i].name == now[i].name)) continue;
    const std::string a = in_saved ? describe(saved[i]) : fmt::format("none ({} tensors)", saved.size());
    const std::string b = !in_now ? fmt::format("none ({} tensors)", now.size())
                                  : names ? describe(now[i]) : describe_shape(now[i].shape);
    return fmt::format("tensor {}: {} {}, {} {}", i, a, where.saved, b, where.now);
  }
  return "";
}

void write_tensor_specs(torch::serialize::OutputArchive& archive, const std::string& key,
                        const std::vector<TensorSpec>& specs) {
  std::string names;
  std::vector<int64_t> shapes;
  for (size_t i = 0; i < specs.size(); ++i) {
    names += (i ? "\n" : "") + specs[i].name;
    shapes.push_back(static_cast<int64_t>(specs[i].shape.size()));
    shapes.insert(shapes.end(), specs[i].shape.begin(), specs[i].shape.end());
  }
  archive.write(key + ".names", c10::IValue(names));
  archive.write(key + ".shapes", torch::tensor(shapes, torch::kLong));
}

std::optional<std::vector<TensorSpec>> read_tensor_specs(torch::serialize::InputArchive& archive,
                                                         const std::string& key) {
  c10::IValue names;
  torch::Tensor shapes;
  if (!archive.try_read(key + ".names", names) || !archive.try_read(key + ".shapes", shapes)) return std::nullopt;
  std::vector<TensorSpec> specs;
  const auto flat = shapes.to(torch::kLong).contiguous();
  const int64_t* p = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel();) {
    const int64_t ndim = p[i++];
    if (ndim < 0 || i + ndim > flat.numel()) throw std::invalid_argument("compressor state: corrupt '" + key + "' shapes");
    specs.push_back({"", std::vector<int64_t>(p + i, p + i + ndim)});
    i += ndim;
  }
  std::istringstream in(names.toStringRef());
  std::string name;
  size_t k = 0;
  while (!specs.empty() && std::getline(in, name)) {
    if (k < specs.size()) specs[k].name = name;
    ++k;
  }
  if (k != specs.size()) {
    throw std::invalid_argument(fmt::format("compressor state: '{}' lists {} names for {} shapes", key, k, specs.size()));
  }
  return specs;
}

}  // namespace optcc

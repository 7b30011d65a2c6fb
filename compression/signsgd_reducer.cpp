#include "compression/signsgd_reducer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "compression/elementwise_detail.h"
#include "compression/raw_loops.h"

namespace optcc {
using namespace elementwise;  // elementwise_detail.h

// ---- signsgd ------------------------------------------------------------------------------------

SignSgdOptions SignSgdOptions::from_yaml(const YAML::Node& o) {
  check_option_keys(o, "signsgd", {"error_feedback", "min_numel"});
  SignSgdOptions p;
  p.error_feedback = option<bool>(o, "signsgd", "error_feedback", p.error_feedback, "a bool");
  p.min_numel = option<int64_t>(o, "signsgd", "min_numel", p.min_numel, "an integer");
  require(p.min_numel >= 0, "signsgd", "min_numel", p.min_numel, ">= 0");
  return p;
}

SignSgdReducer::SignSgdReducer(SignSgdOptions options)
    : ElementwiseReducer("signsgd", options.error_feedback, options.min_numel), opt_(options) {
  require(opt_.min_numel >= 0, "signsgd", "min_numel", opt_.min_numel, ">= 0");
}

std::string SignSgdReducer::name() const {
  return fmt::format("signsgd(error_feedback={}, min_numel={})", opt_.error_feedback, opt_.min_numel);
}

void SignSgdReducer::exchange_tensors(std::vector<Item>& items, Communicator& dp) {
  const int64_t t = static_cast<int64_t>(items.size());
  const auto bytes = items[0].c.options().dtype(torch::kByte);
  const auto weights = torch::tensor({1, 2, 4, 8, 16, 32, 64, 128}, items[0].c.options().dtype(torch::kInt));
  std::vector<torch::Tensor> scales, signs;
  std::vector<int64_t> offs;
  int64_t bits_total = 0;
  for (auto& it : items) {
    const int64_t n = it.c.numel();
    auto a = it.c.abs().sum(torch::kDouble).to(torch::kFloat).reshape({1});
    elementwise::divide_tensor(a, n);  // ‖c‖₁ / N
    auto bit = (it.c >= 0).to(torch::kInt);  // sign(0) = +1
    if (n % 8) bit = torch::cat({bit, torch::zeros({8 - n % 8}, bit.options())});
    signs.push_back((bit.view({-1, 8}) * weights).sum(1).to(torch::kByte));  // bit t of byte j: element 8j + t
    offs.push_back(bits_total), bits_total += (n + 7) / 8;
    if (error_feedback_) it.c.sub_(torch::where(it.c >= 0, a, -a));  // c − own
    scales.push_back(a);
  }
  // [4·T bytes of fp32 scales | Σ⌈N/8⌉ sign bytes] uint8, as the raw loops' message
  signs.insert(signs.begin(), torch::cat(scales).view(torch::kByte));
  const int64_t x = 4 * t + bits_total;
  const auto all = dp.all_gather(torch::cat(signs), traffic_class(), 0);  // [n·x] uint8, on the device
  const auto shifts = torch::arange(8, bytes);
  for (int64_t j = 0; j < t; ++j) {
    auto& out = items[j].out;
    const int64_t n = out.numel();
    out.zero_();
    for (int r = 0; r < dp.size(); ++r) {  // rank order
      const auto part = all.narrow(0, r * x, x);
      const auto a = part.narrow(0, 4 * j, 4).clone().view(torch::kFloat);  // (cloned: aligned)
      const auto packed = part.narrow(0, 4 * t + offs[j], (n + 7) / 8);
      const auto bit = torch::bitwise_and(packed.unsqueeze(1).__rshift__(shifts), 1).reshape({-1}).narrow(0, 0, n);
      out.add_(torch::where(bit.to(torch::kBool), a, -a));
    }
    if (dp.size() > 1) elementwise::divide_tensor(out, dp.size());
  }
}

void SignSgdReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  if (items[0].tensors) return exchange_tensors(items, dp);
  const int64_t t = static_cast<int64_t>(items.size());
  std::vector<int64_t> offs;
  int64_t bits_total = 0;
  for (const auto& it : items) {
    offs.push_back(bits_total);
    bits_total += (it.c.numel() + 7) / 8;
  }
  // [4·T bytes of fp32 scales | Σ⌈N/8⌉ sign bytes] uint8: one all-gather for every tensor.
  const int64_t x = 4 * t + bits_total;
  auto msg = torch::empty({x}, torch::kByte);
  uint8_t* pm = msg.data_ptr<uint8_t>();
  std::vector<float> scales(static_cast<size_t>(t));
  for (int64_t j = 0; j < t; ++j) {
    float* c = items[j].c.data_ptr<float>();
    const int64_t n = items[j].c.numel();
    scales[j] = static_cast<float>(kernels::sum_abs(c, n)) / static_cast<float>(n);  // ‖c‖₁ / N
    kernels::pack_signs(c, n, pm + 4 * t + offs[j]);                                 // sign(0) = +1
    if (error_feedback_) kernels::subtract_scaled_sign(c, n, scales[j]);             // c − own
  }
  std::memcpy(pm, scales.data(), 4 * scales.size());
  const auto all = to_host(dp.all_gather(to_device(msg, items[0].device), traffic_class(), 0));  // [n·x] uint8
  const uint8_t* pa = all.data_ptr<uint8_t>();
  for (int64_t j = 0; j < t; ++j) {
    const int64_t n = items[j].out.numel();
    float* out = items[j].out.data_ptr<float>();
    std::fill(out, out + n, 0.0f);
    for (int r = 0; r < dp.size(); ++r) {  // rank order
      const uint8_t* part = pa + r * x;
      kernels::add_signed(part + 4 * t + offs[j], n, float_at(part, 4 * j), out);
    }
    if (dp.size() > 1) kernels::divide(out, n, static_cast<float>(dp.size()));  // ÷ 1 is the identity
  }
}

}  // namespace optcc

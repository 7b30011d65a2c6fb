#include "compression/signsgd_reducer.h"

#include <fmt/format.h>

#include "compression/elementwise_detail.h"

namespace optcc {
using namespace elementwise;  // elementwise_detail.h

namespace {

// ---- bit packing --------------------------------------------------------------------------------

torch::Tensor bit_weights(torch::Device dev) {  // [8] uint8: 1, 2, ..., 128
  return torch::tensor({1, 2, 4, 8, 16, 32, 64, 128}, torch::dtype(torch::kByte).device(dev));
}

// bool [N] -> uint8 [⌈N/8⌉], entry j in bit j%8 of byte j/8.
torch::Tensor pack_bits(const torch::Tensor& bits) {
  const int64_t n = bits.numel(), nbytes = (n + 7) / 8;
  auto padded = torch::constant_pad_nd(bits.to(torch::kByte), {0, nbytes * 8 - n}).view({nbytes, 8});
  return padded.mul(bit_weights(bits.device())).sum(1, false, torch::kByte);
}

// uint8 [⌈N/8⌉] -> fp32 [N] of ±1 (set bit: +1).
torch::Tensor unpack_signs(const torch::Tensor& packed, int64_t n) {
  auto bits = packed.unsqueeze(1).bitwise_and(bit_weights(packed.device())).ne(0).view({-1}).narrow(0, 0, n);
  return bits.to(torch::kFloat).mul_(2).sub_(1);
}

}  // namespace

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

void SignSgdReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  const int64_t t = static_cast<int64_t>(items.size());
  std::vector<int64_t> offs;
  int64_t bits_total = 0;
  for (const auto& it : items) {
    offs.push_back(bits_total);
    bits_total += (it.c.numel() + 7) / 8;
  }
  // [4·T bytes of fp32 scales | Σ⌈N/8⌉ sign bytes] uint8: one all-gather for every tensor.
  const int64_t x = 4 * t + bits_total;
  auto msg = torch::empty({x}, items[0].c.options().dtype(torch::kByte));
  auto scales = torch::empty({t}, items[0].c.options());  // [T] fp32
  for (int64_t j = 0; j < t; ++j) {
    auto& it = items[j];
    const int64_t n = it.c.numel();
    auto scale = scales.narrow(0, j, 1);
    scale.copy_(it.c.abs().sum().div(static_cast<double>(n)).reshape({1}));  // ‖c‖₁ / N
    auto packed = pack_bits(it.c.ge(0));                                       // sign(0) = +1
    msg.narrow(0, 4 * t + offs[j], packed.numel()).copy_(packed);
    it.own = unpack_signs(packed, n).mul_(scale);
  }
  msg.narrow(0, 0, 4 * t).copy_(scales.view(torch::kByte));
  auto all = dp.all_gather(msg, traffic_class(), 0);  // [n·x] uint8, rank order
  for (int64_t j = 0; j < t; ++j) {
    auto& it = items[j];
    const int64_t n = it.c.numel();
    it.out = torch::zeros_like(it.c);
    for (int r = 0; r < dp.size(); ++r) {
      auto part = all.narrow(0, r * x, x);
      auto scale_r = floats_at(part, 4 * j, 1);
      it.out.add_(unpack_signs(part.narrow(0, 4 * t + offs[j], (n + 7) / 8), n).mul_(scale_r));
    }
    it.out.div_(dp.size());
  }
}

}  // namespace optcc

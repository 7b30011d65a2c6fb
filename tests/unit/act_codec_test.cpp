// Point-to-point activation codecs (compression/act_codec.h, codecs.h): closed-form expectations,
// no communication.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <sstream>

#include "compression/act_codec.h"
#include "compression/codecs.h"
#include "compression/raw_loops.h"

namespace optcc {
namespace {

YAML::Node opts(const std::string& yaml) { return YAML::Load(yaml); }

torch::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randn(shape, gen, torch::kFloat);
}

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

// Encodes x, decodes the payload as a receiver would (a fresh codec), and checks LEP's invariant
// decode + last_error == x.
torch::Tensor round_trip(ActCodec& sender, const ActCodec& receiver, const torch::Tensor& x) {
  const Payload p = sender.encode(x);
  const auto y = receiver.decode(p, x.numel());
  EXPECT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(y.scalar_type(), torch::kFloat);
  EXPECT_LE(max_abs(y + sender.last_error() - x), 1e-6 * std::max(1.0, max_abs(x)));
  return y;
}

TEST(ActCodec, NoneIsExactAndSendsTheTensor) {
  auto codec = make_act_codec("none", YAML::Node());
  const auto x = randn({1000}, 1);
  const auto y = round_trip(*codec, *make_act_codec("none", YAML::Node()), x);
  EXPECT_TRUE(torch::equal(y, x));  // 0 ULP
  EXPECT_EQ(max_abs(codec->last_error()), 0.0);
  EXPECT_EQ(codec->payload_bytes(1000), 4000);
  EXPECT_EQ(codec->name(), "none");
}

TEST(ActCodec, HalfPrecisionCastsWithinHalfAnUlp) {
  const auto x = randn({4096}, 2);
  using Case = std::tuple<std::string, double, int64_t>;
  for (const auto& [name, rel, bytes] : {Case{"fp16", 1.0 / 2048, 2}, Case{"bf16", 1.0 / 256, 2}}) {
    auto codec = make_act_codec(name, YAML::Node());
    const auto y = round_trip(*codec, *codec, x);
    // Round-to-nearest: |y − x| ≤ 2^-(mantissa bits + 1)·|x| for normal values (all of these).
    const auto excess = (y - x).abs() - rel * x.abs();
    EXPECT_LE(excess.max().item<double>(), 1e-7) << name;  // slack: fp16 subnormals
    EXPECT_GT(max_abs(y - x), 0.0) << name;  // really a cast
    EXPECT_EQ(codec->payload_bytes(4096), bytes * 4096) << name;
    EXPECT_EQ(codec->wire_dtypes(4096), std::vector<torch::ScalarType>{codec->wire_dtype()});
  }
}

// --- lowrank ------------------------------------------------------------------------------------

// One power step from a random Q reproduces a matrix of rank k ≤ r exactly (to fp32 rounding):
// P = A·(BᵀQ) spans col(A) because BᵀQ (k×r) has rank k with probability 1, so P̂P̂ᵀM = M. With
// r > k the extra columns of P are rounding noise; MGS's second pass drops them (zero columns of
// P̂), where the reference's single pass normalised them into non-orthogonal vectors (0.67
// relative max error for the r = 8 case below).
TEST(LowRankCodec, ReproducesAMatrixOfRankAtMostRAfterOneEncode) {
  const auto a = randn({64, 4}, 4), b = randn({48, 4}, 5);
  const auto x = a.mm(b.t()).view({-1});  // rank 4, [64*48]
  for (const char* o : {"{rank: 4, hidden: 48}", "{rank: 8, hidden: 48}", "{rank: 8, hidden: 48, orthogonalize: qr}"}) {
    auto codec = make_act_codec("lowrank", opts(o));
    const auto y = round_trip(*codec, *codec, x);
    EXPECT_LE(max_abs(y - x) / max_abs(x), 1e-5) << o;
  }
  // Lower rank keeps the best-ish part only.
  auto r2 = make_act_codec("lowrank", opts("{rank: 2, hidden: 48}"));
  EXPECT_GT(max_abs(round_trip(*r2, *r2, x) - x) / max_abs(x), 1e-3);
}

// The case: a constant (rank-1) message of 16 tokens × 48, rank 4, default MGS. P̂ must
// be one unit column and three zero columns; the message comes back exactly (it was 0.54 max
// error on 0.375: the rounding residue of P's dependent columns became unit directions). Also on
// a codec that sent a message before (warm-started Q), and for other token counts.
TEST(LowRankCodec, ConstantMessageGivesOneDirectionAndZeroColumns) {
  for (int64_t rows : {16, 5, 100, 512}) {
    for (bool warm : {false, true}) {
      const auto x = torch::full({rows * 48}, 0.375f);
      auto codec = make_act_codec("lowrank", opts("{rank: 4, hidden: 48}"));
      if (warm) codec->encode(randn({rows * 48}, 3));
      const Payload p = codec->encode(x);
      const auto norms = p.parts[0].norm(2, {0});  // [4]
      EXPECT_NEAR(norms[0].item<double>(), 1.0, 1e-6) << rows << " warm " << warm;
      EXPECT_TRUE(torch::equal(norms.narrow(0, 1, 3), torch::zeros({3}))) << rows << " warm " << warm << " " << norms;
      EXPECT_LE(max_abs(codec->decode(p, x.numel()) - x), 1e-6) << rows << " warm " << warm;
    }
  }
}

// A zero column of the warm-start Q would stay zero for ever (P = M·Q has it too, so the next
// Q = MᵀP̂ as well): after a zero message the codec would send nothing, and after a rank-1 one only
// one direction, whatever came next. The refill makes the next message come back exactly again.
TEST(LowRankCodec, WarmStartRecoversAfterZeroAndRankDeficientMessages) {
  const auto rank3 = randn({64, 3}, 20).mm(randn({3, 48}, 21)).view({-1});
  for (const char* method : {"mgs", "qr"}) {
    auto codec = make_act_codec("lowrank", opts(std::string("{rank: 4, hidden: 48, orthogonalize: ") + method + "}"));
    for (const auto& before : {torch::zeros({64 * 48}), torch::full({64 * 48}, -2.0f)}) {
      const auto y0 = round_trip(*codec, *codec, before);
      EXPECT_LE(max_abs(y0 - before), 1e-5) << method;
      const auto y = round_trip(*codec, *codec, rank3);
      EXPECT_LE(max_abs(y - rank3) / max_abs(rank3), 1e-5) << method << " after " << max_abs(before);
    }
  }
}

TEST(LowRankCodec, ShapesAndBytesMatchSpecTable) {
  // docs/design.md §2.6 (b=8, s=1024, t=8, r=16): per-TP-rank slice = 1024 × h.
  using Row = std::pair<int64_t, int64_t>;  // h, P̂+Q bytes
  for (const auto& [h, bytes] : {Row{1024, 131072}, Row{1920, 188416}, Row{3072, 262144}}) {
    auto tm = make_act_codec("lowrank", opts("{hidden: " + std::to_string(h) + "}"));
    auto ref = make_act_codec("lowrank", opts("{view: reference, seq_len: 1024, micro_batch: 8}"));
    const int64_t numel = 1024LL * h;
    EXPECT_EQ(tm->payload_bytes(numel), bytes) << h;
    EXPECT_EQ(ref->payload_bytes(numel), bytes) << h;  // b = t = 8: both views agree
    EXPECT_EQ(tm->wire_shapes(numel), (std::vector<std::vector<int64_t>>{{1024, 16}, {h, 16}}));
  }
  // t = 2 (functionality checks): reference rows are 4 tokens concatenated, n = 1024, m' = 4h.
  auto ref = make_act_codec("lowrank", opts("{view: reference, seq_len: 1024, micro_batch: 8}"));
  EXPECT_EQ(ref->wire_shapes(1024LL * 4 * 1920),
            (std::vector<std::vector<int64_t>>{{1024, 16}, {4 * 1920, 16}}));
  // r = min(rank, rows, cols).
  auto tiny = make_act_codec("lowrank", opts("{rank: 16, hidden: 8}"));
  EXPECT_EQ(tiny->wire_shapes(3 * 8), (std::vector<std::vector<int64_t>>{{3, 3}, {8, 3}}));
  EXPECT_THROW(tiny->wire_shapes(20), std::invalid_argument);
}

TEST(LowRankCodec, WarmStartIsDeterministicGivenTheSeed) {
  const auto x1 = randn({32 * 24}, 6), x2 = randn({32 * 24}, 7);
  LowRankCodec a({MatrixView::Kind::kTokenMajor, 24}, 4, 714);
  LowRankCodec b({MatrixView::Kind::kTokenMajor, 24}, 4, 714);
  LowRankCodec c({MatrixView::Kind::kTokenMajor, 24}, 4, 715);
  const auto pa = a.encode(x1), pb = b.encode(x1), pc = c.encode(x1);
  EXPECT_TRUE(torch::equal(pa.parts[0], pb.parts[0]));
  EXPECT_TRUE(torch::equal(a.q(), b.q()));
  EXPECT_FALSE(torch::equal(pa.parts[0], pc.parts[0]));  // another seed, another start
  const auto q1 = a.q().clone();
  a.encode(x2);
  b.encode(x2);
  EXPECT_FALSE(torch::equal(a.q(), q1));  // Q moves with every message
  EXPECT_TRUE(torch::equal(a.q(), b.q()));
  EXPECT_TRUE(torch::equal(pa.parts[1], q1));  // an earlier payload is not touched by later encodes
}

TEST(LowRankCodec, WarmStartIsAPowerIterationOnARepeatedMessage) {
  // Spectrum with a gap: repeated encodes of the same x converge towards the best rank-4 error.
  auto u = randn({64, 64}, 8), v = randn({48, 48}, 9);
  u = std::get<0>(torch::linalg_qr(u)), v = std::get<0>(torch::linalg_qr(v));
  auto s = torch::zeros({48});
  s.narrow(0, 0, 4).fill_(10.0);
  s.narrow(0, 4, 44).fill_(1.0);
  const auto x = (u.narrow(1, 0, 48) * s).mm(v.t()).view({-1});
  auto codec = make_act_codec("lowrank", opts("{rank: 4, hidden: 48}"));
  codec->encode(x);
  const double first = codec->last_error().norm().item<double>();
  EXPECT_LT(first, x.norm().item<double>());
  for (int i = 0; i < 5; ++i) codec->encode(x);
  const double later = codec->last_error().norm().item<double>();
  EXPECT_LT(later, first);
  EXPECT_NEAR(later, std::sqrt(44.0), 1e-3);  // Eckart–Young: √(Σ tail σ²)
}

TEST(LowRankCodec, SaveLoadGivesABitIdenticalNextEncode) {
  const auto x1 = randn({16 * 12}, 10), x2 = randn({16 * 12}, 11);
  for (bool before_first : {true, false}) {
    auto a = make_act_codec("lowrank", opts("{rank: 3, hidden: 12, seed: 99}"));
    if (!before_first) a->encode(x1);
    torch::serialize::OutputArchive out;
    a->save(out);
    std::stringstream buffer;
    out.save_to(buffer);
    auto b = make_act_codec("lowrank", opts("{rank: 3, hidden: 12, seed: 99}"));
    torch::serialize::InputArchive in;
    in.load_from(buffer);
    b->load(in);
    const auto pa = a->encode(x2), pb = b->encode(x2);
    EXPECT_TRUE(torch::equal(pa.parts[0], pb.parts[0])) << before_first;
    EXPECT_TRUE(torch::equal(pa.parts[1], pb.parts[1])) << before_first;
  }
}

// --- int8 / int4 --------------------------------------------------------------------------------

using Level = std::pair<std::string, int64_t>;  // codec, quantisation levels

TEST(QuantCodec, ErrorAtMostHalfAStepPerElement) {
  const auto x = randn({6 * 10}, 12) * torch::arange(1, 61).to(torch::kFloat) / 10;
  for (const auto& [name, levels] : {Level{"int8", 255}, Level{"int4", 15}}) {
    auto codec = make_act_codec(name, opts("{hidden: 10}"));
    const auto y = round_trip(*codec, *codec, x);
    const auto m = x.view({6, 10});
    const auto step = (std::get<0>(m.max(1, true)) - std::get<0>(m.min(1, true))) / levels;
    const auto excess = (y - x).view({6, 10}).abs() - step / 2;
    EXPECT_LE(excess.max().item<double>(), 1e-5) << name;
    EXPECT_GT(max_abs(y - x), 0.0) << name;
  }
}

TEST(QuantCodec, ExactOnTheGridAndPacksTwoInt4PerByte) {
  // Row i: min_i + k·2^-3 with max − min = levels·2^-3, so every value is on the row's grid.
  for (const auto& [name, levels] : {Level{"int8", 255}, Level{"int4", 15}}) {
    const int64_t rows = 3, hidden = 5;  // odd numel: int4 pads its last byte
    auto k = torch::randint(0, levels + 1, {rows, hidden}, torch::kFloat);
    k.select(1, 0).fill_(0);
    k.select(1, 1).fill_(levels);
    const auto x = (torch::tensor({-2.0f, 0.5f, 7.0f}).unsqueeze(1) + k * 0.125f).view({-1});
    auto codec = make_act_codec(name, opts("{hidden: 5}"));
    const auto y = round_trip(*codec, *make_act_codec(name, opts("{hidden: 5}")), x);
    EXPECT_TRUE(torch::equal(y, x)) << name;
    const int64_t q_bytes = name == "int8" ? 15 : 8;
    EXPECT_EQ(codec->payload_bytes(15), q_bytes + rows * 2 * 4) << name;
  }
  // A constant row (scale 0) decodes to itself.
  auto codec = make_act_codec("int4", opts("{hidden: 4}"));
  const auto c = torch::full({8}, 3.25f);
  EXPECT_TRUE(torch::equal(round_trip(*codec, *codec, c), c));
  EXPECT_THROW(codec->encode(torch::zeros({6})), std::invalid_argument);  // 6 % 4 != 0
}

// --- hadamard -----------------------------------------------------------------------------------

// The rotation: H/√n applied to the unit vector e_k is column k of H over √n, entries
// (−1)^popcount(i & k)/√n (Sylvester order); applied twice it is the identity; it keeps ‖x‖.
TEST(HadamardCodec, RotationIsTheNormalisedWalshHadamardMatrixAndItsOwnInverse) {
  for (const int64_t n : {1, 2, 8, 64, 1024}) {
    for (const int64_t k : {int64_t(0), n / 2, n - 1}) {
      std::vector<float> e(n, 0.0f);
      e[k] = 1.0f;
      kernels::hadamard_transform(e.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double want = (__builtin_popcountll(static_cast<unsigned long long>(i & k)) % 2 ? -1.0 : 1.0) /
                            std::sqrt(double(n));
        ASSERT_NEAR(e[i], want, 1e-7) << "n " << n << " k " << k << " i " << i;
      }
    }
    auto x = randn({n}, 60 + n);
    const auto x0 = x.clone();
    kernels::hadamard_transform(x.data_ptr<float>(), n);
    EXPECT_NEAR(x.norm().item<double>(), x0.norm().item<double>(), 1e-5 * x0.norm().item<double>()) << n;
    kernels::hadamard_transform(x.data_ptr<float>(), n);
    EXPECT_LE(max_abs(x - x0), 1e-6 * std::max(1.0, max_abs(x0))) << n;
  }
}

// pack_bits: code i in bits [i·bits, (i+1)·bits) of a little-endian stream; unpack_bits inverts it.
TEST(HadamardCodec, BitPackingLaysCodesOutLeastSignificantBitFirst) {
  const std::vector<uint8_t> codes = {1, 2, 3, 4, 5, 6, 7, 0};
  std::vector<uint8_t> out(3, 0xff);
  kernels::pack_bits(codes.data(), 8, 3, out.data());
  EXPECT_EQ(out, (std::vector<uint8_t>{209, 88, 31}));  // 0b11'010'001, ...: worked by hand
  std::vector<uint8_t> odd(2, 0xff);
  kernels::pack_bits(std::vector<uint8_t>{5, 3, 7}.data(), 3, 3, odd.data());
  EXPECT_EQ(odd, (std::vector<uint8_t>{221, 1}));  // 9 bits: the last byte's high 7 bits are 0
  for (const int bits : {3, 4, 8}) {
    for (const int64_t n : {1, 7, 8, 13, 64, 1001}) {
      std::vector<uint8_t> q(n), back(n, 0xff), packed((n * bits + 7) / 8);
      for (int64_t i = 0; i < n; ++i) q[i] = static_cast<uint8_t>((i * 37 + 11) % (1 << bits));
      kernels::pack_bits(q.data(), n, bits, packed.data());
      kernels::unpack_bits(packed.data(), n, bits, back.data());
      EXPECT_EQ(back, q) << bits << " bits, n " << n;
    }
  }
}

// hadamard_encode_tiles / hadamard_decode_tiles (AVX2 registers here) and their portable form (16 tiles
// per transposed block) give, bit for bit, what the per-tile loops give: rotation, min_max, quant_grid, quantize, pack_bits, and back. Tile counts
// around the block of 16, constant and zero tiles, spikes, and a tile holding inf and NaN.
TEST(HadamardCodec, BlockedKernelsEqualThePerTileLoopsBitForBit) {
  for (const int bits : {3, 4, 8}) {
    for (const int64_t tile : {8, 64, 256}) {
      for (const int64_t tiles : {1, 15, 16, 17, 40}) {
        SCOPED_TRACE(fmt::format("bits {} tile {} tiles {}", bits, tile, tiles));
        auto x = randn({tiles * tile}, 62 + tiles) * 3.0f;
        float* px = x.data_ptr<float>();
        if (tiles > 2) {
          std::fill(px + tile, px + 2 * tile, 1.5f);  // a constant tile
          std::fill(px + 2 * tile, px + 3 * tile, 0.0f);  // a zero tile
          px[tile / 2] = 1e6f;  // a spike
        }
        if (tiles > 16) px[16 * tile + 3] = std::numeric_limits<float>::infinity(), px[16 * tile + 5] = NAN;
        const int64_t row_bytes = tile * bits / 8;
        const float levels = static_cast<float>((1 << bits) - 1);
        std::vector<uint8_t> want_codes(tiles * row_bytes), codes(tiles * row_bytes, 0xaa), q(tile);
        std::vector<float> want_meta(2 * tiles), meta(2 * tiles, -1.0f), y(tile);
        for (int64_t i = 0; i < tiles; ++i) {
          std::copy(px + i * tile, px + (i + 1) * tile, y.begin());
          kernels::hadamard_transform(y.data(), tile);
          float lo, hi;
          kernels::min_max(y.data(), tile, &lo, &hi);
          const kernels::QuantGrid g = kernels::quant_grid(lo, hi, levels);
          want_meta[2 * i] = g.scale, want_meta[2 * i + 1] = g.offset;
          kernels::quantize(y.data(), tile, g.offset, 1.0f / g.safe, levels, q.data());
          kernels::pack_bits(q.data(), tile, bits, want_codes.data() + i * row_bytes);
        }
        kernels::hadamard_encode_tiles(px, tiles, tile, bits, codes.data(), meta.data());
        EXPECT_EQ(codes, want_codes);
        EXPECT_EQ(0, std::memcmp(meta.data(), want_meta.data(), meta.size() * 4));  // NaN-proof: the bits
        std::vector<uint8_t> codes2(codes.size(), 0x55);  // the portable path (the one without AVX2)
        std::vector<float> meta2(meta.size(), -2.0f);
        kernels::hadamard_encode_blocked(px, tiles, tile, bits, codes2.data(), meta2.data());
        EXPECT_EQ(codes2, want_codes);
        EXPECT_EQ(0, std::memcmp(meta2.data(), want_meta.data(), meta.size() * 4));
        std::vector<float> want_y(tiles * tile), back(tiles * tile, -7.0f);
        for (int64_t i = 0; i < tiles; ++i) {
          kernels::unpack_bits(want_codes.data() + i * row_bytes, tile, bits, q.data());
          kernels::dequantize(q.data(), tile, want_meta[2 * i], want_meta[2 * i + 1], want_y.data() + i * tile);
          kernels::hadamard_transform(want_y.data() + i * tile, tile);
        }
        kernels::hadamard_decode_tiles(codes.data(), meta.data(), tiles, tile, bits, back.data());
        EXPECT_EQ(0, std::memcmp(back.data(), want_y.data(), back.size() * 4));
        std::fill(back.begin(), back.end(), -7.0f);
        kernels::hadamard_decode_blocked(codes.data(), meta.data(), tiles, tile, bits, back.data());
        EXPECT_EQ(0, std::memcmp(back.data(), want_y.data(), back.size() * 4));
      }
    }
  }
}

// The ATen form (what a GPU tensor runs) on CPU tensors: the same payload bytes and the same decoded
// floats as the CPU loops, bit for bit, including rows that are constant, zero, hold a spike, −0, ±inf
// or NaN, an odd hidden (int4 nibbles across rows), and top-k ties (the constant row) and NaN.
TEST(CodecAtenForm, EqualsTheCpuLoopsBitForBit) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"int8", "{hidden: 48}"}, {"int4", "{hidden: 48}"}, {"int4", "{hidden: 7}"}, {"int8", "{hidden: 7}"},
      {"hadamard", "{hidden: 48, tile: 16, bits: 3}"}, {"hadamard", "{hidden: 48, tile: 16, bits: 4}"},
      {"hadamard", "{hidden: 48, tile: 8, bits: 8}"}, {"hadamard", "{hidden: 128, tile: 64, bits: 4}"},
      {"topk", "{fraction: 0.1}"}, {"topk", "{count: 30}"}};  // 30: the threshold falls inside the tied row
  for (const auto& [name, o] : cases) {
    SCOPED_TRACE(name + " " + o);
    const auto yaml = YAML::Load(o);
    const int64_t hidden = yaml["hidden"] ? yaml["hidden"].as<int64_t>() : 48, rows = 9;
    auto x = randn({rows, hidden}, 63) * 2.0f;
    x[1].fill_(5.0f);  // constant, and for topk 48 ties above nearly every random value
    x[2].zero_();                                      // zero
    x[3][hidden / 2] = 3e5f;                           // a spike
    x[4][0] = -0.0f;
    x[5][1] = std::numeric_limits<float>::infinity();  // inf and NaN in later rows
    x[6][2] = -std::numeric_limits<float>::infinity();
    x[7][hidden - 1] = NAN;
    x = x.reshape({-1});
    auto codec = make_act_codec(name, opts(o));
    const Payload loops = codec->encode(x);
    Payload aten;
    torch::Tensor from_loops = torch::empty({x.numel()}), from_aten = torch::full({x.numel()}, -5.0f);
    codec->decode_into(loops, x.numel(), from_loops);
    if (auto* q = dynamic_cast<QuantCodec*>(codec.get())) {
      aten = q->encode_aten(x);
      q->decode_aten(loops, from_aten);
    } else if (auto* t = dynamic_cast<TopKCodec*>(codec.get())) {
      aten = t->encode_aten(x);
      t->decode_aten(loops, from_aten);
    } else {
      auto* h = dynamic_cast<HadamardCodec*>(codec.get());
      ASSERT_NE(h, nullptr);
      aten = h->encode_aten(x);
      h->decode_aten(loops, from_aten);
    }
    ASSERT_EQ(aten.parts.size(), loops.parts.size());
    for (size_t i = 0; i < loops.parts.size(); ++i) {
      ASSERT_EQ(aten.parts[i].sizes(), loops.parts[i].sizes()) << "part " << i;
      ASSERT_EQ(aten.parts[i].scalar_type(), loops.parts[i].scalar_type()) << "part " << i;
      const auto a = aten.parts[i].contiguous(), b = loops.parts[i].contiguous();
      EXPECT_EQ(0, std::memcmp(a.data_ptr(), b.data_ptr(), b.numel() * b.element_size())) << "part " << i;
    }
    // Decoded floats: the same bits, or both NaN (a NaN's sign bit depends on the order of a product's
    // operands, which is the library's; the payload above, integers and the tiles' fp32 grid, is exact).
    const auto diff = torch::nonzero(torch::logical_and(from_aten.view(torch::kInt) != from_loops.view(torch::kInt),
                                                        torch::logical_not(torch::logical_and(from_aten.isnan(),
                                                                                              from_loops.isnan()))));
    EXPECT_EQ(diff.numel(), 0) << "decode differs at " << diff.numel() << " elements, first "
                               << (diff.numel() ? diff[0].item<int64_t>() : -1) << ": "
                               << (diff.numel() ? from_aten[diff[0].item<int64_t>()].item<float>() : 0.f) << " against "
                               << (diff.numel() ? from_loops[diff[0].item<int64_t>()].item<float>() : 0.f);
  }
}

// Per tile, the error is the rotated error rotated back: ‖error_tile‖ ≤ √tile·scale/2 with the
// tile's scale from the payload, and ≤ ‖x_tile‖; the wire carries tile·bits/8 code bytes and two
// fp32 per tile; the receiver needs only the options.
TEST(HadamardCodec, TileErrorWithinHalfAStepOfTheRotatedGridAndThePayloadIsClosedForm) {
  const int64_t rows = 20, hidden = 48;
  auto x = randn({rows, hidden}, 61) * torch::linspace(0.1, 3.0, hidden);  // channels of unequal scale
  x.select(1, 5).mul_(40.0f);                                               // and an outlier channel
  x = x.reshape({-1});
  for (const int bits : {3, 4, 8}) {
    for (const int64_t tile : {8, 16}) {
      const std::string o = fmt::format("{{hidden: {}, tile: {}, bits: {}}}", hidden, tile, bits);
      auto codec = make_act_codec("hadamard", opts(o));
      const int64_t tiles = rows * hidden / tile;
      EXPECT_EQ(codec->wire_shapes(x.numel()), (std::vector<std::vector<int64_t>>{{tiles, tile * bits / 8}, {tiles, 2}}));
      EXPECT_EQ(codec->wire_dtypes(x.numel()), (std::vector<torch::ScalarType>{torch::kByte, torch::kFloat}));
      EXPECT_EQ(codec->payload_bytes(x.numel()), tiles * tile * bits / 8 + tiles * 8) << o;
      const Payload p = codec->encode(x);
      const auto y = make_act_codec("hadamard", opts(o))->decode(p, x.numel());  // a receiver's codec
      EXPECT_LE(max_abs(y + codec->last_error() - x), 1e-6 * max_abs(x)) << o;
      const auto err = (y - x).view({tiles, tile}).to(torch::kDouble).norm(2, {1});
      const auto norm = x.view({tiles, tile}).to(torch::kDouble).norm(2, {1});
      const auto scale = p.parts[1].select(1, 0).to(torch::kDouble);
      const double slack = 1e-5 * norm.max().item<double>();  // fp32 rounding of the two rotations
      EXPECT_LE((err - std::sqrt(double(tile)) * scale / 2).max().item<double>(), slack) << o;
      EXPECT_LE((err - norm).max().item<double>(), slack) << o;
      EXPECT_GT(err.max().item<double>(), 0.0) << o;  // really quantised
    }
  }
  // Zeros come back as zeros; a message that is not whole rows of hidden is refused.
  auto codec = make_act_codec("hadamard", opts("{hidden: 16, tile: 8}"));
  EXPECT_TRUE(torch::equal(codec->decode(codec->encode(torch::zeros({64})), 64), torch::zeros({64})));
  EXPECT_THROW(codec->encode(torch::zeros({24})), std::invalid_argument);
}

// --- topk ---------------------------------------------------------------------------------------

TEST(TopKCodec, KeepsExactlyTheKLargestMagnitudes) {
  // Distinct magnitudes 1..100 with random signs, shuffled.
  const auto perm = torch::randperm(100, at::detail::createCPUGenerator(13), torch::kLong);
  const auto sign = torch::randint(0, 2, {100}, torch::kFloat) * 2 - 1;
  const auto x = (perm.to(torch::kFloat) + 1) * sign;
  auto codec = make_act_codec("topk", opts("{fraction: 0.1}"));
  EXPECT_EQ(codec->wire_shapes(100), (std::vector<std::vector<int64_t>>{{10}, {10}}));
  EXPECT_EQ(codec->wire_dtypes(100), (std::vector<torch::ScalarType>{torch::kFloat, torch::kLong}));
  EXPECT_EQ(codec->payload_bytes(100), 10 * 4 + 10 * 8);
  const auto y = round_trip(*codec, *codec, x);
  const auto kept = x.abs() > 90;  // magnitudes 91..100
  EXPECT_TRUE(torch::equal(y.masked_select(kept), x.masked_select(kept)));
  EXPECT_EQ(max_abs(y.masked_select(kept.logical_not())), 0.0);
  EXPECT_EQ(make_act_codec("topk", opts("{count: 7}"))->wire_shapes(5)[0][0], 5);  // k ≤ numel
}

// Selection, not an approximation: the same set as a full sort of |x| on a large message (the
// sampled-threshold path), on one built so the strided sample sees only outliers (the fallback
// path: too few candidates), with ties (smallest indices win) and with NaN (above +inf).
TEST(TopKCodec, SelectsTheSameSetAsASortOnLargeAndAdversarialMessages) {
  auto sorted_top = [](const torch::Tensor& x, int64_t k) {
    return std::get<0>(std::get<1>(x.abs().sort(0, /*descending=*/true)).narrow(0, 0, k).sort());
  };
  const int64_t n = 200000, k = 2000;
  auto codec = make_act_codec("topk", opts("{count: 2000}"));
  const auto x = randn({n}, 31);
  auto p = codec->encode(x);
  EXPECT_TRUE(torch::equal(p.parts[1], sorted_top(x, k)));  // increasing index order
  EXPECT_TRUE(torch::equal(p.parts[0], x.index_select(0, p.parts[1])));
  const auto odd = randn({n + 7}, 33);  // not a whole number of 16-lane vectors or 4,096-element chunks
  EXPECT_TRUE(torch::equal(codec->encode(odd).parts[1], sorted_top(odd, k)));
  auto trap = randn({n}, 32) * 1e-3;  // the strided sample sees mostly outliers: too few candidates
  for (int64_t j = 0; j < 8192; ++j) trap[j * (n / 8192)] = 10.0f + static_cast<float>(j);
  p = codec->encode(trap);
  EXPECT_TRUE(torch::equal(p.parts[1], sorted_top(trap, k)));
  auto ties = make_act_codec("topk", opts("{count: 3}"));
  p = ties->encode(torch::tensor({1.0f, -2.0f, 2.0f, 0.5f, -2.0f, 2.0f}));
  EXPECT_TRUE(torch::equal(p.parts[1], torch::tensor({1, 2, 4}, torch::kLong)));
  p = ties->encode(torch::tensor({1.0f, std::numeric_limits<float>::infinity(), std::nanf(""), 3.0f}));
  EXPECT_TRUE(torch::equal(p.parts[1], torch::tensor({1, 2, 3}, torch::kLong)));
  Payload bad{{torch::ones({3}), torch::tensor({0, 6, 1}, torch::kLong)}};
  EXPECT_THROW(ties->decode(bad, 6), std::invalid_argument);  // index outside [0, 6)
}

// decode(): the output buffer is reused only when the caller dropped every reference to it; a
// decoded tensor kept (or a view of it) is never overwritten. decode_into() writes the caller's
// buffer and checks it.
TEST(ActCodec, DecodeReusesItsOutputOnlyWhenNothingElseHoldsIt) {
  const auto x1 = randn({8 * 12}, 41), x2 = randn({8 * 12}, 42);
  for (const auto& name : act_codec_names()) {
    if (name == "none") continue;  // returns its part
    const std::string o = name == "lowrank" ? "{rank: 3, hidden: 12}"
                          : name == "int8" || name == "int4" ? "{hidden: 12}"
                          : name == "hadamard" ? "{hidden: 48, tile: 16}"
                          : name == "topk" ? "{fraction: 0.25}" : "{}";
    auto codec = make_act_codec(name, opts(o));
    const auto p1 = codec->encode(x1), p2 = codec->encode(x2);
    auto y1 = codec->decode(p1, x1.numel());
    const auto y1_copy = y1.clone();
    auto y2 = codec->decode(p2, x2.numel());  // y1 still held: a new buffer
    EXPECT_NE(y2.data_ptr(), y1.data_ptr()) << name;
    EXPECT_TRUE(torch::equal(y1, y1_copy)) << name;
    EXPECT_FALSE(torch::equal(y1, y2)) << name;
    void* const kept = y2.data_ptr();
    y1 = torch::Tensor(), y2 = torch::Tensor();
    auto y3 = codec->decode(p1, x1.numel());  // everything dropped: the last buffer again
    EXPECT_EQ(y3.data_ptr(), kept) << name;
    EXPECT_TRUE(torch::equal(y3, y1_copy)) << name;
    const auto view = y3.view({8, 12});
    y3 = torch::Tensor();
    const auto y4 = codec->decode(p2, x2.numel());  // a view still holds it: a new buffer
    EXPECT_NE(y4.data_ptr(), kept) << name;
    EXPECT_TRUE(torch::equal(view.reshape({-1}), y1_copy)) << name;
    auto into = torch::full({8 * 12}, 7.0f);
    codec->decode_into(p2, x2.numel(), into);
    EXPECT_TRUE(torch::equal(into, y4)) << name;
    auto wrong = torch::empty({8 * 12}, torch::kDouble);
    EXPECT_THROW(codec->decode_into(p2, x2.numel(), wrong), std::invalid_argument) << name;
    auto short_out = torch::empty({8 * 12 - 1});
    EXPECT_THROW(codec->decode_into(p2, x2.numel(), short_out), std::invalid_argument) << name;
  }
}

// --- every codec: never worse than sending nothing ---------------------------------------------

// Messages of 100 tokens × 48 (a small model's width) that low-rank and quantising codecs find hard.
// Each kind is a function of a seed, so the sequence test can vary them.
torch::Tensor message(const std::string& kind, uint64_t seed) {
  const int64_t rows = 100, cols = 48;
  if (kind == "zero") return torch::zeros({rows * cols});
  if (kind == "constant") return torch::full({rows * cols}, 0.375f);  // rank 1, all rows equal
  if (kind == "rank1") return randn({rows, 1}, seed).mm(randn({1, cols}, seed + 1)).view({-1});
  if (kind == "rank3") return randn({rows, 3}, seed).mm(randn({3, cols}, seed + 1)).view({-1});
  if (kind == "padded") {  // half the tokens are padding (zero rows), the rest random
    auto m = randn({rows, cols}, seed);
    m.narrow(0, rows / 2, rows / 2).zero_();
    return m.view({-1});
  }
  if (kind == "random") return randn({rows * cols}, seed);
  if (kind == "tiny") return randn({rows * cols}, seed) * 1e-30;             // norms far below the 1e-8 guard
  if (kind == "guard") return randn({rows, 1}, seed).mm(randn({1, cols}, seed + 1)).view({-1}) * 1e-10;
  if (kind == "huge") return randn({rows * cols}, seed) * 1e5;                // beyond fp16's range
  if (kind == "spikes") {  // one outlier per row: quantisation grids are coarse, 0 may be off them
    auto m = randn({rows, cols}, seed) * 1e-3;
    m.select(1, 7).fill_(50.0f);
    m.select(1, 8).fill_(-40.0f);
    return m.view({-1});
  }
  throw std::invalid_argument("unknown message kind " + kind);
}

const std::vector<std::string> kMessageKinds = {"zero", "constant", "rank1", "rank3", "padded", "random",
                                                "tiny", "guard", "huge", "spikes"};

// Every codec of act_codec_names(), with the options a pipeline uses (hidden = 48), and the
// low-rank variants that matter: both orthogonalisations, rank above and below the message's.
const std::vector<std::pair<std::string, std::string>> kCodecs = {
    {"none", ""}, {"fp16", ""}, {"bf16", ""},
    {"lowrank", "{rank: 4, hidden: 48}"}, {"lowrank", "{rank: 16, hidden: 48}"},
    {"lowrank", "{rank: 4, hidden: 48, orthogonalize: qr}"}, {"lowrank", "{view: reference, seq_len: 50, micro_batch: 16, rank: 4}"},
    {"int8", "{hidden: 48}"}, {"int4", "{hidden: 48}"}, {"topk", "{fraction: 0.01}"}, {"topk", "{count: 100}"},
    {"hadamard", "{hidden: 48, tile: 16}"}, {"hadamard", "{hidden: 48, tile: 16, bits: 3}"},
    {"hadamard", "{hidden: 48, tile: 8, bits: 8}"}};

// ‖decode(encode(x)) − x‖ ≤ ‖x‖ (slack: fp32 rounding of a projection), exact zeros for x = 0,
// no NaN; and for the low-rank codec a message of rank ≤ r comes back exactly.
void expect_bounded(ActCodec& codec, const torch::Tensor& x, const std::string& what) {
  const auto y = round_trip(codec, codec, x);
  ASSERT_TRUE(torch::isfinite(y).all().item<bool>()) << what;
  // In double: squares of 1e-30 underflow in fp32.
  const double err = (y - x).to(torch::kDouble).norm().item<double>(), norm = x.to(torch::kDouble).norm().item<double>();
  if (norm == 0) {
    EXPECT_TRUE(torch::equal(y, torch::zeros_like(x))) << what;
    return;
  }
  EXPECT_LE(err, norm * (1 + 1e-6)) << what << ": error " << err << " > norm " << norm;
}

class CodecBound : public ::testing::TestWithParam<std::tuple<size_t, std::string>> {};

TEST_P(CodecBound, ErrorNeverExceedsTheMessageNorm) {
  const auto& [name, o] = kCodecs[std::get<0>(GetParam())];
  const std::string& kind = std::get<1>(GetParam());
  const auto x = message(kind, 30);
  auto fresh = make_act_codec(name, o.empty() ? YAML::Node() : opts(o));
  expect_bounded(*fresh, x, name + o + " " + kind + " (first encode)");
  // Warm start (lowrank): a codec that sent one message of each other kind first; then one codec
  // that sent all of them in turn.
  auto warm = make_act_codec(name, o.empty() ? YAML::Node() : opts(o));
  for (const auto& k : kMessageKinds) {
    auto once = make_act_codec(name, o.empty() ? YAML::Node() : opts(o));
    once->encode(message(k, 40));
    expect_bounded(*once, x, name + o + " " + kind + " after " + k);
    warm->encode(message(k, 40));
    expect_bounded(*warm, x, name + o + " " + kind + " after every kind up to " + k);
  }
  if (name == "lowrank" && (kind == "constant" || kind == "rank1" || kind == "rank3")) {
    const auto y = round_trip(*warm, *warm, x);  // rank ≤ r (= 4 or 16): exact
    EXPECT_LE((y - x).to(torch::kDouble).norm().item<double>(), 1e-5 * x.to(torch::kDouble).norm().item<double>())
        << o << " " << kind;
  }
}

TEST(CodecBound, CoversEveryCodec) {
  for (const auto& name : act_codec_names()) {
    bool found = false;
    for (const auto& c : kCodecs) found = found || c.first == name;
    EXPECT_TRUE(found) << name << " is missing from kCodecs";
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecsAllMessages, CodecBound,
                         ::testing::Combine(::testing::Range<size_t>(0, kCodecs.size()),
                                            ::testing::ValuesIn(kMessageKinds)),
                         [](const auto& info) {
                           std::string n = std::to_string(std::get<0>(info.param)) + "_" +
                                           kCodecs[std::get<0>(info.param)].first + "_" + std::get<1>(info.param);
                           return n;
                         });

// Mixed precision: the pipeline carries activations in the compute dtype, and PipelineCodec hands
// every codec the fp32 upcast of the 16-bit message, its state (warm-start Q, errors) fp32; the
// receiving stage casts the decoded slice back to the compute dtype (stage_link.h). The bound holds
// across that boundary with the cast's rounding as the only slack: with u the unit roundoff (2⁻⁸
// bf16, 2⁻¹¹ fp16) ‖cast(y) − x‖ ≤ ‖y − x‖ + u‖y‖ ≤ (1 + 2u)‖x‖, plus for fp16 the absolute
// error of its subnormals, at most 2⁻²⁵ per element. A message fp16 cannot hold (the `huge` kind,
// beyond 65504) does not occur in an fp16 run: the overflow check skips that step (loss_scaler.h).
class CodecBoundLowPrecision : public ::testing::TestWithParam<std::tuple<size_t, std::string>> {};

TEST_P(CodecBoundLowPrecision, ErrorNeverExceedsTheMessageNormAcrossTheCasts) {
  const auto& [name, o] = kCodecs[std::get<0>(GetParam())];
  const std::string& kind = std::get<1>(GetParam());
  for (const bool fp16 : {false, true}) {
    const torch::ScalarType dtype = fp16 ? torch::kHalf : torch::kBFloat16;
    if (fp16 && kind == "huge") continue;  // beyond fp16's range: an overflow, not a message
    const std::string what = name + o + " " + kind + (fp16 ? " (fp16 message)" : " (bf16 message)");
    auto codec = make_act_codec(name, o.empty() ? YAML::Node() : opts(o));
    for (const auto& k : kMessageKinds) {
      if (!(fp16 && k == "huge")) codec->encode(message(k, 40).to(dtype).to(torch::kFloat));  // warm
    }
    const auto x = message(kind, 30).to(dtype).to(torch::kFloat);  // what the codec is handed
    const auto y = round_trip(*codec, *codec, x).to(dtype);         // what the next stage computes on
    ASSERT_EQ(codec->last_error().scalar_type(), torch::kFloat) << what;  // LEP's buffer stays fp32
    ASSERT_TRUE(torch::isfinite(y).all().item<bool>()) << what;
    const double err = (y.to(torch::kDouble) - x.to(torch::kDouble)).norm().item<double>();
    const double norm = x.to(torch::kDouble).norm().item<double>();
    if (norm == 0) {
      EXPECT_EQ(y.abs().max().item<float>(), 0.0f) << what;
      continue;
    }
    const double u = fp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    const double subnormal = fp16 ? std::sqrt(double(x.numel())) * std::ldexp(1.0, -25) : 0.0;
    EXPECT_LE(err, norm * (1 + 2 * u) + subnormal) << what << ": error " << err << " > norm " << norm;
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecsAllMessages, CodecBoundLowPrecision,
                         ::testing::Combine(::testing::Range<size_t>(0, kCodecs.size()),
                                            ::testing::ValuesIn(kMessageKinds)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "_" +
                                  kCodecs[std::get<0>(info.param)].first + "_" + std::get<1>(info.param);
                         });

// int4 on a wide row: with the grid min + k·scale, 0 falls between two levels and every zero of
// the row decodes to up to scale/2: [0.5, −0.5, 0 × 1022] gave an error of 1.07 on a norm of
// 0.71. With 0 on the grid the zeros are exact; elementwise |error| ≤ |x|.
TEST(QuantCodec, ZeroIsOnTheGridSoWideRowsAreNeverWorseThanZero) {
  for (const auto& [name, levels] : {Level{"int8", 255}, Level{"int4", 15}}) {
    auto x = torch::zeros({2, 1024});
    x[0][0] = 0.5f, x[0][1] = -0.5f;                                 // zero exactly between levels
    x[1] = randn({1024}, 50) * 1e-3;                                 // small values and one spike
    x[1][3] = 1.0f;
    x = x.view({-1});
    auto codec = make_act_codec(name, opts("{hidden: 1024}"));
    const auto y = round_trip(*codec, *codec, x);
    EXPECT_TRUE(torch::equal(y.view({2, 1024})[0].narrow(0, 2, 1022), torch::zeros({1022}))) << name;
    EXPECT_LE(((y - x).abs() - x.abs()).max().item<double>(), 1e-6) << name;  // |error| ≤ |x|
    EXPECT_LE((y - x).norm().item<double>(), x.norm().item<double>()) << name;
  }
}

TEST(ActCodec, HalfPrecisionSaturatesInsteadOfOverflowing) {
  const auto x = torch::tensor({1e5f, -7e4f, 65519.0f, 3.0f, std::numeric_limits<float>::infinity()});
  auto codec = make_act_codec("fp16", YAML::Node());
  const auto y = codec->decode(codec->encode(x), 5);
  EXPECT_TRUE(torch::equal(y, torch::tensor({65504.0f, -65504.0f, 65504.0f, 3.0f, 65504.0f}))) << y;
  auto bf16 = make_act_codec("bf16", YAML::Node());
  const auto big = torch::tensor({std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()});
  const auto yb = bf16->decode(bf16->encode(big), 2);
  EXPECT_TRUE(torch::isfinite(yb).all().item<bool>()) << yb;
  EXPECT_LE(((yb - big).abs() - big.abs()).max().item<double>(), 0.0);
  auto nan = torch::tensor({std::nanf(""), 1.0f});
  EXPECT_TRUE(std::isnan(codec->decode(codec->encode(nan), 2)[0].item<float>()));
}

// --- factory and contracts ----------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no std::invalid_argument";
}

TEST(ActCodecFactory, ErrorsNameTheKnownNamesAndTheBadKey) {
  const auto unknown = error_of([] { make_act_codec("zip", YAML::Node()); });
  EXPECT_NE(unknown.find("unknown activation codec 'zip'; known:"), std::string::npos) << unknown;
  for (const char* name : {"none", "fp16", "bf16", "lowrank", "int8", "int4", "hadamard", "topk"}) {
    EXPECT_NE(unknown.find(std::string("\n  ") + name + ": "), std::string::npos) << name << " in " << unknown;
  }
  const auto bad_key = error_of([] { make_act_codec("lowrank", opts("{hidden: 8, rnak: 4}")); });
  EXPECT_NE(bad_key.find("unknown option 'rnak'"), std::string::npos) << bad_key;
  EXPECT_NE(bad_key.find("rank"), std::string::npos) << bad_key;
  EXPECT_NE(error_of([] { make_act_codec("fp16", opts("{hidden: 8}")); }).find("'hidden'"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_act_codec("lowrank", opts("{rank: 4}")); }).find("'hidden' is "
                                                                                 "required"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_act_codec("lowrank", opts("{view: x, hidden: 8}")); })
                .find("token_major, reference"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              make_act_codec("lowrank", opts("{view: reference, seq_len: 4, micro_batch: 4}"));
            }).find("micro_batch % 8"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_act_codec("int8", opts("{hidden: two}")); }).find("bad value"),
            std::string::npos);
  EXPECT_THROW(make_act_codec("topk", opts("{fraction: 0.1, count: 3}")), std::invalid_argument);
  EXPECT_THROW(make_act_codec("topk", opts("{fraction: 1.5}")), std::invalid_argument);
}

TEST(HadamardCodec, OptionsAreCheckedWithTheFix) {
  EXPECT_NE(error_of([] { make_act_codec("hadamard", opts("{hidden: 64, bits: 5}")); }).find("known: 3, 4, 8"),
            std::string::npos);
  const auto not_power = error_of([] { make_act_codec("hadamard", opts("{hidden: 48, tile: 12}")); });
  EXPECT_NE(not_power.find("power of two, at least 8, dividing hidden = 48 (e.g. tile: 16)"), std::string::npos)
      << not_power;
  const auto none = error_of([] { make_act_codec("hadamard", opts("{hidden: 12}")); });
  EXPECT_NE(none.find("there is none: use int8 or int4"), std::string::npos) << none;
  EXPECT_NE(error_of([] { make_act_codec("hadamard", opts("{tile: 8}")); }).find("'hidden' is required"),
            std::string::npos);
  EXPECT_EQ(make_act_codec("hadamard", opts("{hidden: 256}"))->payload_bytes(256), 4 * 32 + 4 * 8);  // tile 64, 4 bits
}

TEST(ActCodecContract, RejectsBadInputsAndStaleErrors) {
  auto codec = make_act_codec("fp16", YAML::Node());
  EXPECT_THROW(codec->last_error(), std::logic_error);
  EXPECT_THROW(codec->encode(torch::zeros({2, 3})), std::invalid_argument);
  EXPECT_THROW(codec->encode(torch::zeros({6}, torch::kDouble)), std::invalid_argument);
  auto x = torch::ones({6});
  auto p = codec->encode(x);
  x.add_(1);  // LEP would do this: take the error first
  EXPECT_THROW(codec->last_error(), std::logic_error);
  EXPECT_THROW(codec->decode(p, 7), std::invalid_argument);
  p.parts[0] = p.parts[0].to(torch::kFloat);
  EXPECT_THROW(codec->decode(p, 6), std::invalid_argument);
}

// clone(): the same options and a copy of the state. Encoding with one clone never changes another
// or the original (evaluation sends through a copy of the training codec).
TEST(ActCodecClone, ClonesEncodeAlikeAndIndependently) {
  const auto x1 = randn({8 * 12}, 21), x2 = randn({8 * 12}, 22), x3 = randn({8 * 12}, 23);
  for (const auto& name : act_codec_names()) {
    const std::string o = name == "lowrank" ? "{rank: 3, hidden: 12}"
                          : name == "int8" || name == "int4" ? "{hidden: 12}"
                          : name == "hadamard" ? "{hidden: 48, tile: 16}"
                          : name == "topk" ? "{fraction: 0.25}" : "{}";
    auto a = make_act_codec(name, opts(o));
    a->encode(x1);
    auto b = a->clone(), c = a->clone();
    EXPECT_EQ(b->name(), name);
    b->encode(x3);
    b->encode(x1);
    const auto pa = a->encode(x2), pc = c->encode(x2);
    ASSERT_EQ(pa.parts.size(), pc.parts.size()) << name;
    for (size_t i = 0; i < pa.parts.size(); ++i) EXPECT_TRUE(torch::equal(pa.parts[i], pc.parts[i])) << name << " " << i;
  }
}

// act_codec_options: each codec takes from the model only the sizes it reads, and never overrides the user's.
TEST(ActCodecOptions, FillOnlyTheSizesACodecTakesAndKeepTheUsers) {
  const MessageShape shape{256, 128, 16};
  auto keys = [](const YAML::Node& o) {
    std::vector<std::string> k;
    for (const auto& kv : o) k.push_back(kv.first.as<std::string>() + "=" + kv.second.as<std::string>());
    std::sort(k.begin(), k.end());
    return k;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(keys(act_codec_options("lowrank", YAML::Load("{rank: 4}"), shape)), (V{"hidden=256", "rank=4"}));
  EXPECT_EQ(keys(act_codec_options("lowrank", YAML::Load("{view: reference}"), shape)),
            (V{"hidden=256", "micro_batch=16", "seq_len=128", "view=reference"}));
  EXPECT_EQ(keys(act_codec_options("int4", YAML::Node(), shape)), (V{"hidden=256"}));
  EXPECT_EQ(keys(act_codec_options("hadamard", YAML::Load("{bits: 3}"), shape)), (V{"bits=3", "hidden=256"}));
  EXPECT_EQ(keys(act_codec_options("int8", YAML::Load("{hidden: 64}"), shape)), (V{"hidden=64"}));
  EXPECT_EQ(keys(act_codec_options("topk", YAML::Load("{fraction: 0.1}"), shape)), (V{"fraction=0.1"}));
  EXPECT_TRUE(keys(act_codec_options("fp16", YAML::Node(), shape)).empty());
  // The caller's node is not modified, and what is filled builds the codec.
  const YAML::Node user = YAML::Load("{rank: 2}");
  const YAML::Node filled = act_codec_options("lowrank", user, shape);
  EXPECT_FALSE(user["hidden"]);
  EXPECT_EQ(make_act_codec("lowrank", filled)->payload_bytes(256 * 10), (10 + 256) * 2 * 4);
  // Options that are not a map come back as given, and make_act_codec() refuses them.
  const YAML::Node scalar = YAML::Load("4");
  EXPECT_TRUE(act_codec_options("lowrank", scalar, shape).IsScalar());
  EXPECT_THROW(make_act_codec("lowrank", act_codec_options("lowrank", scalar, shape)), std::invalid_argument);
}

}  // namespace
}  // namespace optcc

// Built-in ActCodecs (act_codec.h). Options are the YAML keys make_act_codec() accepts; every
// codec rejects keys it does not know.
//
//   none     no options. One part: x itself [numel], fp32 (no copy). Exact.
//   fp16     no options. One part: x cast to fp16 [numel]. Error ≤ half an fp16 ulp; values beyond
//            ±65504 (and ±inf) saturate to ±65504, so |error| < |x| there too. NaN stays NaN.
//   bf16     no options. Likewise in bf16 (saturating at ±3.39e38).
//   lowrank  CB codec (docs/design.md §2). Options:
//              rank        int, default 16: r = min(rank, rows, cols).
//              view        token_major (default) | reference.
//                          token_major: rows = numel/hidden, cols = hidden (one token per row).
//                          reference:   rows n = seq_len·(micro_batch/8), cols m' = numel/n, the
//                          reference's hard-coded "/8" rule (docs/design.md §2.3, §10.4); equals
//                          token_major for the paper's b = t = 8.
//              hidden      int, required for token_major.
//              seq_len, micro_batch   ints, required for reference (micro_batch % 8 == 0).
//              seed        int, default 714: seeds the codec's own CPU generator (never the
//                          global one, docs/design.md §10.7) that draws the initial Q.
//              orthogonalize  mgs (default: the reference's MGS with the 1e-8 guard, plus a
//                          second pass where a column lost most of its norm) | qr (Householder;
//                          same span). Either way P̂ has orthonormal or zero columns (a message
//                          of rank below r gives zero columns), so decode = P̂P̂ᵀM is a
//                          projection of M: ‖error‖ ≤ ‖M‖ for every message (orthogonalize.h).
//            Parts: P̂ [rows, r] fp32, Q [cols, r] fp32; 4·r·(rows+cols) bytes. A zero column of
//            the warm-start Q is refilled from the generator (orthogonalize.h).
//            Paths by device: CPU messages use the per-matrix CPU kernels above; other devices
//            (CUDA) the batched kernels of lowrank_batch.h with B = 1 (a fixed number of ATen
//            operations whatever r, no host sync; Householder QR whatever `orthogonalize` says,
//            the same span). There, Q's first draws and refills come from a CounterNormal seeded
//            with `seed` (on the device, checkpointed), not from the CPU generator.
//   int8     Per-row asymmetric quantisation of the [numel/hidden, hidden] view. Option: hidden
//            (required). q = clamp(round((x − lo_row)·(1/scale_row)), 0, 255) (round half to
//            even), scale_row = (max_row − min_row)/255, lo_row = min_row, except in a row with
//            min_row < 0 < max_row, where
//            lo_row = −round(−min_row/scale_row)·scale_row puts 0 on the grid (an integer zero
//            point). Parts: q uint8 [rows, hidden], {scale, lo} fp32 [rows, 2]; decode q·scale + lo.
//            Error ≤ scale/2 and ≤ |x| per element (plus fp32 rounding), so ‖error‖ ≤ ‖x‖ for any
//            row width (without the zero point, an int4 row of width > 450 could do worse than 0);
//            exact for values on the row's grid lo + k·scale.
//   int4     As int8 with 15 levels; two values per byte, element 2i in the low nibble of byte i.
//            Parts: packed uint8 [ceil(numel/2)], {scale, min} fp32 [rows, 2].
//   topk     Keeps the k largest |x|. Options: exactly one of fraction (0 < f ≤ 1, k =
//            clamp(round(f·numel), 1, numel)) or count (k = min(count, numel)).
//            Parts: values fp32 [k], indices int64 [k] in increasing order (ties at the k-th
//            magnitude: the smallest indices; NaN ranks above +inf); decode writes zeros elsewhere
//            and throws std::invalid_argument on an index outside [0, numel). Found by selection
//            (a threshold pass and nth_element on the candidates, raw_loops.h), not a sort.
//   hadamard Tile-wise Hadamard rotation, then group quantisation: a stateless quantiser of pipeline
//            messages (the scheme of TAH-Quant, arXiv 2506.01352). Options: hidden (required;
//            pipeline configs take the model's), tile (a power of two ≥ 8 dividing hidden, default
//            64), bits (3, 4 or 8, default 4). Each token's hidden vector is cut into tiles of
//            `tile` elements; a tile x is rotated, y = H·x/√tile (H the Walsh–Hadamard matrix:
//            raw_loops.h hadamard_transform, O(tile·log tile), no matrix is formed), y is quantised
//            as an int8 row with 2^bits − 1 levels (the same grid, zero point and rounding), and
//            decoded as H·ŷ/√tile. Parts: codes uint8 [tiles, tile·bits/8] (each tile's codes
//            packed least significant bit first, raw_loops.h pack_bits), {scale, lo} fp32
//            [tiles, 2], tiles = numel/tile: bits/8 + 8/tile bytes per element (0.625 at 4 bits,
//            tile 64: 6.4x less than fp32). The rotation is orthonormal, so a tile's error has the
//            norm of its error in the rotated domain: ‖error_tile‖ ≤ √tile·scale/2 and
//            ≤ ‖x_tile‖, hence ‖error‖ ≤ ‖x‖ (plus fp32 rounding of the two rotations). The
//            rotation spreads one large element over the whole tile, so the scale follows the
//            tile's norm (≤ 2‖x_tile‖/levels) instead of its largest element.
// int8, int4, hadamard and topk run raw loops on CPU tensors (raw_loops.h). On another device (a GPU)
// int8, int4 and hadamard run their ATen form (encode_aten / decode_aten: tensor operations on that
// device, the same payload bytes bit for bit), and so does topk.
#pragma once

#include "compression/act_codec.h"
#include "compression/lowrank_batch.h"

namespace optcc {

/// none / fp16 / bf16: a cast to `dtype` and back (kFloat: no cast, no copy).
class CastCodec : public ActCodec {
 public:
  explicit CastCodec(torch::ScalarType dtype) : dtype_(dtype) {}
  std::string name() const override;
  std::vector<std::vector<int64_t>> wire_shapes(int64_t numel) const override { return {{numel}}; }
  torch::ScalarType wire_dtype() const override { return dtype_; }
  std::unique_ptr<ActCodec> clone() const override { return std::make_unique<CastCodec>(*this); }

 protected:
  Payload encode_impl(const torch::Tensor& x) override;
  void decode_impl(const Payload& p, torch::Tensor& out) const override;
  torch::Tensor decode_alias(const Payload& p) const override;

 private:
  torch::ScalarType dtype_;
};

/// How a flat message becomes a matrix (docs/design.md §2.3).
struct MatrixView {
  enum class Kind { kTokenMajor, kReference };
  Kind kind = Kind::kTokenMajor;
  int64_t hidden = 0;       // token_major: columns
  int64_t seq_len = 0;      // reference: s
  int64_t micro_batch = 0;  // reference: b (multiple of 8)
  /// {rows, cols} for a flat message of `numel`; std::invalid_argument with the numbers otherwise.
  std::pair<int64_t, int64_t> shape(int64_t numel) const;
};

class LowRankCodec : public ActCodec {
 public:
  /// `qr`: orthonormalise with Householder QR instead of MGS (option `orthogonalize: qr`).
  LowRankCodec(MatrixView view, int64_t rank, uint64_t seed, bool qr = false);
  std::string name() const override { return "lowrank"; }
  std::vector<std::vector<int64_t>> wire_shapes(int64_t numel) const override;
  torch::ScalarType wire_dtype() const override { return torch::kFloat; }
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// {"q", [cols, r]} of wire_shapes(numel); held: {"q", q().sizes()} once Q exists.
  std::vector<TensorSpec> state_for(int64_t numel) const override;
  std::vector<TensorSpec> held_state() const override;
  int64_t state_bytes() const override { return q_.defined() ? q_.numel() * static_cast<int64_t>(q_.element_size()) : 0; }
  std::unique_ptr<ActCodec> clone() const override;
  /// Matrix [rows, cols] of wire_shapes(numel), rank r: encode P = MQ and Q = MᵀP̂ 4·rows·cols·r,
  /// orthogonalisation 2·rows·r², and with the error (LEP) x − P̂Qᵀ another 2·rows·cols·r; decode
  /// P̂Qᵀ 2·rows·cols·r.
  CommStep encode_arithmetic(int64_t numel, bool with_error) const override;
  CommStep decode_arithmetic(int64_t numel) const override;

  /// The warm-start Q [cols, r] fp32 left by the last encode (undefined before the first).
  const torch::Tensor& q() const { return q_; }
  int64_t rank_for(int64_t numel) const;  // r = min(rank, rows, cols)
  /// Test and benchmark hook: CPU messages take the batched (device) path too.
  void use_batched_on_cpu(bool on) { batched_on_cpu_ = on; }

 protected:
  Payload encode_impl(const torch::Tensor& x) override;
  void decode_impl(const Payload& p, torch::Tensor& out) const override;

 private:
  MatrixView view_;
  int64_t rank_;
  bool qr_ = false;
  at::Generator gen_;  // CPU, seeded once; draws Q only when it is (re)initialised
  CounterNormal draws_;  // the batched path's draws (lowrank_batch.h), same seed
  bool batched_on_cpu_ = false;
  torch::Tensor q_;    // [cols, r] fp32, on the device of the last x
  Payload encode_batched(const torch::Tensor& m, int64_t r);  // the non-CPU path
};

/// int8 (bits = 8) and int4 (bits = 4).
class QuantCodec : public ActCodec {
 public:
  QuantCodec(int bits, int64_t hidden) : bits_(bits), hidden_(hidden) {}
  std::string name() const override { return bits_ == 8 ? "int8" : "int4"; }
  std::vector<std::vector<int64_t>> wire_shapes(int64_t numel) const override;
  torch::ScalarType wire_dtype() const override { return torch::kByte; }
  std::vector<torch::ScalarType> wire_dtypes(int64_t numel) const override;
  std::unique_ptr<ActCodec> clone() const override { return std::make_unique<QuantCodec>(*this); }
  /// The ATen form of encode and decode: what runs for a tensor on another device (a GPU), in tensor
  /// operations on that device, no host copy. The same payload bytes and decoded values as the CPU
  /// loops, bit for bit (min/max on the floats' ordered-integer image, the same grid, clamps and
  /// half-to-even rounding); public so that a CPU test can hold the two to that.
  Payload encode_aten(const torch::Tensor& x) const;
  void decode_aten(const Payload& p, torch::Tensor& out) const;

 protected:
  Payload encode_impl(const torch::Tensor& x) override;
  void decode_impl(const Payload& p, torch::Tensor& out) const override;

 private:
  int64_t rows(int64_t numel) const;
  int bits_;
  int64_t hidden_;
};

/// hadamard (the header's list).
class HadamardCodec : public ActCodec {
 public:
  /// bits ∈ {3, 4, 8}; tile a power of two ≥ 8 dividing hidden (std::invalid_argument otherwise).
  HadamardCodec(int bits, int64_t hidden, int64_t tile);
  std::string name() const override { return "hadamard"; }
  std::vector<std::vector<int64_t>> wire_shapes(int64_t numel) const override;
  torch::ScalarType wire_dtype() const override { return torch::kByte; }
  std::vector<torch::ScalarType> wire_dtypes(int64_t numel) const override;
  /// The two rotations count log2(tile) + 1 FLOPs per element each (butterflies and the 1/√tile).
  CommStep encode_arithmetic(int64_t numel, bool with_error) const override;
  CommStep decode_arithmetic(int64_t numel) const override;
  std::unique_ptr<ActCodec> clone() const override { return std::make_unique<HadamardCodec>(*this); }
  /// The ATen form (as QuantCodec's): the butterflies as tensor operations in hadamard_transform's order,
  /// so the payload and the decode equal the CPU kernel's bit for bit.
  Payload encode_aten(const torch::Tensor& x) const;
  void decode_aten(const Payload& p, torch::Tensor& out) const;
  int bits() const { return bits_; }
  int64_t tile() const { return tile_; }

 protected:
  Payload encode_impl(const torch::Tensor& x) override;
  void decode_impl(const Payload& p, torch::Tensor& out) const override;

 private:
  int64_t tiles(int64_t numel) const;  // numel / tile; throws unless numel is a multiple of hidden
  int bits_;
  int64_t hidden_;
  int64_t tile_;
};

class TopKCodec : public ActCodec {
 public:
  /// Exactly one of fraction > 0 or count > 0.
  TopKCodec(double fraction, int64_t count) : fraction_(fraction), count_(count) {}
  std::string name() const override { return "topk"; }
  std::vector<std::vector<int64_t>> wire_shapes(int64_t numel) const override;
  torch::ScalarType wire_dtype() const override { return torch::kFloat; }
  std::vector<torch::ScalarType> wire_dtypes(int64_t) const override;
  int64_t k_for(int64_t numel) const;
  std::unique_ptr<ActCodec> clone() const override { return std::make_unique<TopKCodec>(*this); }
  /// The ATen form (as QuantCodec's): the k largest of the keys |x|'s bits · 2³² + (2³² − 1 − index), NaN
  /// as the largest magnitude, so ties go to the smallest indices as in the CPU selection; the same
  /// payload bit for bit, no host synchronisation in the encode (the decode reads one flag: an index
  /// outside [0, numel) throws std::invalid_argument, as on the CPU).
  Payload encode_aten(const torch::Tensor& x) const;
  void decode_aten(const Payload& p, torch::Tensor& out) const;

 protected:
  Payload encode_impl(const torch::Tensor& x) override;
  /// Throws std::invalid_argument on an index outside [0, numel).
  void decode_impl(const Payload& p, torch::Tensor& out) const override;

 private:
  double fraction_;
  int64_t count_;
};

}  // namespace optcc

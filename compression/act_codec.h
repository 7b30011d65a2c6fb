// ActCodec: a point-to-point payload codec for pipeline messages (activation gradients under CB,
// docs/design.md §2; forward activations in ablations). One object per sender, with explicit state (the
// low-rank codec's warm-started Q and its generator); the receiver needs only the options.
//
// Contract, per message:
//   sender:   payload = codec.encode(x)              // x: flat [numel] fp32
//             err     = codec.last_error()           // x − decode(payload), for LEP (docs/design.md §3.1)
//             send payload.parts in order
//   receiver: allocate parts of wire_shapes(numel) / wire_dtypes(numel), receive them,
//             y = codec.decode(payload, numel)       // flat [numel] fp32
// wire_shapes() and wire_dtypes() depend on numel and the options alone (never on values), so both
// ends agree before anything travels. Bytes are counted by the Communicator where they go on the
// wire; payload_bytes() is the closed form for tests and traffic estimates.
//
// Adapting to harness/parallel/stage_link.h's MessageCodec (the adapter is PipelineCodec in
// compression/pipeline_codec.h): encode/decode, wire_shapes() and wire_dtypes() map one to one. The
// link allocates each receive buffer in the dtype MessageCodec::wire_dtypes() gives (its own dtype
// only when that list is empty), so codecs whose parts differ from the link's dtype
// (fp16/bf16/int8/int4/topk, and lowrank under a 16-bit link: docs/design.md §10.5) arrive as sent.
#pragma once

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <memory>
#include <string>
#include <vector>

#include "compression/comm_plan.h"
#include "compression/registry.h"
#include "compression/state_manifest.h"

namespace optcc {

/// What travels for one message, in order.
struct Payload {
  std::vector<torch::Tensor> parts;
};

class ActCodec {
 public:
  virtual ~ActCodec() = default;
  virtual std::string name() const = 0;

  /// Shapes of the parts for a flat input of `numel` fp32 elements. Throws std::invalid_argument
  /// when `numel` does not fit the codec's matrix view (e.g. not a multiple of `hidden`).
  virtual std::vector<std::vector<int64_t>> wire_shapes(int64_t numel) const = 0;
  /// The wire dtype of the first part (for most codecs, of every part: lowrank sends fp32 factors
  /// whatever the training dtype, docs/design.md §10.5).
  virtual torch::ScalarType wire_dtype() const = 0;
  /// Per-part wire dtypes, aligned with wire_shapes(numel). Default: wire_dtype() for every part.
  /// Codecs with mixed parts override it (int8/int4: {uint8, fp32}; topk: {fp32, int64}).
  virtual std::vector<torch::ScalarType> wire_dtypes(int64_t numel) const;

  /// Encodes `x` (1-D fp32, any device; not modified). Advances the codec's state (lowrank: Q).
  /// Remembers x (by reference, no copy) and the payload for last_error(). Runs without autograd.
  /// Parts may alias x (`none`) or the codec's state (lowrank's Q): treat them as read-only.
  Payload encode(const torch::Tensor& x);
  /// Decodes a payload of wire_shapes(numel) into a flat [numel] fp32 tensor on the parts' device
  /// (`none` returns its part). Stateless as a codec (the receiver keeps no codec state,
  /// docs/design.md §2.5), but the result is written into an output buffer the object keeps and reuses, so a
  /// receive loop pays no page faults for a fresh full-size tensor on every message: a decode
  /// reuses the buffer only when nothing outside the object still refers to its memory (every
  /// tensor or view of an earlier result was dropped), and allocates a new one otherwise. So a
  /// caller may keep a decoded tensor as long as it likes, it is never overwritten; holding it
  /// across decodes just costs a fresh buffer per decode (today's cost). Not safe to call
  /// concurrently on one object (neither is encode). Throws std::invalid_argument on a part
  /// count, shape or dtype mismatch.
  torch::Tensor decode(const Payload& p, int64_t numel) const;
  /// The same decode written into `out`, the caller's buffer (e.g. a receive buffer it reuses):
  /// flat [numel] fp32, contiguous, on the parts' device; std::invalid_argument otherwise or on a
  /// payload mismatch. `none` copies its part into `out`.
  void decode_into(const Payload& p, int64_t numel, torch::Tensor& out) const;

  /// The sender's error of the last encode: x − decode(encode(x)), flat [numel] fp32. Computed on
  /// demand (one decode). REQUIRES: an encode happened and its x was not modified in place since
  /// (checked through the tensor's version counter; std::logic_error otherwise).
  virtual torch::Tensor last_error() const;

  /// Σ over parts of numel·itemsize, for a flat input of `numel` elements.
  virtual int64_t payload_bytes(int64_t numel) const;
  /// The arithmetic of one encode and one decode of `numel` elements, as the traffic model and the
  /// simulator count it (compression/comm_plan.h): FLOPs of matrix products and orthogonalisation
  /// (0 for element-wise codecs), plus one fp32 pass to read the message and one to write it
  /// (8 bytes per element). `with_error`: the encode also forms last_error() (LEP).
  virtual CommStep encode_arithmetic(int64_t numel, bool with_error) const;
  virtual CommStep decode_arithmetic(int64_t numel) const;

  /// Sender state (empty for stateless codecs). A loaded codec's next encode is bit-identical to
  /// the saved one's. Options are not saved: construct with the same options, then load.
  virtual void save(torch::serialize::OutputArchive&) const {}
  virtual void load(torch::serialize::InputArchive&) {}
  /// The sender state this codec keeps for messages of `numel` elements, by name and shape
  /// (lowrank: "q" [cols, r]); empty for stateless codecs. held_state(): the state it holds now
  /// (e.g. after load()), so an owner can check saved state against the messages it will send.
  virtual std::vector<TensorSpec> state_for(int64_t numel) const { return {}; }
  virtual std::vector<TensorSpec> held_state() const { return {}; }
  /// Bytes of the sender state held now (lowrank: its Q in fp32; 0 for stateless codecs): the
  /// Fig. 12 "P/Q buffers" of a pipeline codec.
  virtual int64_t state_bytes() const { return 0; }

  /// A codec with the same options and its own copy of the sender state (generator included):
  /// encoding with either never changes the other (evaluation sends through a copy).
  virtual std::unique_ptr<ActCodec> clone() const = 0;

 protected:
  /// The codec proper; `x` is 1-D fp32 (checked by encode()).
  virtual Payload encode_impl(const torch::Tensor& x) = 0;
  /// The decode proper: `p` matches wire_shapes(numel) (checked), `out` is flat [numel] fp32,
  /// contiguous, on the parts' device; every element of `out` must be written.
  virtual void decode_impl(const Payload& p, torch::Tensor& out) const = 0;
  /// For decode(): the part itself when the decode is the identity (`none`), else undefined.
  virtual torch::Tensor decode_alias(const Payload& p) const { return {}; }
  /// Checks `p` against wire_shapes(numel) / wire_dtypes(numel).
  void check_payload(const Payload& p, int64_t numel) const;

 private:
  /// `out_` when nothing else refers to its memory and it fits, else a fresh [numel] fp32 buffer
  /// (kept as the new `out_`).
  torch::Tensor output_buffer(int64_t numel, const torch::Device& device) const;

  mutable torch::Tensor out_;  // decode()'s reused output, [numel] fp32 (see decode())
  torch::Tensor last_x_;  // [numel] fp32, the caller's tensor (shallow)
  int64_t last_x_version_ = 0;
  Payload last_payload_;
};

/// Adds none, fp16, bf16, lowrank, int8, int4, hadamard and topk (codecs.h documents each one's options).
void register_builtin_act_codecs(Registry<ActCodec>& registry);
/// The registry of the built-in codecs (filled once).
const Registry<ActCodec>& act_codec_registry();
/// act_codec_registry().create(name, options): `options` is a YAML map or null. Unknown name,
/// unknown option key, a bad value or a missing required option -> std::invalid_argument naming
/// the known names (with their help lines) / keys.
std::unique_ptr<ActCodec> make_act_codec(const std::string& name,
                                         const YAML::Node& options = YAML::Node());

/// The sizes of a pipeline message as the model makes it: a micro-batch's activations (or their
/// gradients), [micro_batch, seq_len, hidden] elements, hidden the model's hidden size.
struct MessageShape {
  int64_t hidden = 0;
  int64_t seq_len = 0;
  int64_t micro_batch = 0;
};
/// `options` (a map or null; not modified) plus the sizes codec `name` takes from the message
/// where the user set none: lowrank takes hidden (view token_major) or seq_len and micro_batch (view
/// reference); int8, int4 and hadamard take hidden; the others take none. Each codec states this next to its
/// factory, so callers never branch on a codec's name. An unknown `name` returns `options`
/// unchanged (make_act_codec() then names it).
YAML::Node act_codec_options(const std::string& name, const YAML::Node& options, const MessageShape& shape);

/// The names make_act_codec() knows, sorted.
std::vector<std::string> act_codec_names();

}  // namespace optcc

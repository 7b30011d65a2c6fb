// StageLink: point-to-point between adjacent stages of one pipeline (docs/design.md §1.4), in Megatron's
// vocabulary (send_forward / recv_forward / send_backward / recv_backward and the two fused
// exchanges), driven generically by the schedule's calls (P2PCall, harness/parallel/schedule.h).
//
// Who calls what: every rank of stage k (each of its tp and dp ranks alike) owns one StageLink over
// its pipeline group (the p ranks sharing its (tp, dp), RankLayout::pp_group: group rank == stage)
// and, optionally, its TP group. All ranks of a pipeline run the same schedule, so peers post
// matching messages; the t TP ranks of a stage run identical calls, so their all-gathers match.
//
// One call, execute(): (1) for each message in the order the call lists it, a send encodes and
// posts its payload, a receive allocates and posts its payload buffers; (2) EVERY CommHandle is
// waited on (BR-13); (3) each receive is decoded, all-gathered over TP and shaped. Messages of one
// direction between two stages are thus posted in plan order on both sides (schedule.h's
// simulate() checks that those orders agree); in addition every wire tensor is tagged with
// (direction, micro-batch, the sender's model chunk, payload part), so a plan mismatch ends in a
// named timeout on Gloo instead of silently crossed tensors (BR-11, docs/faults.md). NCCL ignores tags: order alone
// matches there.
//
// Interleaved 1F1B (schedule.h): each message names its chunk and the peer's. The stages form a
// ring: stage p-1's chunk c sends its activations to stage 0's chunk c+1, which sends the gradients
// back. Every chunk has the same input and output shapes (StageLinkShapes).
//
// Scatter-gather (Megatron's default, docs/design.md §1.4): with a TP group of t > 1 ranks and t | N, where N
// is the message's element count (s*b*h), TP rank i sends only the flat elements [i*N/t, (i+1)*N/t)
// to TP rank i of the neighbour stage; the receiver all-gathers the t slices over its TP group and
// views the result as [s, b, h]. Otherwise every TP rank sends the whole tensor.
//
// Traffic: forward activations are kPipelineForward, activation gradients kPipelineBackward. Bytes
// are recorded by the Communicators (so give both the rank's one TrafficMeter):
//   - the sender records its payload on the pipeline group's link: N/t*4 bytes per fp32 message
//     with scatter-gather, N*4 without (a codec's wire tensors instead, when one is set);
//   - the receiver's all-gather is recorded under the SAME class, on the TP group's link
//     (intra-node): (t-1)*N/t*4 bytes per received message; so "bytes per class" covers both hops.
//     Where both groups share a link (all on one node), TrafficCounters::p2p_bytes still separates
//     them: the sends alone, i.e. the stage-to-stage wire (the first term of each line below).
// Per step, stage k of p, m micro-batches, t > 1, t | N, fp32, no codec:
//   pp_fwd = [k < p-1] m*N*4/t (pipeline link) + [k > 0]     m*(t-1)*N*4/t (TP link)
//   pp_bwd = [k > 0]   m*N*4/t (pipeline link) + [k < p-1]   m*(t-1)*N*4/t (TP link)
//
// With v chunks per stage (interleaved) every stage sends m*v messages each way per step, stage 0's
// and p-1's included (over the ring), except that stage 0's chunk 0 sends no gradient and stage p-1's
// chunk v-1 no activation.
//
// Errors: std::invalid_argument for a message to a stage other than the previous or next virtual stage, a send tensor of the wrong shape
// or dtype, or a codec answer of the wrong size (all before anything is posted where possible);
// CommError (from Communicator) when a peer fails or does not answer within the communicator's
// timeout, re-thrown with the stage, the call and the message prepended.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "harness/parallel/communicator.h"
#include "harness/parallel/schedule.h"

namespace optcc {

/// Hook for compressing messages (CB, docs/design.md §2; compression/pipeline_codec.h adapts the ActCodecs):
/// what travels for one message. The sender hands encode() this TP rank's flat slice (1-D: N/t
/// elements with scatter-gather, N without) and posts the returned tensors in order; the receiver
/// allocates tensors of wire_shapes() / wire_dtypes(), receives them and decode()s them into the
/// slice (any float dtype; the link casts it to its own). Both ends call wire_shapes() and
/// wire_dtypes() with the same micro-batch, call flags and slice length, so their answers must
/// depend on those alone (plan data, never tensor values). `msg.dir` is the local side's
/// direction (kSendBackward on the sender, kRecvBackward on the receiver). At most
/// kMaxPayloadParts tensors per message.
class MessageCodec {
 public:
  virtual ~MessageCodec() = default;
  virtual std::vector<std::vector<int64_t>> wire_shapes(const P2PMessage& msg, const P2PCall& call,
                                                        int64_t slice_numel) const = 0;
  /// Per-part dtypes aligned with wire_shapes(); empty (the default) = the link's dtype for all.
  virtual std::vector<torch::ScalarType> wire_dtypes(const P2PMessage& msg, const P2PCall& call,
                                                     int64_t slice_numel) const {
    return {};
  }
  virtual std::vector<torch::Tensor> encode(const P2PMessage& msg, const P2PCall& call,
                                            const torch::Tensor& slice) = 0;  // slice [N/t]
  /// Returns the flat slice [slice_numel].
  virtual torch::Tensor decode(const P2PMessage& msg, const P2PCall& call,
                               const std::vector<torch::Tensor>& wire, int64_t slice_numel) = 0;
};

/// No compression: the slice itself is the one wire tensor [slice_numel].
class IdentityCodec : public MessageCodec {
 public:
  std::vector<std::vector<int64_t>> wire_shapes(const P2PMessage&, const P2PCall&,
                                                int64_t slice_numel) const override;
  std::vector<torch::Tensor> encode(const P2PMessage&, const P2PCall&,
                                    const torch::Tensor& slice) override;
  torch::Tensor decode(const P2PMessage&, const P2PCall&, const std::vector<torch::Tensor>& wire,
                       int64_t slice_numel) override;
};

constexpr int kMaxPayloadParts = 8;

/// Logical shapes of this stage's two boundaries. Both ends of a boundary must agree (stage k's
/// output == stage k+1's input); they may differ between boundaries (h changing with the stage).
struct StageLinkShapes {
  std::vector<int64_t> input;   // [s, b, h_in]:  activation from stage-1 = gradient sent back to it
  std::vector<int64_t> output;  // [s, b, h_out]: activation to stage+1 = gradient received from it
};

class StageLink {
 public:
  /// `pipeline`: this rank's pipeline group, group rank == stage. `tensor_parallel`: this rank's TP
  /// group, or null (no scatter-gather). Both must outlive the link. `options`: dtype and device of
  /// messages (fp32 CPU by default). `codec`: null = IdentityCodec; used for every message (a codec
  /// that compresses only gradients passes forward messages through). `chunks`: model chunks per
  /// stage (the schedule's; >= 1, else std::invalid_argument).
  StageLink(Communicator& pipeline, Communicator* tensor_parallel, StageLinkShapes shapes,
            torch::TensorOptions options = torch::kFloat,
            std::shared_ptr<MessageCodec> codec = nullptr, int chunks = 1);

  int stage() const { return pipeline_.rank(); }
  int stages() const { return pipeline_.size(); }
  int chunks() const { return chunks_; }
  bool is_first_stage() const { return stage() == 0; }
  bool is_last_stage() const { return stage() == stages() - 1; }
  const StageLinkShapes& shapes() const { return shapes_; }
  /// Between steps only, on every stage alike (e.g. a new sequence length).
  void set_shapes(StageLinkShapes shapes) { shapes_ = std::move(shapes); }
  /// Whether messages of this shape travel as 1/t slices.
  bool scatter_gather(at::IntArrayRef shape) const;

  /// Runs one call: posts all its messages, waits on all, returns one tensor per message, aligned
  /// with call.messages: the received tensor for a receive (forward activations as fresh leaves
  /// with requires_grad = true, gradients without), undefined for a send. `send_tensors` is aligned
  /// likewise: the tensor of each send (its logical shape, the link's dtype), ignored for receives.
  std::vector<torch::Tensor> execute(const P2PCall& call,
                                     const std::vector<torch::Tensor>& send_tensors);

  /// execute() in two halves, for calls the schedule does not wait on (P2PCall::wait false):
  /// start() checks and posts the call's messages and returns at once; finish() waits on every
  /// one of them and returns what execute() would. Every started call must be finished, before
  /// the step ends (its buffers live in the Posted until then).
  struct PostedState;
  struct Posted {
    P2PCall call;
    std::shared_ptr<PostedState> state;
  };
  Posted start(const P2PCall& call, const std::vector<torch::Tensor>& send_tensors);
  std::vector<torch::Tensor> finish(Posted& posted);

  // Megatron's vocabulary, each one call. As in Megatron, directions without a neighbour are
  // no-ops (recv_forward on stage 0's chunk 0 and recv_backward on the last stage return
  // undefined; send_forward on the last stage's last chunk does nothing). `chunk`: this stage's
  // model chunk (interleaved; its peer is the next or previous virtual stage, around the ring).
  // Gradient-only calls are flush calls, their gradient in the epilogue, unless told otherwise
  // (schedule.h's P2PCall::flush and P2PMessage::epilogue).
  void send_forward(const torch::Tensor& output, int mb, int chunk = 0);
  torch::Tensor recv_forward(int mb, int chunk = 0);
  void send_backward(const torch::Tensor& input_grad, int mb, bool flush = true);
  torch::Tensor recv_backward(int mb, bool flush = true);
  torch::Tensor send_forward_recv_backward(const torch::Tensor& output, int send_mb, int recv_mb);
  torch::Tensor send_backward_recv_forward(const torch::Tensor& input_grad, int send_mb,
                                           int recv_mb);

 private:
  struct Pending;
  const std::vector<int64_t>& shape_of(const P2PMessage& msg) const;
  void post(const P2PCall& call, size_t index, const torch::Tensor& send_tensor, Pending& pending);
  torch::Tensor finish_recv(const P2PCall& call, size_t index, Pending& pending);
  std::string where(const P2PCall& call, size_t index) const;

  Communicator& pipeline_;
  Communicator* tp_;
  StageLinkShapes shapes_;
  torch::TensorOptions options_;
  std::shared_ptr<MessageCodec> codec_;
  int chunks_;
};

}  // namespace optcc

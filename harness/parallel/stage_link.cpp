// Point-to-point between adjacent pipeline stages (see stage_link.h).
#include "harness/parallel/stage_link.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <utility>

#include "harness/parallel/timeline.h"

namespace optcc {
namespace {

bool is_forward(P2PDir d) {
  return d == P2PDir::kSendForward || d == P2PDir::kRecvForward;
}
bool is_send(P2PDir d) {
  return d == P2PDir::kSendForward || d == P2PDir::kSendBackward;
}
Traffic traffic_of(P2PDir d) {
  return is_forward(d) ? Traffic::kPipelineForward : Traffic::kPipelineBackward;
}

int64_t numel_of(at::IntArrayRef shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Every wire tensor's tag names its direction, micro-batch, the sender's model chunk and payload
// part (BR-11 in docs/faults.md); both ends compute the same tag (the receiver names the sender's chunk peer_chunk).
constexpr int kMaxChunkTags = 64;
int tag_of(const P2PMessage& m, size_t part) {
  const int sender_chunk = is_send(m.dir) ? m.chunk : m.peer_chunk;
  return ((m.microbatch * 2 + (is_forward(m.dir) ? 0 : 1)) * kMaxChunkTags + sender_chunk) * kMaxPayloadParts +
         static_cast<int>(part);
}

// The virtual stage at the other end of a message from `stage`'s chunk m.chunk: the next one for
// kSendForward / kRecvBackward, the previous one otherwise (schedule.h's ring; none past either end).
VirtualStage peer_of(const P2PMessage& m, int stage, int stages, int chunks) {
  const bool to_next = m.dir == P2PDir::kSendForward || m.dir == P2PDir::kRecvBackward;
  return to_next ? next_virtual_stage(stage, m.chunk, stages, chunks)
                 : previous_virtual_stage(stage, m.chunk, stages, chunks);
}

std::string shape_str(at::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

// ---- IdentityCodec ----

std::vector<std::vector<int64_t>> IdentityCodec::wire_shapes(const P2PMessage&, const P2PCall&,
                                                             int64_t slice_numel) const {
  return {{slice_numel}};
}

std::vector<torch::Tensor> IdentityCodec::encode(const P2PMessage&, const P2PCall&,
                                                 const torch::Tensor& slice) {
  return {slice};
}

torch::Tensor IdentityCodec::decode(const P2PMessage&, const P2PCall&,
                                    const std::vector<torch::Tensor>& wire, int64_t) {
  return wire.at(0);
}

// ---- StageLink ----

struct StageLink::Pending {
  std::vector<torch::Tensor> wire;  // posted buffers; alive until every handle is waited on
  std::vector<CommHandle> handles;
};

StageLink::StageLink(Communicator& pipeline, Communicator* tensor_parallel, StageLinkShapes shapes,
                     torch::TensorOptions options, std::shared_ptr<MessageCodec> codec, int chunks)
    : pipeline_(pipeline),
      tp_(tensor_parallel),
      shapes_(std::move(shapes)),
      options_(options),
      codec_(codec ? std::move(codec) : std::make_shared<IdentityCodec>()),
      chunks_(chunks) {
  if (chunks < 1 || chunks > kMaxChunkTags) {
    throw std::invalid_argument(fmt::format("StageLink: {} model chunks per stage; need 1..{}", chunks, kMaxChunkTags));
  }
}

bool StageLink::scatter_gather(at::IntArrayRef shape) const {
  return tp_ && tp_->size() > 1 && numel_of(shape) % tp_->size() == 0;
}

const std::vector<int64_t>& StageLink::shape_of(const P2PMessage& m) const {
  const bool at_input = m.dir == P2PDir::kRecvForward || m.dir == P2PDir::kSendBackward;
  return at_input ? shapes_.input : shapes_.output;
}

std::string StageLink::where(const P2PCall& call, size_t index) const {
  const P2PMessage& m = call.messages[index];
  const bool chunked = m.chunk != 0 || m.peer_chunk != 0;
  return fmt::format("pipeline stage {} of {}, call {} ({}{}), {} mb {}{} {} stage {}{}", stage(),
                     stages(), to_string(call), to_string(call.phase), call.flush ? ", flush" : "",
                     to_string(m.dir), m.microbatch, chunked ? fmt::format(" of chunk {}", m.chunk) : "",
                     is_send(m.dir) ? "to" : "from", m.peer_stage,
                     chunked ? fmt::format(" chunk {}", m.peer_chunk) : "");
}

struct StageLink::PostedState {
  std::vector<Pending> pending;
};

std::vector<torch::Tensor> StageLink::execute(const P2PCall& call,
                                              const std::vector<torch::Tensor>& send_tensors) {
  Posted posted = start(call, send_tensors);
  return finish(posted);
}

StageLink::Posted StageLink::start(const P2PCall& call, const std::vector<torch::Tensor>& send_tensors) {
  const size_t n = call.messages.size();
  if (send_tensors.size() != n) {
    throw std::invalid_argument(
        fmt::format("pipeline stage {}: call {} has {} messages but {} send "
                    "tensors were given (align them with the messages)",
                    stage(), to_string(call), n, send_tensors.size()));
  }
  // Check everything before posting anything, so a bad call never leaves half-posted messages.
  for (size_t i = 0; i < n; ++i) {
    const P2PMessage& m = call.messages[i];
    const VirtualStage peer = m.chunk >= 0 && m.chunk < chunks_ ? peer_of(m, stage(), stages(), chunks_)
                                                                 : VirtualStage{-1, -1};
    if (!peer.exists()) {
      throw std::invalid_argument(fmt::format("{}: there is no virtual stage at that end of stage {}'s chunk {}",
                                              where(call, i), stage(), m.chunk));
    }
    if (m.peer_stage != peer.stage || m.peer_chunk != peer.chunk) {
      throw std::invalid_argument(fmt::format("{}: the peer must be stage {} (chunk {}) of 0..{}", where(call, i),
                                              peer.stage, peer.chunk, stages() - 1));
    }
    if (!is_send(m.dir)) continue;
    const torch::Tensor& t = send_tensors[i];
    if (!t.defined() || t.sizes() != at::IntArrayRef(shape_of(m)) ||
        t.scalar_type() != options_.dtype()) {
      throw std::invalid_argument(fmt::format(
          "{}: expected a {} tensor of shape {} (the link's {} shape), got {}", where(call, i),
          c10::toString(c10::typeMetaToScalarType(options_.dtype())), shape_str(shape_of(m)),
          &shape_of(m) == &shapes_.input ? "input" : "output",
          t.defined() ? fmt::format("{} {}", c10::toString(t.scalar_type()), shape_str(t.sizes()))
                      : std::string("an undefined tensor")));
    }
  }
  Posted posted{call, std::make_shared<PostedState>()};
  std::vector<Pending>& pending = posted.state->pending;
  pending.resize(n);
  for (size_t i = 0; i < n; ++i) post(call, i, send_tensors[i], pending[i]);
  return posted;
}

std::vector<torch::Tensor> StageLink::finish(Posted& posted) {
  if (!posted.state) {
    throw std::logic_error(fmt::format("pipeline stage {}: call {} finished twice", stage(), to_string(posted.call)));
  }
  const P2PCall& call = posted.call;
  const size_t n = call.messages.size();
  std::vector<Pending>& pending = posted.state->pending;
  for (size_t i = 0; i < n; ++i) {  // BR-13: every handle, not just one per call
    for (CommHandle& h : pending[i].handles) {
      try {
        h.wait();
      } catch (const CommError& e) {
        throw CommError(fmt::format("{}: {}", where(call, i), e.what()));
      }
    }
  }
  std::vector<torch::Tensor> received(n);
  for (size_t i = 0; i < n; ++i) {
    if (!is_send(call.messages[i].dir)) received[i] = finish_recv(call, i, pending[i]);
  }
  posted.state.reset();
  return received;
}

void StageLink::post(const P2PCall& call, size_t index, const torch::Tensor& send_tensor,
                     Pending& p) {
  const P2PMessage& m = call.messages[index];
  MicrobatchContext mb_context(m.microbatch);  // the message's events carry its micro-batch
  const std::vector<int64_t>& shape = shape_of(m);
  const bool sg = scatter_gather(shape);
  const int64_t slice_numel = sg ? numel_of(shape) / tp_->size() : numel_of(shape);
  const std::vector<std::vector<int64_t>> wire_shapes = codec_->wire_shapes(m, call, slice_numel);
  if (wire_shapes.empty() || wire_shapes.size() > static_cast<size_t>(kMaxPayloadParts)) {
    throw std::invalid_argument(fmt::format("{}: the codec gives {} payload tensors; need 1..{}",
                                            where(call, index), wire_shapes.size(),
                                            kMaxPayloadParts));
  }
  std::vector<torch::ScalarType> wire_dtypes = codec_->wire_dtypes(m, call, slice_numel);
  if (wire_dtypes.empty()) wire_dtypes.assign(wire_shapes.size(), c10::typeMetaToScalarType(options_.dtype()));
  if (wire_dtypes.size() != wire_shapes.size()) {
    throw std::invalid_argument(fmt::format("{}: the codec gives {} wire dtypes for {} parts",
                                            where(call, index), wire_dtypes.size(), wire_shapes.size()));
  }
  const Traffic cls = traffic_of(m.dir);
  if (is_send(m.dir)) {
    const torch::Tensor flat = send_tensor.detach().contiguous().view({-1});
    const torch::Tensor slice = sg ? flat.narrow(0, tp_->rank() * slice_numel, slice_numel) : flat;
    for (const torch::Tensor& w : codec_->encode(m, call, slice)) p.wire.push_back(w.contiguous());
    bool as_announced = p.wire.size() == wire_shapes.size();  // the receiver allocates those
    for (size_t k = 0; as_announced && k < p.wire.size(); ++k) {
      as_announced = p.wire[k].sizes() == at::IntArrayRef(wire_shapes[k]) &&
                     p.wire[k].scalar_type() == wire_dtypes[k];
    }
    if (!as_announced) {
      std::vector<std::string> got, announced;
      for (const torch::Tensor& w : p.wire) {
        got.push_back(fmt::format("{}{}", c10::toString(w.scalar_type()), shape_str(w.sizes())));
      }
      for (size_t k = 0; k < wire_shapes.size(); ++k) {
        announced.push_back(fmt::format("{}{}", c10::toString(wire_dtypes[k]), shape_str(wire_shapes[k])));
      }
      throw std::invalid_argument(fmt::format(
          "{}: the codec encoded {} but announced {} to the receiver", where(call, index),
          fmt::join(got, " "), fmt::join(announced, " ")));
    }
    for (size_t k = 0; k < p.wire.size(); ++k) {
      p.handles.push_back(pipeline_.send(p.wire[k], m.peer_stage, cls, tag_of(m, k)));
    }
  } else {
    for (size_t k = 0; k < wire_shapes.size(); ++k) {
      p.wire.push_back(torch::empty(wire_shapes[k], options_.dtype(wire_dtypes[k])));
      p.handles.push_back(pipeline_.recv(p.wire.back(), m.peer_stage, cls, tag_of(m, k)));
    }
  }
}

torch::Tensor StageLink::finish_recv(const P2PCall& call, size_t index, Pending& p) {
  const P2PMessage& m = call.messages[index];
  const std::vector<int64_t>& shape = shape_of(m);
  const bool sg = scatter_gather(shape);
  const int64_t slice_numel = sg ? numel_of(shape) / tp_->size() : numel_of(shape);
  MicrobatchContext mb_context(m.microbatch);
  torch::Tensor slice = codec_->decode(m, call, p.wire, slice_numel);
  p.wire.clear();
  if (slice.numel() != slice_numel) {
    throw std::invalid_argument(fmt::format("{}: the codec decoded {} elements, expected {}",
                                            where(call, index), slice.numel(), slice_numel));
  }
  slice = slice.to(c10::typeMetaToScalarType(options_.dtype())).contiguous().view({-1});
  // The intra-node hop of scatter-gather, counted under the message's own class (stage_link.h).
  const torch::Tensor flat = sg ? tp_->all_gather(slice, traffic_of(m.dir), 0) : slice;
  torch::Tensor t = flat.view(shape);
  if (is_forward(m.dir)) t = t.detach().requires_grad_(true);  // a fresh leaf: its .grad is dL/dx
  return t;
}

// ---- Megatron's vocabulary ----

void StageLink::send_forward(const torch::Tensor& output, int mb, int chunk) {
  const VirtualStage peer = next_virtual_stage(stage(), chunk, stages(), chunks_);
  if (!peer.exists()) return;
  execute({{{P2PDir::kSendForward, mb, peer.stage, chunk, peer.chunk}}, PipePhase::kWarmup, false}, {output});
}

torch::Tensor StageLink::recv_forward(int mb, int chunk) {
  const VirtualStage peer = previous_virtual_stage(stage(), chunk, stages(), chunks_);
  if (!peer.exists()) return {};
  return execute({{{P2PDir::kRecvForward, mb, peer.stage, chunk, peer.chunk}}, PipePhase::kWarmup, false}, {{}})[0];
}

void StageLink::send_backward(const torch::Tensor& input_grad, int mb, bool flush) {
  if (is_first_stage()) return;
  const PipePhase phase = flush ? PipePhase::kCooldown : PipePhase::kSteady;
  execute({{{P2PDir::kSendBackward, mb, stage() - 1, 0, 0, flush}}, phase, flush}, {input_grad});
}

torch::Tensor StageLink::recv_backward(int mb, bool flush) {
  if (is_last_stage()) return {};
  const PipePhase phase = flush ? PipePhase::kCooldown : PipePhase::kSteady;
  return execute({{{P2PDir::kRecvBackward, mb, stage() + 1, 0, 0, flush}}, phase, flush}, {{}})[0];
}

torch::Tensor StageLink::send_forward_recv_backward(const torch::Tensor& output, int send_mb,
                                                    int recv_mb) {
  if (is_last_stage()) return {};
  const P2PCall call{
      {{P2PDir::kSendForward, send_mb, stage() + 1}, {P2PDir::kRecvBackward, recv_mb, stage() + 1}},
      PipePhase::kSteady,
      false};
  return execute(call, {output, {}})[1];
}

torch::Tensor StageLink::send_backward_recv_forward(const torch::Tensor& input_grad, int send_mb,
                                                    int recv_mb) {
  if (is_first_stage()) return {};
  const P2PCall call{
      {{P2PDir::kSendBackward, send_mb, stage() - 1}, {P2PDir::kRecvForward, recv_mb, stage() - 1}},
      PipePhase::kSteady,
      false};
  return execute(call, {input_grad, {}})[1];
}

}  // namespace optcc

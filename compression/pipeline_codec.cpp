// Compression policies on pipeline messages (see pipeline_codec.h).
#include "compression/pipeline_codec.h"

#include <fmt/format.h>

#include "compression/codecs.h"
#include "harness/parallel/device.h"
#include "harness/parallel/timeline.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>

namespace optcc {
namespace {

bool is_forward(P2PDir d) { return d == P2PDir::kSendForward || d == P2PDir::kRecvForward; }

std::unique_ptr<ActCodec> drop_none(std::unique_ptr<ActCodec> c) {
  if (c && c->name() == "none") return nullptr;  // `none` is the identity: the plain slice travels
  return c;
}

}  // namespace

PipelineCodec::PipelineCodec(std::unique_ptr<ActCodec> forward, std::unique_ptr<ActCodec> backward,
                             BackwardPhases phases, LepMode lep, double decay)
    : forward_(drop_none(std::move(forward))),
      backward_(drop_none(std::move(backward))),
      policy_{phases, lep, decay} {
  if (!(decay > 0.0 && decay <= 1.0)) {
    throw std::invalid_argument(fmt::format("lep decay {} must be in (0, 1]", decay));
  }
  if (decay != 1.0 && lep != LepMode::kLazyDecay) {
    throw std::invalid_argument(fmt::format("lep decay {} is only used by lep lazy_decay, not {}", decay, to_string(lep)));
  }
}

bool PipelineCodec::compresses(const P2PMessage& msg, const P2PCall& call) const {
  if (is_forward(msg.dir)) return forward_ != nullptr;
  if (!backward_) return false;
  return policy_.compresses_backward_send(msg.epilogue);
}

const ActCodec* PipelineCodec::codec_for(const P2PMessage& msg, const P2PCall& call) const {
  if (!compresses(msg, call)) return nullptr;
  return is_forward(msg.dir) ? forward_.get() : backward_.get();
}

std::vector<std::vector<int64_t>> PipelineCodec::wire_shapes(const P2PMessage& msg,
                                                             const P2PCall& call,
                                                             int64_t slice_numel) const {
  const ActCodec* c = codec_for(msg, call);
  if (!c) return {{slice_numel}};
  return c->wire_shapes(slice_numel);
}

std::vector<torch::ScalarType> PipelineCodec::wire_dtypes(const P2PMessage& msg,
                                                          const P2PCall& call,
                                                          int64_t slice_numel) const {
  const ActCodec* c = codec_for(msg, call);
  if (!c) return {};  // the link's dtype
  return c->wire_dtypes(slice_numel);
}

std::vector<torch::Tensor> PipelineCodec::encode(const P2PMessage& msg, const P2PCall& call,
                                                 const torch::Tensor& slice) {
  const bool forward = is_forward(msg.dir);
  const int64_t raw_bytes = slice.numel() * static_cast<int64_t>(slice.element_size());
  (forward ? stats_.forward_sends : stats_.backward_sends) += 1;
  (forward ? stats_.forward_raw_bytes : stats_.backward_raw_bytes) += raw_bytes;
  ActCodec* c = forward ? forward_.get() : backward_.get();
  if (!compresses(msg, call)) {
    if (lep_diag_ && !forward) diag_acts_.erase(msg.microbatch);  // only compressed sends are diagnosed
    (forward ? stats_.forward_wire_bytes : stats_.backward_wire_bytes) += raw_bytes;
    return {slice};
  }
  SpanTimer timer(slice.device());  // CUDA: events time the GPU's work, not its launch
  TimelineScope event(EventKind::kCompress, Stream::kCompression);  // timeline.h; free when off
  torch::NoGradGuard no_grad;
  const torch::Tensor x0 = slice.to(torch::kFloat);
  torch::Tensor x = x0;
  torch::Tensor* err = nullptr;
  torch::Tensor carried;  // what is added to this send: the buffer, or β·buffer
  int carried_age = -1;
  const int key = lep_key(msg.microbatch, msg.chunk);
  if (!forward && policy_.lep != LepMode::kOff) {
    err = &lep_buffers_[key];
    if (err->defined()) {
      if (err->numel() != x.numel()) {
        throw std::invalid_argument(fmt::format(
            "pipeline codec: the LEP buffer holds {} elements but this slice has {} (the message "
            "size changed between sends; LEP needs one slice size)", err->numel(), x.numel()));
      }
      if (err->device() != x.device()) *err = err->to(x.device());  // read from a checkpoint on the host
      carried = policy_.lep == LepMode::kLazyDecay && policy_.lep_decay != 1.0 ? *err * policy_.lep_decay : *err;
      carried_age = static_cast<int>(iteration_ - lep_made_at_[key]);
      x = x + carried;  // never modifies the caller's tensor
    }
  }
  Payload p = c->encode(x);
  if (err) {
    TimelineScope lep_event(EventKind::kLepUpdate, Stream::kCompression);
    *err = c->last_error();  // (slice + carried) − decode(payload)
    lep_made_at_[key] = iteration_;
    lep_peak_bytes_ = std::max(lep_peak_bytes_, lep_bytes());
  }
  if (!forward) stats_.backward_compressed += 1;
  int64_t wire = 0;
  for (const auto& part : p.parts) wire += part.numel() * static_cast<int64_t>(part.element_size());
  (forward ? stats_.forward_wire_bytes : stats_.backward_wire_bytes) += wire;
  if (check_orth_ && !forward) {
    orth_errors_[msg.microbatch] = err ? err->clone() : c->last_error().clone();
  }
  if (lep_diag_ && !forward) record_lep_send(msg.microbatch, msg.chunk, x0, carried, carried_age, err ? *err : c->last_error());
  stats_.encode_seconds += timer.seconds();
  return p.parts;
}

torch::Tensor PipelineCodec::decode(const P2PMessage& msg, const P2PCall& call,
                                    const std::vector<torch::Tensor>& wire, int64_t slice_numel) {
  const ActCodec* c = codec_for(msg, call);
  torch::Tensor slice;
  if (!c) {
    slice = wire.at(0);
  } else {
    SpanTimer timer(wire.at(0).device());
    TimelineScope event(EventKind::kDecompress, Stream::kCompression);
    slice = c->decode(Payload{wire}, slice_numel);
    stats_.decode_seconds += timer.seconds();
  }
  if (check_orth_ && msg.dir == P2PDir::kRecvForward) {
    orth_acts_[msg.microbatch] = slice.detach().to(torch::kFloat).clone();
  }
  if (lep_diag_ && msg.dir == P2PDir::kRecvForward && backward_) {
    diag_acts_[msg.microbatch] = slice.detach().to(torch::kFloat).clone();
  }
  return slice;
}

// One LepSendRecord; `carried` undefined when nothing was carried. The activation of this
// micro-batch moves to lep_src_acts_ when the mode keeps the error, for the next carried send.
void PipelineCodec::record_lep_send(int mb, int chunk, const torch::Tensor& slice, const torch::Tensor& carried, int carried_age,
                                    const torch::Tensor& new_error) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto cosine = [&](const torch::Tensor& a, const torch::Tensor& b) {
    const double d = a.norm().item<double>() * b.norm().item<double>();
    return d > 0 ? a.dot(b).item<double>() / d : nan;
  };
  LepSendRecord r;
  r.microbatch = mb;
  r.slice_norm = slice.norm().item<double>();
  r.error_norm = new_error.norm().item<double>();
  r.relative_error = r.slice_norm > 0 ? r.error_norm / r.slice_norm : nan;
  r.carried_age = carried.defined() ? carried_age : -1;
  r.carried_norm = carried.defined() ? carried.norm().item<double>() : 0.0;
  r.cos_carried_slice = carried.defined() ? cosine(carried, slice) : nan;
  r.cos_carried_delta = nan;
  const int key = lep_key(mb, chunk);
  auto now = diag_acts_.find(mb);
  auto src = lep_src_acts_.find(key);
  if (carried.defined() && now != diag_acts_.end() && src != lep_src_acts_.end() &&
      src->second.numel() == carried.numel() && now->second.numel() == carried.numel()) {
    r.cos_carried_delta = cosine(carried, src->second - now->second);  // X_src − X_now
  }
  lep_records_.push_back(r);
  if (now != diag_acts_.end()) {
    if (policy_.lep != LepMode::kOff) lep_src_acts_[key] = now->second;
    diag_acts_.erase(now);
  }
}

torch::Tensor PipelineCodec::lep_error(int mb, int chunk) const {
  auto it = lep_buffers_.find(lep_key(mb, chunk));
  return it == lep_buffers_.end() ? torch::Tensor() : it->second;
}

int64_t PipelineCodec::lep_bytes() const {
  int64_t n = 0;
  for (const auto& [mb, t] : lep_buffers_) {
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return n;
}

int64_t PipelineCodec::codec_state_bytes() const {
  int64_t n = 0;
  for (const ActCodec* c : {forward_.get(), backward_.get()}) n += c ? c->state_bytes() : 0;
  return n;
}

void PipelineCodec::begin_step() {
  iteration_ += 1;
  lep_peak_bytes_ = lep_bytes();
  orth_acts_.clear();
  orth_errors_.clear();
  lep_records_.clear();
  diag_acts_.clear();
}

void PipelineCodec::end_step() {
  if (policy_.lep != LepMode::kLazyIteration) return;
  lep_peak_bytes_ = std::max(lep_peak_bytes_, lep_bytes());
  lep_buffers_.clear();  // no error crosses the optimizer step
  lep_made_at_.clear();
  lep_src_acts_.clear();
}

OrthogonalityRecord PipelineCodec::orthogonality() const {
  OrthogonalityRecord r;
  for (const auto& [j, e] : orth_errors_) {
    auto a = orth_acts_.find(j), b = orth_acts_.find(j + 1);
    if (a == orth_acts_.end() || b == orth_acts_.end()) continue;
    const torch::Tensor delta = a->second - b->second;  // X_j − X_{j+1}, this TP rank's slice
    if (delta.numel() != e.numel()) continue;  // slice sizes differ: not comparable
    const double denom = e.norm().item<double>() * delta.norm().item<double>();
    r.microbatch.push_back(j);
    r.cosine.push_back(denom > 0 ? e.dot(delta).item<double>() / denom : 0.0);
    r.error_mean.push_back(e.mean().item<double>());
    r.delta_mean.push_back(delta.mean().item<double>());
  }
  return r;
}

void PipelineCodec::save(torch::serialize::OutputArchive& archive) const {
  const char* names[2] = {"forward", "backward"};
  const ActCodec* codecs[2] = {forward_.get(), backward_.get()};
  for (int i = 0; i < 2; ++i) {
    if (!codecs[i]) continue;
    torch::serialize::OutputArchive sub;
    codecs[i]->save(sub);
    archive.write(names[i], sub);
  }
  torch::serialize::OutputArchive lep;
  std::vector<int64_t> keys;
  for (const auto& [mb, t] : lep_buffers_) {
    if (!t.defined()) continue;
    keys.push_back(mb);
    lep.write(std::to_string(mb), t);
  }
  lep.write("keys", torch::tensor(keys.empty() ? std::vector<int64_t>{-1} : keys, torch::kLong));
  archive.write("lep", lep);
}

void PipelineCodec::load(torch::serialize::InputArchive& archive) {
  const char* names[2] = {"forward", "backward"};
  ActCodec* codecs[2] = {forward_.get(), backward_.get()};
  for (int i = 0; i < 2; ++i) {
    if (!codecs[i]) continue;
    torch::serialize::InputArchive sub;
    archive.read(names[i], sub);
    codecs[i]->load(sub);
  }
  torch::serialize::InputArchive lep;
  archive.read("lep", lep);
  torch::Tensor keys;
  lep.read("keys", keys);
  lep_buffers_.clear();
  for (int64_t i = 0; i < keys.numel(); ++i) {
    const int64_t mb = keys[i].item<int64_t>();
    if (mb < 0) continue;
    torch::Tensor t;
    lep.read(std::to_string(mb), t);
    lep_buffers_[static_cast<int>(mb)] = t;
    lep_made_at_[static_cast<int>(mb)] = iteration_;  // made in the iteration before the next begin_step()
  }
  check_loaded_state();
}

void PipelineCodec::check_loaded_state() const {
  if (!expected_) return;
  const auto expected = expected_state();
  for (const TensorSpec& held : held_state()) {
    auto it = std::find_if(expected.begin(), expected.end(), [&](const TensorSpec& e) { return e.name == held.name; });
    if (it != expected.end() && it->shape == held.shape) continue;
    throw StateMismatch(fmt::format(
        "{} in the checkpoint, {} in this run (this rank sends forward slices of {} and backward slices of {} "
        "elements, {} micro-batches per step)",
        describe(held), it == expected.end() ? "none" : describe_shape(it->shape), expected_->forward_slice,
        expected_->backward_slice, expected_->microbatches));
  }
}

void PipelineCodec::expect_messages(int64_t forward_slice, int64_t backward_slice, int64_t microbatches,
                                    std::vector<int> backward_chunks) {
  expected_ = Messages{forward_slice, backward_slice, microbatches, std::move(backward_chunks)};
}

std::string PipelineCodec::lep_state_name(int key) const {
  const int chunk = key / kChunkKeys, mb = key % kChunkKeys;
  std::string name = chunk == 0 ? "lep" : fmt::format("lep.chunk{}", chunk);
  return policy_.lep == LepMode::kPerMicrobatch ? fmt::format("{}.{}", name, mb) : name;
}

std::vector<TensorSpec> PipelineCodec::expected_state() const {
  std::vector<TensorSpec> out;
  if (!expected_) return out;
  const char* names[2] = {"forward", "backward"};
  const ActCodec* codecs[2] = {forward_.get(), backward_.get()};
  const int64_t slices[2] = {expected_->forward_slice, expected_->backward_slice};
  for (int i = 0; i < 2; ++i) {
    if (!codecs[i] || slices[i] <= 0) continue;
    for (auto spec : codecs[i]->state_for(slices[i])) out.push_back({names[i] + ("." + spec.name), spec.shape});
  }
  if (!backward_ || slices[1] <= 0 || policy_.lep == LepMode::kOff || policy_.lep == LepMode::kLazyIteration) return out;
  const int64_t slots = policy_.lep == LepMode::kPerMicrobatch ? expected_->microbatches : 1;
  for (int chunk : expected_->backward_chunks) {
    for (int64_t mb = 0; mb < slots; ++mb) out.push_back({lep_state_name(lep_key(static_cast<int>(mb), chunk)), {slices[1]}});
  }
  return out;
}

std::vector<TensorSpec> PipelineCodec::held_state() const {
  std::vector<TensorSpec> out;
  const char* names[2] = {"forward", "backward"};
  const ActCodec* codecs[2] = {forward_.get(), backward_.get()};
  for (int i = 0; i < 2; ++i) {
    if (!codecs[i]) continue;
    for (auto spec : codecs[i]->held_state()) out.push_back({names[i] + ("." + spec.name), spec.shape});
  }
  for (const auto& [key, t] : lep_buffers_) {
    if (t.defined()) out.push_back({lep_state_name(key), t.sizes().vec()});
  }
  return out;
}

PipelineCodec::Snapshot PipelineCodec::snapshot() const {
  Snapshot s;
  s.forward = forward_ ? forward_->clone() : nullptr;
  s.backward = backward_ ? backward_->clone() : nullptr;
  for (const auto& [key, t] : lep_buffers_) s.lep_buffers[key] = t.defined() ? t.clone() : t;
  s.lep_made_at = lep_made_at_;
  s.iteration = iteration_;
  return s;
}

void PipelineCodec::restore(Snapshot s) {
  forward_ = std::move(s.forward);
  backward_ = std::move(s.backward);
  lep_buffers_ = std::move(s.lep_buffers);
  lep_made_at_ = std::move(s.lep_made_at);
  iteration_ = s.iteration;
}

std::shared_ptr<PipelineCodec> PipelineCodec::fork() const {
  auto f = std::make_shared<PipelineCodec>(forward_ ? forward_->clone() : nullptr,
                                           backward_ ? backward_->clone() : nullptr, policy_.phases, policy_.lep, policy_.lep_decay);
  for (const auto& [mb, t] : lep_buffers_) f->lep_buffers_[mb] = t.defined() ? t.clone() : t;
  f->lep_made_at_ = lep_made_at_;
  f->iteration_ = iteration_;
  f->expected_ = expected_;
  return f;
}

}  // namespace optcc

#include "harness/parallel/communicator.h"

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO  // LibTorch's Gloo header is guarded by the macro its own build defines
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

#include "harness/parallel/device.h"
#include "harness/parallel/link_emulator.h"
#include "harness/parallel/timeline.h"

namespace optcc {
namespace {

using Clock = std::chrono::steady_clock;

int64_t nbytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

const char* traffic_name(Traffic t) {
  switch (t) {
    case Traffic::kTensorParallel: return "tp";
    case Traffic::kPipelineForward: return "pp_fwd";
    case Traffic::kPipelineBackward: return "pp_bwd";
    case Traffic::kDataParallel: return "dp";
    case Traffic::kEmbedding: return "embedding";
    case Traffic::kControl: return "control";
    case Traffic::kOuter: return "outer";
  }
  return "?";
}

const char* link_name(Link l) { return l == Link::kIntraNode ? "intra" : "inter"; }

void TrafficMeter::record(Traffic cls, Link link, int64_t bytes, double seconds, double emulated_seconds,
                          bool point_to_point) {
  auto& c = c_[static_cast<int>(cls)][static_cast<int>(link)];
  c.bytes += bytes;
  if (point_to_point) c.p2p_bytes += bytes;
  c.calls += 1;
  c.seconds += seconds;
  c.emulated_seconds += emulated_seconds;
}

const TrafficCounters& TrafficMeter::at(Traffic cls, Link link) const {
  return c_[static_cast<int>(cls)][static_cast<int>(link)];
}

TrafficCounters TrafficMeter::total() const {
  TrafficCounters t;
  for (const auto& per_class : c_) {
    for (const auto& c : per_class) {
      t.bytes += c.bytes;
      t.p2p_bytes += c.p2p_bytes;
      t.calls += c.calls;
      t.seconds += c.seconds;
      t.emulated_seconds += c.emulated_seconds;
    }
  }
  return t;
}

void TrafficMeter::reset() { c_ = {}; }

Communicator::Communicator(ProcessGroupPtr pg, std::vector<int> global_ranks, int my_global_rank,
                           std::string name, Link link, TrafficMeter* meter,
                           std::chrono::milliseconds timeout)
    : pg_(std::move(pg)), ranks_(std::move(global_ranks)), name_(std::move(name)), link_(link),
      meter_(meter), timeout_(timeout) {
  auto it = std::find(ranks_.begin(), ranks_.end(), my_global_rank);
  TORCH_CHECK(it != ranks_.end(), "Communicator ", name_, ": rank ", my_global_rank, " is not a member");
  rank_ = static_cast<int>(it - ranks_.begin());
  TORCH_CHECK(size() == 1 || pg_, "Communicator ", name_, ": a group of ", size(), " ranks needs a process group");
}

Communicator::~Communicator() = default;

std::string Communicator::describe(const std::string& op, int64_t bytes) const {
  std::string where;
  const std::set<std::string> hosts(member_hosts_.begin(), member_hosts_.end());
  if (hosts.size() > 1 && member_hosts_.size() == ranks_.size()) {
    std::vector<std::string> order;  // other hosts, in the order of their first member
    std::map<std::string, std::vector<int>> ranks_on;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (member_hosts_[i] == member_hosts_[rank_]) continue;
      if (ranks_on[member_hosts_[i]].empty()) order.push_back(member_hosts_[i]);
      ranks_on[member_hosts_[i]].push_back(ranks_[i]);
    }
    std::vector<std::string> parts;
    for (const auto& h : order) {
      parts.push_back(fmt::format("rank{} {} on {}", ranks_on[h].size() > 1 ? "s" : "", fmt::join(ranks_on[h], ","), h));
    }
    where = fmt::format(" [this rank on {}; across hosts: {}]", member_hosts_[rank_], fmt::join(parts, "; "));
  }
  return fmt::format("rank {} (group {}, group rank {} of {}): {} of {} bytes{}", ranks_[rank_], name_,
                     rank_, size(), op, bytes, where);
}

void Communicator::record(Traffic cls, int64_t bytes, double seconds, double emulated_seconds, bool point_to_point) {
  if (meter_) meter_->record(cls, link_, bytes, seconds, emulated_seconds, point_to_point);
}

void Communicator::settle() const {
  if (backend_device_.is_cuda()) synchronize(backend_device_);
}

torch::Tensor Communicator::staged(const torch::Tensor& t) const {
  return t.to(backend_device_).contiguous();
}

void Communicator::wait_work(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
  try {
    if (!work->wait(timeout_)) throw std::runtime_error("timed out");
    settle();  // NCCL's wait() only orders the caller's stream: the host waits for the GPU here
  } catch (const std::exception& e) {
    throw CommError(fmt::format("{} failed after at most {} ms: {}. A peer rank has probably failed or "
                                "is stuck; see its own error.",
                                what, timeout_.count(), e.what()));
  }
}

void Communicator::all_reduce(torch::Tensor& t, Traffic cls, bool max) {
  if (size() == 1) return;
  TORCH_CHECK(t.is_contiguous(), "all_reduce needs a contiguous tensor");
  const torch::ScalarType wire = wire_dtype_[static_cast<int>(cls)];
  if (wire != torch::kByte && wire != torch::kFloat && wire != t.scalar_type() && !max &&
      t.is_floating_point()) {
    torch::NoGradGuard no_grad;
    torch::Tensor cast = t.to(wire);
    all_reduce(cast, cls, max);  // the cast tensor's dtype equals `wire`: no further cast
    t.copy_(cast);
    return;
  }
  if (t.device() != backend_device_) {  // host staging (Gloo) or to the rank's GPU (NCCL)
    torch::NoGradGuard no_grad;
    torch::Tensor w = staged(t);
    all_reduce(w, cls, max);
    t.copy_(w);
    return;
  }
  if (emu_ && skip_collective(cls)) return;  // network.skip: the local tensor stays
  if (t.scalar_type() == torch::kBFloat16 && !max && !backend_device_.is_cuda()) {
    all_reduce_summing_in_fp32(t, cls);  // Gloo has no bf16 arithmetic
    return;
  }
  settle();
  const auto t0 = Clock::now();
  std::vector<torch::Tensor> ts{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  wait_work(pg_->allreduce(ts, opts), describe("all_reduce", nbytes(t)));
  finish_collective(cls, CollectiveKind::kAllReduce, nbytes(t), 2 * (size() - 1) * nbytes(t) / size(), t0);
}

torch::Tensor Communicator::moved_bits(const torch::Tensor& t) const {
  if (t.scalar_type() != torch::kBFloat16 || backend_device_.is_cuda()) return t;
  return t.view(torch::kHalf);  // same storage and bits: what arrives is written into t
}

void Communicator::all_reduce_summing_in_fp32(torch::Tensor& t, Traffic cls) {
  if (size() == 1) return;
  TORCH_CHECK(t.is_contiguous(), "all_reduce_summing_in_fp32 needs a contiguous tensor");
  TORCH_CHECK(t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kFloat,
              "all_reduce_summing_in_fp32: fp16, bf16 or fp32 tensors only, got ", t.scalar_type());
  if (t.scalar_type() == torch::kFloat) {
    all_reduce(t, cls);
    return;
  }
  if (t.device() != backend_device_) {
    torch::NoGradGuard no_grad;
    torch::Tensor w = staged(t);
    all_reduce_summing_in_fp32(w, cls);
    t.copy_(w);
    return;
  }
  if (emu_ && skip_collective(cls)) return;  // network.skip: the local tensor stays
  torch::NoGradGuard no_grad;
  settle();
  const auto t0 = Clock::now();
  const torch::ScalarType dtype = t.scalar_type();
  const int64_t n = size(), numel = t.numel(), chunk = (numel + n - 1) / n;
  auto padded = torch::zeros({n * chunk}, t.options());
  padded.narrow(0, 0, numel).copy_(t.view({-1}));
  auto send = moved_bits(padded);         // Gloo: bf16 travels as fp16 bits (no rounding)
  auto chunks = torch::empty_like(send);  // [n * chunk]: chunk `rank_` of every rank, in group-rank order
  std::vector<int64_t> equal(static_cast<size_t>(n), chunk);
  wait_work(pg_->alltoall_base(chunks, send, equal, equal), describe("all_reduce (fp32 sum: all-to-all)", nbytes(t)));
  auto mine = chunks.view(dtype).view({n, chunk}).to(torch::kFloat).sum(0).to(dtype);  // rounded once
  std::vector<torch::Tensor> inputs{moved_bits(mine)};
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int64_t i = 0; i < n; ++i) outputs[0].push_back(torch::empty({chunk}, inputs[0].options()));
  wait_work(pg_->allgather(outputs, inputs), describe("all_reduce (fp32 sum: all-gather)", nbytes(t)));
  const auto summed = torch::cat(outputs[0]).view(dtype).narrow(0, 0, numel);
  t.view({-1}).copy_(summed);
  finish_collective(cls, CollectiveKind::kAllReduce, nbytes(t), summing_in_fp32_sent_bytes(n, numel, t.element_size()), t0);
}

int64_t Communicator::summing_in_fp32_sent_bytes(int64_t n, int64_t numel, int64_t element_bytes) {
  if (n <= 1) return 0;
  const int64_t chunk = (numel + n - 1) / n;  // the tensor is padded to n equal chunks
  return 2 * (n - 1) * chunk * element_bytes;  // all-to-all (n-1 chunks out) + all-gather (n-1 copies)
}

torch::Tensor Communicator::all_gather(const torch::Tensor& local, Traffic cls, int64_t dim) {
  if (size() == 1) return local;
  if (local.device() != backend_device_) return all_gather(staged(local), cls, dim).to(local.device());
  settle();
  const auto t0 = Clock::now();
  auto in = local.contiguous();
  std::vector<torch::Tensor> inputs{moved_bits(in)};
  std::vector<std::vector<torch::Tensor>> outputs(1);
  const bool skip = emu_ && skip_collective(cls);
  for (int i = 0; i < size(); ++i) outputs[0].push_back(skip && i != rank_ ? torch::zeros_like(in) : torch::empty_like(in));
  std::vector<std::vector<torch::Tensor>> wire_outputs(1);  // the same storage as outputs (bf16 as fp16 bits)
  for (auto& o : outputs[0]) wire_outputs[0].push_back(moved_bits(o));
  if (skip) {  // network.skip: this rank's part in its slot, zeros elsewhere
    outputs[0][rank_].copy_(in);
    return torch::cat(outputs[0], dim);
  }
  wait_work(pg_->allgather(wire_outputs, inputs), describe("all_gather", nbytes(in)));
  finish_collective(cls, CollectiveKind::kAllGather, nbytes(in), (size() - 1) * nbytes(in), t0);
  return torch::cat(outputs[0], dim);
}

torch::Tensor Communicator::reduce_scatter(const torch::Tensor& input, Traffic cls) {
  TORCH_CHECK(input.size(0) % size() == 0, "reduce_scatter: dim 0 (", input.size(0),
              ") must be divisible by the group size ", size());
  if (size() == 1) return input;
  if (input.device() != backend_device_) return reduce_scatter(staged(input), cls).to(input.device());
  settle();
  const auto t0 = Clock::now();
  auto buf = input.contiguous().clone();
  std::vector<torch::Tensor> ts{buf};
  if (!(emu_ && skip_collective(cls))) {  // network.skip: this rank's slice of its own input
    wait_work(pg_->allreduce(ts), describe("reduce_scatter (all_reduce fallback)", nbytes(buf)));
    finish_collective(cls, CollectiveKind::kReduceScatter, nbytes(buf), (size() - 1) * nbytes(buf) / size(), t0);
  }
  const int64_t chunk = input.size(0) / size();
  return buf.narrow(0, rank_ * chunk, chunk).clone();
}

void Communicator::broadcast(torch::Tensor& t, int root, Traffic cls) {
  if (size() == 1) return;
  if (t.device() != backend_device_) {
    torch::NoGradGuard no_grad;
    torch::Tensor w = staged(t);
    broadcast(w, root, cls);
    t.copy_(w);
    return;
  }
  if (emu_ && skip_collective(cls)) return;  // network.skip: the local tensor stays
  settle();
  const auto t0 = Clock::now();
  std::vector<torch::Tensor> ts{moved_bits(t)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  wait_work(pg_->broadcast(ts, opts), describe("broadcast", nbytes(t)));
  finish_collective(cls, CollectiveKind::kBroadcast, nbytes(t), (size() - 1) * nbytes(t) / size(), t0);
}

void Communicator::barrier() {
  if (size() == 1) return;
  wait_work(pg_->barrier(), describe("barrier", 0));
}

CommHandle Communicator::post_p2p(bool is_send, torch::Tensor& t, int peer, Traffic cls, int tag) {
  const char* op = is_send ? "send" : "recv";
  TORCH_CHECK(t.is_contiguous(), op, " needs a contiguous tensor");
  TORCH_CHECK(peer != rank_ && peer >= 0 && peer < size(), op, ": bad peer ", peer, " in group ", name_);
  TORCH_CHECK(tag >= 0 && tag < kHeaderTagOffset, op, ": tag ", tag, " outside [0, ", kHeaderTagOffset, ")");
  CommHandle h;
  torch::Tensor wire = t;
  if (t.device() != backend_device_) {  // staged: a send copies now, a receive copies back in wait()
    wire = is_send ? staged(t) : torch::empty(t.sizes(), t.options().device(backend_device_));
    h.staged_ = wire;
    if (!is_send) h.target_ = t;
  }
  std::vector<torch::Tensor> ts{moved_bits(wire)};
  settle();
  h.start_ = Clock::now();
  h.comm_ = this;
  h.what_ = describe(fmt::format("{} {} group rank {} (tag {})", op, is_send ? "to" : "from", peer, tag), nbytes(t));
  h.cls_ = cls;
  h.bytes_ = is_send ? nbytes(t) : 0;  // the sender accounts the bytes
  h.is_send_ = is_send, h.peer_ = peer, h.payload_bytes_ = nbytes(t);
  if (emu_ && emu_->skips(cls)) {  // network.skip: nothing travels; a receive yields zeros
    if (!is_send) t.zero_();
    h.skipped_ = true;
    h.microbatch_ = Timeline::current_microbatch();
    return h;
  }
  h.work_ = is_send ? pg_->send(ts, peer, tag) : pg_->recv(ts, peer, tag);
  post_header(h, tag);  // only with emulation or an active timeline
  return h;
}

CommHandle Communicator::send(const torch::Tensor& t, int peer, Traffic cls, int tag) {
  torch::Tensor shallow = t;  // c10d takes non-const tensors; a send never writes them
  return post_p2p(true, shallow, peer, cls, tag);
}

CommHandle Communicator::recv(torch::Tensor& t, int peer, Traffic cls, int tag) {
  return post_p2p(false, t, peer, cls, tag);
}

void CommHandle::wait() {
  if (!work_ && !skipped_) return;
  auto work = std::move(work_);
  work_.reset();
  if (work) comm_->wait_work(work, what_);
  if (target_.defined()) {  // a staged receive lands on its tensor's device
    torch::NoGradGuard no_grad;
    target_.copy_(staged_);
  }
  staged_ = torch::Tensor(), target_ = torch::Tensor();
  for (auto* side : {&header_work_, &reply_work_}) {
    if (!*side) continue;
    auto w = std::move(*side);
    side->reset();
    comm_->wait_work(w, what_ + " (emulation/timeline header)");
  }
  comm_->finish_p2p(*this);
}

ProcessGroupPtr make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                int rank, int size, std::chrono::milliseconds timeout,
                                const std::string& hostname) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  opts->threads = 1;
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("creating Gloo group '{}' (rank {} of {}) failed within {} ms: {}", prefix,
                                rank, size, timeout.count(), e.what()));
  }
}

}  // namespace optcc

// Communicator: one c10d process group plus traffic accounting. Every byte that crosses ranks goes
// through here (docs/architecture.md §1), so bytes, calls and seconds are counted once, by traffic class
// and link, where they go on the wire.
//
// Backends: ProcessGroupGloo (CPU tensors) and ProcessGroupNCCL (tensors on the rank's GPU; CUDA
// builds, harness/parallel/device.h). Each group knows the device its backend takes tensors on
// (set_backend_device); a tensor elsewhere is staged: copied there, carried, and copied back into
// the caller's tensor, so callers pass tensors where they live (model and messages on the GPU, control
// scalars on the host) and Gloo carries CUDA tensors through host memory (several ranks on one GPU,
// which NCCL refuses). Bytes are counted once, for what travels. On CUDA the host waits for the GPU
// before an operation starts and after it completes, so seconds time the communication itself, as
// on Gloo where the host waits for the network; compute and communication do not overlap here.
// A group of one rank needs no process group: every operation is a no-op that records nothing.
//
// Byte accounting (per rank, what this rank sends under ring algorithms; docs/design.md §9):
//   all_reduce of X bytes over n ranks     2(n-1)/n * X
//   all_gather of X bytes per rank         (n-1) * X
//   reduce_scatter of X bytes (input)      (n-1)/n * X
//   broadcast of X bytes                   (n-1)/n * X   (pipelined ring)
//   send of X bytes                        X            (recv records 0 bytes, 1 call)
//
// Link emulation and skipping (network: section; harness/parallel/link_emulator.h): with an emulator set
// (set_emulator, only when network.emulate or network.skip is on), each operation of an emulated
// class completes no earlier than the declared links allow, and its emulated seconds are recorded
// beside the measured ones; a skipped class issues nothing and keeps shapes: a skipped recv fills
// its tensor with zeros, a skipped all_reduce / broadcast leaves the local tensor, a skipped
// all_gather returns the gathered shape with this rank's part in its slot and zeros elsewhere, a
// skipped reduce_scatter returns this rank's slice of its own input. Without an emulator the only
// cost is one null-pointer test per operation.
// Timeline (harness/parallel/timeline.h): while a recorder is active, every operation is an event (send,
// recv, collective; emulated waits too). With emulation or an active timeline, a point-to-point
// message also carries a 16-byte header (sender's post time and emulated start, on tag +
// kHeaderTagOffset) and an 8-byte reply (receiver's post time, on tag + 2 kHeaderTagOffset), both
// posted with the message on both ends alike, so each end knows when the other posted: an event
// starts when both had posted (the wait for the peer is not transfer). They are never counted as
// traffic and never delay the message (no end waits for the other's wait()).
//
// Every blocking wait has the communicator's timeout; a failure or timeout throws CommError naming
// this rank, the group, the operation and the bytes, so one failing rank ends all ranks (the peers'
// operations fail or time out in turn) instead of hanging.
#pragma once

#include <torch/torch.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "compat/torch_compat.h"  // ProcessGroupPtr
#include "harness/parallel/layout.h"


namespace optcc {

/// Traffic classes of 3D-parallel training (docs/design.md §9 rows), plus kControl for the few scalars of
/// bookkeeping (global gradient norm, loss averaging, checks) that docs/design.md §9 leaves out, and
/// kOuter: DiLoCo's outer-gradient exchange across data-parallel replicas (compression.dp_strategy:
/// diloco, harness/train/outer_sync.h). The numbers are stored in results files (/traffic's `class`
/// column): a new class takes the next number, existing ones never move.
enum class Traffic { kTensorParallel, kPipelineForward, kPipelineBackward, kDataParallel, kEmbedding, kControl, kOuter };
constexpr int kNumTraffic = 7;
const char* traffic_name(Traffic t);  // "tp", "pp_fwd", "pp_bwd", "dp", "embedding", "control", "outer"
const char* link_name(Link l);        // "intra", "inter"

struct TrafficCounters {
  int64_t bytes = 0;     // bytes this rank sent
  // Of `bytes`, those sent point to point (send(); the rest left in collectives). For pp_fwd and
  // pp_bwd this is the stage-to-stage wire alone: the class also holds the receiving stage's TP
  // all-gather of scatter-gathered slices (stage_link.h), a collective.
  int64_t p2p_bytes = 0;
  int64_t calls = 0;     // operations issued
  double seconds = 0.0;  // wall time spent waiting in them, s
  double emulated_seconds = 0.0;  // link emulation's duration of them (link_emulator.h), s; 0 off
};

/// Per-rank counters by class x link. Not thread-safe: one training thread uses it.
class TrafficMeter {
 public:
  /// point_to_point: the bytes were sent by send() (counted in p2p_bytes too), not a collective.
  void record(Traffic cls, Link link, int64_t bytes, double seconds, double emulated_seconds = 0.0,
              bool point_to_point = false);
  const TrafficCounters& at(Traffic cls, Link link) const;
  TrafficCounters total() const;
  void reset();

 private:
  std::array<std::array<TrafficCounters, 2>, kNumTraffic> c_{};
};

/// Thrown when a collective or p2p operation fails or times out.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An outstanding p2p operation. wait() must be called on every handle (BR-13).
class CommHandle {
 public:
  CommHandle() = default;
  void wait();
  bool pending() const { return work_ != nullptr; }

 private:
  friend class Communicator;
  c10::intrusive_ptr<c10d::Work> work_;
  class Communicator* comm_ = nullptr;
  std::string what_;
  Traffic cls_ = Traffic::kTensorParallel;
  Link link_ = Link::kIntraNode;
  int64_t bytes_ = 0;
  std::chrono::steady_clock::time_point start_;
  // Link emulation / timeline (see the top of this file); unused when neither is on.
  bool skipped_ = false;
  bool is_send_ = false;
  int peer_ = -1;                // group rank
  int64_t payload_bytes_ = 0;    // the message's bytes (both ends)
  int microbatch_ = -1;
  int64_t send_start_ns_ = 0;    // sender: s_tx of link_emulator.h
  c10::intrusive_ptr<c10d::Work> header_work_, reply_work_;
  torch::Tensor header_;         // int64 [2]: sender's post time, s_tx (ns, CLOCK_MONOTONIC)
  torch::Tensor reply_;          // int64 [1]: receiver's post time
  torch::Tensor staged_;         // the message on the backend's device, when the caller's is elsewhere
  torch::Tensor target_;         // a staged receive's own tensor, filled in wait()
};

class LinkEmulator;
enum class CollectiveKind;

class Communicator {
 public:
  /// `pg` spans exactly `global_ranks` (sorted; this rank is among them); may be null when the
  /// group has one rank. `name` is used in errors ("tp[0,1]"). `link` classifies the group's
  /// traffic (inter-node if any two members sit on different nodes). `meter` may be null.
  Communicator(ProcessGroupPtr pg, std::vector<int> global_ranks, int my_global_rank, std::string name,
               Link link, TrafficMeter* meter, std::chrono::milliseconds timeout);
  ~Communicator();

  int rank() const { return rank_; }   // rank of this process within the group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& global_ranks() const { return ranks_; }
  const std::string& name() const { return name_; }
  Link link() const { return link_; }
  /// The host of each member ("name (address)", in global_ranks() order). When the members span
  /// more than one host, a failed operation's error lists which rank runs where, so a cut link
  /// or a dead host is named (init_distributed sets it).
  void set_member_hosts(std::vector<std::string> hosts) { member_hosts_ = std::move(hosts); }

  // Collectives: all ranks of the group call them in the same order with same-shaped tensors.
  /// In-place sum (or max) over the group. `t` contiguous, any float dtype.
  /// A bf16 sum on Gloo (which has no bf16 arithmetic) goes through all_reduce_summing_in_fp32.
  /// fp16 (and bf16 on NCCL) is summed by the backend in its own dtype.
  void all_reduce(torch::Tensor& t, Traffic cls, bool max = false);
  /// In-place sum of a 16-bit tensor (kHalf or kBFloat16; kFloat: plain all_reduce) that keeps the
  /// 16-bit dtype on the wire but adds in fp32: the tensor is padded to n equal chunks, an
  /// all-to-all gives each rank every rank's copy of its chunk, the rank adds them in fp32 in
  /// group-rank order and rounds the sum once to the 16-bit dtype, and an all-gather of the
  /// rounded chunks gives every rank the same bits. Exactness: each addend is what the caller
  /// rounded; the sum carries one rounding (a ring all-reduce in 16 bits rounds n-1 times, and
  /// fp16's partial sums can overflow where the total does not). Bytes per rank:
  /// summing_in_fp32_sent_bytes(), what a ring all-reduce sends up to the padding; counted as an
  /// all-reduce. Same backends, devices and skipping as all_reduce.
  void all_reduce_summing_in_fp32(torch::Tensor& t, Traffic cls);
  /// Bytes one rank sends in all_reduce_summing_in_fp32 of `numel` elements over `n` ranks:
  /// 2(n-1)·ceil(numel/n)·element_bytes (0 for n = 1). The traffic model reads it from here.
  static int64_t summing_in_fp32_sent_bytes(int64_t n, int64_t numel, int64_t element_bytes);
  /// Moving data (all_gather, broadcast, send, recv) takes any dtype, bf16 on Gloo included.
  /// Concatenates every rank's `local` along `dim` in group-rank order: [.., n*local.size(dim), ..].
  torch::Tensor all_gather(const torch::Tensor& local, Traffic cls, int64_t dim = 0);
  /// Sums `input` over the group and returns this rank's 1/n slice along dim 0 (size(0) % n == 0).
  /// Gloo lacks reduce-scatter in LibTorch 1.13: implemented as all_reduce + narrow there (and
  /// accounted as a reduce-scatter so traffic figures do not depend on the backend).
  torch::Tensor reduce_scatter(const torch::Tensor& input, Traffic cls);
  /// Copies root's `t` (group rank) into every rank's `t`.
  void broadcast(torch::Tensor& t, int root, Traffic cls);
  void barrier();

  // Point-to-point (peer = group rank). Messages between a pair of ranks are matched in posting
  // order per tag; callers keep one fixed order per peer (BR-11).
  CommHandle send(const torch::Tensor& t, int peer, Traffic cls, int tag = 0);
  CommHandle recv(torch::Tensor& t, int peer, Traffic cls, int tag = 0);

  TrafficMeter* meter() const { return meter_; }
  /// The c10d process group underneath; null for a one-rank group. Shared ownership: holding a
  /// copy keeps the group's sockets open after this Communicator is gone (tests/support/gloo_ranks.h).
  const ProcessGroupPtr& process_group() const { return pg_; }

  /// The device this group's backend takes tensors on: CPU (Gloo, the default) or the rank's GPU
  /// (NCCL). Set once, before the first operation (init_distributed does).
  void set_backend_device(const c10::Device& device) { backend_device_ = device; }
  const c10::Device& backend_device() const { return backend_device_; }

  /// Link emulation and skipping for this group (link_emulator.h); null (the default) = off.
  /// Set on every rank of the group alike, before the first operation; must outlive the group.
  void set_emulator(LinkEmulator* emulator) { emu_ = emulator; }
  LinkEmulator* emulator() const { return emu_; }
  /// Added to a p2p tag for its header message; p2p tags must stay below it.
  static constexpr int kHeaderTagOffset = 1 << 24;

  /// Cast-on-the-wire compression of the floating-point all-reduces of one class (compression.tp:
  /// fp16 / bf16 for Traffic::kTensorParallel): the tensor is cast to `dtype`, summed in it and
  /// copied back (bytes counted in `dtype`). kFloat or the tensor's own dtype: no cast. Set on
  /// every rank of the group alike, before the first collective.
  void set_all_reduce_wire_dtype(Traffic cls, torch::ScalarType dtype) {
    wire_dtype_[static_cast<int>(cls)] = dtype;
  }

 private:
  friend class CommHandle;
  void wait_work(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what);
  void settle() const;                                   // CUDA: wait for the GPU; CPU: nothing
  torch::Tensor staged(const torch::Tensor& t) const;   // t on the backend's device (no copy if there)
  CommHandle post_p2p(bool is_send, torch::Tensor& t, int peer, Traffic cls, int tag);
  // What the backend moves for `t`: Gloo (LibTorch 1.13) moves no bf16, so a bf16 tensor travels as
  // a fp16 view of its storage (the same 16 bits, no rounding); anything else is `t` itself.
  torch::Tensor moved_bits(const torch::Tensor& t) const;
  void record(Traffic cls, int64_t bytes, double seconds, double emulated_seconds = 0.0, bool point_to_point = false);
  // communicator_emulation.cpp: emulation, skipping and timeline events of each operation.
  void finish_collective(Traffic cls, CollectiveKind kind, int64_t tensor_bytes, int64_t sent_bytes,
                         std::chrono::steady_clock::time_point t0);
  double emulate_collective(Traffic cls, CollectiveKind kind, int64_t tensor_bytes, int64_t sent_bytes,
                            int64_t post_ns, int64_t& group_start_ns);
  int64_t agree_max(int64_t value);
  bool skip_collective(Traffic cls);
  void post_header(CommHandle& h, int tag);
  void finish_p2p(CommHandle& h);
  std::string describe(const std::string& op, int64_t bytes) const;

  ProcessGroupPtr pg_;
  std::vector<int> ranks_;
  int rank_ = 0;
  std::string name_;
  Link link_;
  TrafficMeter* meter_;
  std::chrono::milliseconds timeout_;
  std::array<torch::ScalarType, kNumTraffic> wire_dtype_{};  // kByte (0) = no cast
  LinkEmulator* emu_ = nullptr;
  c10::Device backend_device_ = c10::Device(c10::DeviceType::CPU);
  std::vector<std::string> member_hosts_;  // set_member_hosts; empty = not known
};

}  // namespace optcc

namespace optcc {

/// A Gloo process group over the ranks that share `store` under `prefix` (loopback or the host's
/// interface). `rank` and `size` are group ranks. All members must call it with the same prefix.
/// Blocking until every member joined or `timeout` passed (then throws CommError).
ProcessGroupPtr make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                int rank, int size, std::chrono::milliseconds timeout,
                                const std::string& hostname = "127.0.0.1");

}  // namespace optcc

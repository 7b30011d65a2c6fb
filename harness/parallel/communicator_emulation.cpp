// Communicator: link emulation, skipping and timeline events of each operation (communicator.h,
// link_emulator.h, timeline.h). Kept apart from communicator.cpp so that the plain path stays
// readable: there, every operation makes one `emu_` test and hands its end to finish_collective()
// or CommHandle::wait() -> finish_p2p().
#include <fmt/format.h>

#include "harness/parallel/communicator.h"
#include "harness/parallel/link_emulator.h"
#include "harness/parallel/timeline.h"

namespace optcc {
namespace {

using Clock = std::chrono::steady_clock;

int64_t ns_of(Clock::time_point t) {  // steady_clock is CLOCK_MONOTONIC on Linux (libstdc++)
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Stream stream_of(Traffic cls) { return static_cast<Stream>(2 + static_cast<int>(cls)); }

// Sleeps until `end_ns` and records the sleep as an emulated_wait event of `cls`.
void emulated_wait(Traffic cls, int microbatch, int64_t end_ns) {
  const int64_t from = monotonic_ns();
  if (LinkEmulator::wait_until(end_ns) > 0) {
    if (Timeline* tl = Timeline::active()) tl->add(EventKind::kEmulatedWait, stream_of(cls), microbatch, from, monotonic_ns());
  }
}

}  // namespace

bool Communicator::skip_collective(Traffic cls) {
  if (!emu_->skips(cls)) return false;
  const int64_t now = monotonic_ns();
  record(cls, 0, 0.0);  // the call is counted, nothing travelled
  if (Timeline* tl = Timeline::active()) tl->add(EventKind::kCollective, stream_of(cls), Timeline::current_microbatch(), now, now);
  return true;
}

int64_t Communicator::agree_max(int64_t value) {
  auto t = staged(torch::tensor({value}, torch::kLong));
  std::vector<torch::Tensor> ts{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  wait_work(pg_->allreduce(ts, opts), describe("link emulation: start agreement (all_reduce max)", 8));
  return t.item<int64_t>();  // .item() copies to the host
}

double Communicator::emulate_collective(Traffic cls, CollectiveKind kind, int64_t tensor_bytes, int64_t sent_bytes,
                                        int64_t post_ns, int64_t& group_start_ns) {
  const double ring = emu_->ring_seconds(kind, tensor_bytes, ranks_);
  int64_t start = monotonic_ns();  // groups inside a node: when the real exchange returned
  if (link_ == Link::kInterNode) {  // the last member's post, then the latest NIC reservation
    group_start_ns = agree_max(post_ns);
    start = agree_max(emu_->collective_nic_start(ranks_[rank_], ranks_, sent_bytes, group_start_ns));
  } else {
    group_start_ns = post_ns;
  }
  const int64_t end = start + static_cast<int64_t>(ring * 1e9);
  emulated_wait(cls, Timeline::current_microbatch(), end);
  return static_cast<double>(end - (link_ == Link::kInterNode ? group_start_ns : start)) * 1e-9;
}

void Communicator::finish_collective(Traffic cls, CollectiveKind kind, int64_t tensor_bytes, int64_t sent_bytes,
                                     Clock::time_point t0) {
  double emulated = 0.0;
  int64_t start_ns = ns_of(t0);
  if (emu_ && emu_->emulates(cls)) emulated = emulate_collective(cls, kind, tensor_bytes, sent_bytes, ns_of(t0), start_ns);
  record(cls, sent_bytes, seconds_since(t0), emulated);
  if (Timeline* tl = Timeline::active()) {
    tl->add(EventKind::kCollective, stream_of(cls), Timeline::current_microbatch(), start_ns, monotonic_ns());
  }
}

void Communicator::post_header(CommHandle& h, int tag) {
  const bool emulated = emu_ && emu_->emulates(h.cls_);
  if (!emulated && !Timeline::active()) return;
  h.microbatch_ = Timeline::current_microbatch();
  const int64_t post = ns_of(h.start_);
  // Post times travel relative to the run's timeline origin (agreed by a barrier, so comparable
  // across hosts); s_tx is absolute (emulation runs on one host only).
  const int64_t origin = Timeline::active() ? Timeline::active()->origin_ns() : 0;
  std::vector<torch::Tensor> header{torch::full({2}, post - origin, torch::kLong)};
  std::vector<torch::Tensor> reply{torch::full({1}, post - origin, torch::kLong)};
  if (h.is_send_ && emulated) header[0][1] = emu_->p2p_send_start(ranks_[rank_], ranks_[h.peer_], h.payload_bytes_, post);
  header[0] = staged(header[0]), reply[0] = staged(reply[0]);  // NCCL: on the rank's GPU
  h.header_ = header[0], h.reply_ = reply[0];
  if (h.is_send_) {
    h.header_work_ = pg_->send(header, h.peer_, tag + kHeaderTagOffset);
    h.reply_work_ = pg_->recv(reply, h.peer_, tag + 2 * kHeaderTagOffset);
  } else {
    h.header_work_ = pg_->recv(header, h.peer_, tag + kHeaderTagOffset);
    h.reply_work_ = pg_->send(reply, h.peer_, tag + 2 * kHeaderTagOffset);
  }
}

void Communicator::finish_p2p(CommHandle& h) {
  const int64_t post = ns_of(h.start_);
  int64_t event_start = post;
  double emulated = 0.0;
  if (h.header_.defined()) {
    h.header_ = h.header_.cpu(), h.reply_ = h.reply_.cpu();  // read on the host (no copy there)
    const int64_t send_start = h.header_.data_ptr<int64_t>()[1];
    if (Timeline* tl = Timeline::active()) {  // waiting for the peer to post is not transfer
      event_start = tl->origin_ns() + std::max(h.header_.data_ptr<int64_t>()[0], h.reply_.data_ptr<int64_t>()[0]);
    }
    if (emu_ && emu_->emulates(h.cls_)) {
      const int64_t arrived = monotonic_ns();
      const int me = ranks_[rank_], peer = ranks_[h.peer_];
      const int64_t end = h.is_send_ ? emu_->p2p_end(me, peer, h.payload_bytes_, send_start)
                                     : emu_->p2p_end(peer, me, h.payload_bytes_, send_start);
      emulated = static_cast<double>(end - (h.is_send_ ? post : send_start)) * 1e-9;
      emulated_wait(h.cls_, h.microbatch_, std::max(arrived, end));
    }
    h.header_ = torch::Tensor(), h.reply_ = torch::Tensor();
  }
  const bool skipped = h.skipped_;
  h.skipped_ = false;
  record(h.cls_, skipped ? 0 : h.bytes_, seconds_since(h.start_), emulated, /*point_to_point=*/true);
  if (Timeline* tl = Timeline::active()) {
    tl->add(h.is_send_ ? EventKind::kSend : EventKind::kRecv, stream_of(h.cls_), h.microbatch_, event_start, monotonic_ns());
  }
}

}  // namespace optcc

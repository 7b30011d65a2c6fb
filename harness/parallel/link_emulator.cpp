// Link emulation cost model and NIC reservations (see link_emulator.h).
#include "harness/parallel/link_emulator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <thread>

namespace optcc {
namespace {

std::atomic<int64_t> g_emulators_created{0};

int ring_steps(CollectiveKind kind, int n) {
  return kind == CollectiveKind::kAllReduce ? 2 * (n - 1) : n - 1;
}

}  // namespace

LinkEmulator::LinkEmulator(LinkParams params, RankLayout layout, std::shared_ptr<NicTable> nics)
    : params_(params), layout_(std::move(layout)), nics_(std::move(nics)) {
  g_emulators_created.fetch_add(1);
  if (params_.emulate) {
    if (!nics_) throw std::invalid_argument("LinkEmulator: emulation needs a NIC table");
    if (params_.nics_per_node < 1 || nics_->num_nodes() < layout_.num_nodes() * params_.nics_per_node) {
      throw std::invalid_argument("LinkEmulator: the NIC table has fewer entries than nodes x NICs per node");
    }
    if (!(params_.intra_bytes_per_s > 0 && params_.inter_bytes_per_s > 0 && params_.scale > 0)) {
      throw std::invalid_argument("LinkEmulator: bandwidths and scale must be > 0");
    }
  }
}

int64_t LinkEmulator::instances_created() { return g_emulators_created.load(); }

double LinkEmulator::latency_seconds(Link link) const {
  return params_.scale * (link == Link::kInterNode ? params_.inter_latency_s : params_.intra_latency_s);
}

double LinkEmulator::transfer_seconds(int64_t bytes, Link link) const {
  const double bw = link == Link::kInterNode ? params_.inter_bytes_per_s : params_.intra_bytes_per_s;
  return bw > 0 ? params_.scale * static_cast<double>(bytes) / bw : 0.0;
}

int64_t LinkEmulator::ring_send_bytes(CollectiveKind kind, int64_t bytes, int n) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return 2 * (n - 1) * bytes / n;
    case CollectiveKind::kAllGather: return (n - 1) * bytes;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kBroadcast: return (n - 1) * bytes / n;
  }
  return 0;
}

double LinkEmulator::ring_seconds(CollectiveKind kind, int64_t bytes, const std::vector<int>& group) const {
  const int n = static_cast<int>(group.size());
  if (n < 2) return 0.0;
  Link slowest = Link::kIntraNode;
  for (int i = 0; i < n; ++i) {
    if (link_between(group[i], group[(i + 1) % n]) == Link::kInterNode) slowest = Link::kInterNode;
  }
  const int steps = ring_steps(kind, n);
  if (kind == CollectiveKind::kBroadcast) {  // pipelined: latency per hop, the volume once
    return steps * latency_seconds(slowest) + transfer_seconds(ring_send_bytes(kind, bytes, n), slowest);
  }
  const int64_t chunk = kind == CollectiveKind::kAllGather ? bytes : bytes / n;
  return steps * (latency_seconds(slowest) + transfer_seconds(chunk, slowest));
}

int64_t LinkEmulator::ns(double seconds) const { return static_cast<int64_t>(std::ceil(seconds * 1e9)); }

int64_t LinkEmulator::p2p_send_start(int from, int to, int64_t bytes, int64_t post_ns) {
  if (link_between(from, to) == Link::kIntraNode) return post_ns;
  const int64_t d = ns(transfer_seconds(bytes, Link::kInterNode));
  const int64_t leaves = nics_->reserve(nic_of(from), NicDirection::kTransmit, post_ns, d);
  return nics_->reserve(nic_of(to), NicDirection::kReceive, leaves, d);
}

int64_t LinkEmulator::p2p_end(int from, int to, int64_t bytes, int64_t send_start_ns) const {
  return send_start_ns + ns(p2p_seconds(bytes, link_between(from, to)));
}

int64_t LinkEmulator::collective_nic_start(int me, const std::vector<int>& group, int64_t send_bytes,
                                           int64_t start_ns) {
  const int n = static_cast<int>(group.size());
  int i = 0;
  while (i < n && group[i] != me) ++i;
  if (n < 2 || i == n) return start_ns;
  const int64_t d = ns(transfer_seconds(send_bytes, Link::kInterNode));
  const int node = layout_.node_of(me), nic = nic_of(me);
  int64_t start = start_ns;
  if (layout_.node_of(group[(i + 1) % n]) != node) {
    start = std::max(start, nics_->reserve(nic, NicDirection::kTransmit, start_ns, d));
  }
  if (layout_.node_of(group[(i + n - 1) % n]) != node) {
    start = std::max(start, nics_->reserve(nic, NicDirection::kReceive, start_ns, d));
  }
  return start;
}

int LinkEmulator::nic_of(int rank) const {
  const int k = params_.nics_per_node, rpn = layout_.ranks_per_node();
  if (k <= 1) return layout_.node_of(rank);
  const int local = rank % rpn;
  return layout_.node_of(rank) * k + std::min(k - 1, local * k / rpn);
}

double LinkEmulator::wait_until(int64_t end_ns) {
  const int64_t now = monotonic_ns();
  if (end_ns <= now) return 0.0;
  // steady_clock is CLOCK_MONOTONIC on Linux (libstdc++), the NIC table's clock.
  std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::nanoseconds(end_ns)));
  return static_cast<double>(monotonic_ns() - now) * 1e-9;
}

}  // namespace optcc

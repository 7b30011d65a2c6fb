// Link emulation: makes every transfer of an emulated run last what the declared links allow
// (docs/architecture.md §5), while computation runs at this machine's speed. The
// Communicator (communicator.h) calls it; network_setup.h builds it from the config's `network:`.
//
// Nodes are `parallel.ranks_per_node` consecutive ranks (RankLayout::node_of). A link between two
// ranks of one node is per pair (NVLink-like: nothing shared, `intra` bandwidth and latency). All
// traffic leaving or entering a node shares that node's NIC (`inter` bandwidth per direction), a
// NicTable resource (nic_table.h) that ranks reserve time on, so concurrent transfers queue. Every
// emulated time (latency and bytes / bandwidth) is multiplied by `scale`. Bandwidth in bytes/s.
//
// Point-to-point message of B bytes from rank a to rank b, D = B / bw (x scale), L = latency:
//   sender:   posted at t_post. Inter-node: reserves its node's transmit NIC for D from t_post
//             (start s1), then the RECEIVER's node's receive NIC for D from s1 (start s_tx), both
//             at post time, so reservations follow the order in which transfers were posted and
//             several nodes sending into one node queue there too; intra-node: s_tx = t_post.
//             (When the receive NIC is the later one, s_tx > s1 and the transmit NIC keeps an
//             unused gap [s1, s_tx): a conservative simplification.) It completes no earlier
//             than s_tx + D + L and tells the receiver s_tx in a small header (communicator.h).
//   receiver: once the real data and the header arrived (at t_arrive), it completes no earlier
//             than max(t_arrive, s_tx + D + L). A receiver that posts late (its data was "on the
//             wire" while it computed) thus waits only for what is left. (Receivers do not reserve
//             anything themselves: a reservation made when the data happens to arrive would follow
//             the order of arrival on this machine, not of the emulated transfers.)
// Collective over a group of n ranks, tensor bytes X, in ring order (the group's rank order) on
// the SLOWEST link of the ring (inter-node if any neighbour pair crosses nodes):
//   all_reduce      2(n-1) steps of (L + (X/n) / bw)
//   all_gather      (n-1) steps of (L + X / bw)          X = this rank's input
//   reduce_scatter  (n-1) steps of (L + (X/n) / bw)
//   broadcast       (n-1) L + ((n-1)/n X) / bw          (pipelined ring, the meter's volume)
// The group's start t_start is the last member's post time (a MAX all-reduce of post times, for
// groups that cross nodes; groups inside a node start when the real operation returned, as their
// emulated time is small next to the real exchange). A member whose ring neighbour sits on another
// node reserves its node's NIC (transmit: next neighbour; receive: previous) for its ring volume
// (the meter's bytes) from t_start; the group agrees on the latest reservation start s (a second
// MAX all-reduce), and every member completes no earlier than s + ring time. So the DP all-reduces
// of the TP ranks of one node contend for its NIC: the second waits for the first.
//
// What is emulated: traffic classes tp, pp_fwd, pp_bwd, dp, embedding, outer. kControl (the few
// bookkeeping scalars and the per-step record gather) is never delayed. The emulation's own small
// messages (headers, agreement all-reduces) are not counted as traffic.
//
// Skipping (network.skip, optcc's addition, docs/design.md §8.3): a skipped class issues no real operation and no
// emulated time; shapes are kept (communicator.h documents what each operation returns then).
//
// Multi-host runs (Slurm over several nodes, torchrun across hosts): refused at start-up
// (network_setup.h). Emulation can only ADD delay to real links, and the shared NICs live in one
// machine's shared memory; a multi-host run measures its real network instead.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "harness/parallel/communicator.h"
#include "harness/parallel/layout.h"
#include "harness/parallel/nic_table.h"

namespace optcc {

/// The declared network, in SI units (network_setup.h converts the config's GB/s and µs).
struct LinkParams {
  bool emulate = false;
  double intra_bytes_per_s = 0;  // per pair of ranks in a node, per direction
  double inter_bytes_per_s = 0;  // per node NIC, per direction (shared by the node's ranks)
  double intra_latency_s = 0;    // per message / ring step
  double inter_latency_s = 0;
  double scale = 1.0;            // multiplies every emulated time
  /// NICs per node (the runtime: 1, the paper's nodes). With k > 1 (the simulator's multi-HCA
  /// nodes, harness/perfmodel/simulator.h) a rank uses NIC node·k + local_rank·k / ranks_per_node
  /// (rail-style: consecutive ranks share one), and `inter` is the bandwidth of ONE such NIC.
  int nics_per_node = 1;
  std::array<bool, kNumTraffic> skip{};  // per Traffic class
};

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kBroadcast };

class LinkEmulator {
 public:
  /// `nics` is required when params.emulate (std::invalid_argument otherwise) and must have at
  /// least layout.num_nodes() · params.nics_per_node entries ("nodes" of the table). One emulator per rank, shared by all its Communicators.
  LinkEmulator(LinkParams params, RankLayout layout, std::shared_ptr<NicTable> nics);

  /// LinkEmulators constructed in this process so far (tests: emulation off constructs none).
  static int64_t instances_created();

  const LinkParams& params() const { return params_; }
  const RankLayout& layout() const { return layout_; }
  bool emulates(Traffic cls) const { return params_.emulate && cls != Traffic::kControl; }
  bool skips(Traffic cls) const { return params_.skip[static_cast<int>(cls)]; }

  // ---- cost model (pure), seconds including `scale` ----
  double latency_seconds(Link link) const;
  double transfer_seconds(int64_t bytes, Link link) const;  // bytes / bandwidth
  double p2p_seconds(int64_t bytes, Link link) const { return latency_seconds(link) + transfer_seconds(bytes, link); }
  /// The ring time of `kind` over `group` (global ranks in ring order) for tensor bytes `bytes`
  /// (all_gather: this rank's input). 0 for a group of one.
  double ring_seconds(CollectiveKind kind, int64_t bytes, const std::vector<int>& group) const;
  /// Bytes one rank sends in the ring (what TrafficMeter records): 2(n-1)/n X, (n-1) X, (n-1)/n X.
  static int64_t ring_send_bytes(CollectiveKind kind, int64_t bytes, int n);

  // ---- runtime, ns on CLOCK_MONOTONIC ----
  /// Sender of `bytes` from global rank `from` to `to`, posted at `post_ns`: reserves both NICs
  /// (inter-node) and returns s_tx, when the transfer starts.
  int64_t p2p_send_start(int from, int to, int64_t bytes, int64_t post_ns);
  /// Emulated end of the message on both ends: s_tx + D + L.
  int64_t p2p_end(int from, int to, int64_t bytes, int64_t send_start_ns) const;
  /// Collective member `me` of `group` (ring order) sending `send_bytes` in the ring: reserves its
  /// node's NIC from `start_ns` when a ring neighbour is on another node; returns the reservation
  /// start (start_ns when none is needed).
  int64_t collective_nic_start(int me, const std::vector<int>& group, int64_t send_bytes, int64_t start_ns);

  /// The NIC table entry of `rank`'s NIC (node_of(rank) when nics_per_node is 1).
  int nic_of(int rank) const;

  /// Sleeps until `end_ns`; returns the seconds slept (0 when it has passed).
  static double wait_until(int64_t end_ns);

 private:
  Link link_between(int a, int b) const { return layout_.link(a, b); }
  int64_t ns(double seconds) const;

  LinkParams params_;
  RankLayout layout_;
  std::shared_ptr<NicTable> nics_;
};

}  // namespace optcc

// NIC table: the shared network interfaces of emulated nodes (docs/architecture.md §5).
//
// On the paper's cluster the 8 GPUs of a node share ONE 200 Gb/s HCA (docs/design.md §8.1), so concurrent
// inter-node transfers of ranks of one node queue behind each other. Link emulation models each
// node's NIC, per direction (transmit, receive), as a "busy until" time: a rank that wants to move
// B bytes across nodes reserves B / bandwidth of its node's NIC, starting when the NIC is free.
//
// Times are int64 nanoseconds on CLOCK_MONOTONIC, which every process of one machine shares
// (monotonic_ns()). Reservations are lock-free compare-exchange loops on std::atomic<int64_t>, so
// ranks in different processes (SharedNicTable over POSIX shared memory) or threads (LocalNicTable)
// contend correctly. A reservation never moves an earlier one: it starts at
// max(earliest, busy_until) and pushes busy_until to its own end.
//
// Who creates what:
//   - the local launcher (`optcc train --nproc N` with network.emulate: true) creates a
//     SharedNicSegment (shm_open + ftruncate + mmap, zeroed), passes its name to the ranks in the
//     environment variable OPTCC_NIC_SHM (kNicShmEnv) and unlinks it when it exits;
//   - single-host srun / torchrun jobs have no launcher of ours: local rank 0 creates the segment
//     under a name derived from the rendezvous, the others open it, and rank 0 unlinks it once all
//     have mapped it (harness/train/network_setup.cpp);
//   - ranks as threads (tests) share one LocalNicTable.
// Multi-host jobs never get here: emulation is refused when the ranks span more than one host.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace optcc {

constexpr const char* kNicShmEnv = "OPTCC_NIC_SHM";

enum class NicDirection { kTransmit = 0, kReceive = 1 };

/// CLOCK_MONOTONIC in nanoseconds (the clock the NIC table and link emulation use).
int64_t monotonic_ns();

/// Per node and direction, the time until which the NIC is reserved. Thread- and process-safe.
class NicTable {
 public:
  virtual ~NicTable() = default;
  virtual int num_nodes() const = 0;

  /// Reserves `duration_ns` (>= 0) of `node`'s NIC in direction `dir`, starting no earlier than
  /// `earliest_ns`: start = max(earliest_ns, busy_until), busy_until = start + duration_ns.
  /// Returns start. Throws std::out_of_range for a node outside [0, num_nodes()).
  int64_t reserve(int node, NicDirection dir, int64_t earliest_ns, int64_t duration_ns);
  /// The current reservation end (0 = never used).
  int64_t busy_until(int node, NicDirection dir);

  /// NicTables constructed in this process so far (tests: emulation off constructs none).
  static int64_t instances_created();

 protected:
  NicTable();
  virtual std::atomic<int64_t>& slot(int node, NicDirection dir) = 0;
};

/// In-process table (ranks as threads).
class LocalNicTable final : public NicTable {
 public:
  explicit LocalNicTable(int num_nodes);
  int num_nodes() const override { return static_cast<int>(slots_.size() / 2); }

 private:
  struct alignas(64) Slot {
    std::atomic<int64_t> busy_until{0};
  };
  std::atomic<int64_t>& slot(int node, NicDirection dir) override;
  std::vector<Slot> slots_;
};

/// The launcher's segment: creates the POSIX shared-memory object `name` (must not exist; "/x"
/// form) for `num_nodes` nodes, zeroed, and unlinks it in the destructor (the ranks' mappings stay
/// valid after the unlink). Throws std::runtime_error naming the segment and errno's text.
class SharedNicSegment {
 public:
  SharedNicSegment(std::string name, int num_nodes);
  ~SharedNicSegment();
  SharedNicSegment(const SharedNicSegment&) = delete;
  SharedNicSegment& operator=(const SharedNicSegment&) = delete;
  const std::string& name() const { return name_; }
  /// Unlinks now (idempotent); mappings of ranks that opened it stay valid.
  void unlink();

 private:
  std::string name_;
  bool linked_ = false;
};

/// A rank's view of a SharedNicSegment, mapped read-write; unmapped in the destructor.
class SharedNicTable final : public NicTable {
 public:
  /// Opens `name`; throws std::runtime_error when it does not exist, is not a NIC segment, or
  /// holds fewer than `min_nodes` nodes.
  static std::unique_ptr<SharedNicTable> open(const std::string& name, int min_nodes);
  ~SharedNicTable() override;
  int num_nodes() const override { return nodes_; }

 private:
  SharedNicTable(void* base, size_t bytes, int nodes) : base_(base), bytes_(bytes), nodes_(nodes) {}
  std::atomic<int64_t>& slot(int node, NicDirection dir) override;
  void* base_;
  size_t bytes_;
  int nodes_;
};

/// A name for a new segment: "/optcc-nic-<uid>-<pid>-<tag>".
std::string nic_segment_name(const std::string& tag);

}  // namespace optcc

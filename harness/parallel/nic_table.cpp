// NIC table in process memory or POSIX shared memory (see nic_table.h).
#include "harness/parallel/nic_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <new>
#include <stdexcept>

namespace optcc {
namespace {

static_assert(std::atomic<int64_t>::is_always_lock_free, "the NIC table needs lock-free 64-bit atomics");

std::atomic<int64_t> g_tables_created{0};

// Segment layout: a 64-byte header, then 2 * nodes slots of 64 bytes (one cache line each, so two
// nodes' NICs never share a line).
constexpr uint64_t kMagic = 0x6f707463632d6e69ull;  // "optcc-ni"
struct Header {
  uint64_t magic;
  int64_t nodes;
};
constexpr size_t kLine = 64;

size_t segment_bytes(int nodes) { return kLine + static_cast<size_t>(nodes) * 2 * kLine; }

std::atomic<int64_t>* slot_at(void* base, int node, NicDirection dir) {
  auto* p = static_cast<char*>(base) + kLine + (static_cast<size_t>(node) * 2 + static_cast<size_t>(dir)) * kLine;
  return reinterpret_cast<std::atomic<int64_t>*>(p);
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

NicTable::NicTable() { g_tables_created.fetch_add(1); }

int64_t NicTable::instances_created() { return g_tables_created.load(); }

int64_t NicTable::reserve(int node, NicDirection dir, int64_t earliest_ns, int64_t duration_ns) {
  if (node < 0 || node >= num_nodes()) {
    throw std::out_of_range(fmt::format("NIC table: node {} outside [0, {})", node, num_nodes()));
  }
  std::atomic<int64_t>& busy = slot(node, dir);
  int64_t seen = busy.load();
  int64_t start = 0;
  do {
    start = std::max(earliest_ns, seen);
  } while (!busy.compare_exchange_weak(seen, start + std::max<int64_t>(0, duration_ns)));
  return start;
}

int64_t NicTable::busy_until(int node, NicDirection dir) { return slot(node, dir).load(); }

LocalNicTable::LocalNicTable(int num_nodes) : slots_(static_cast<size_t>(std::max(1, num_nodes)) * 2) {}

std::atomic<int64_t>& LocalNicTable::slot(int node, NicDirection dir) {
  return slots_[static_cast<size_t>(node) * 2 + static_cast<size_t>(dir)].busy_until;
}

SharedNicSegment::SharedNicSegment(std::string name, int num_nodes) : name_(std::move(name)) {
  const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error(fmt::format("NIC table: cannot create shared memory '{}': {}", name_, errno_text()));
  linked_ = true;
  const size_t bytes = segment_bytes(num_nodes);
  void* base = ftruncate(fd, static_cast<off_t>(bytes)) == 0
                   ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
  const std::string why = errno_text();
  close(fd);
  if (base == MAP_FAILED) {
    unlink();
    throw std::runtime_error(fmt::format("NIC table: cannot size or map '{}' ({} bytes): {}", name_, bytes, why));
  }
  for (int n = 0; n < num_nodes; ++n) {
    for (auto dir : {NicDirection::kTransmit, NicDirection::kReceive}) new (slot_at(base, n, dir)) std::atomic<int64_t>(0);
  }
  auto* h = static_cast<Header*>(base);
  h->nodes = num_nodes;
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;  // last: a rank that sees the magic sees initialised slots
  munmap(base, bytes);
}

SharedNicSegment::~SharedNicSegment() { unlink(); }

void SharedNicSegment::unlink() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

std::unique_ptr<SharedNicTable> SharedNicTable::open(const std::string& name, int min_nodes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    throw std::runtime_error(fmt::format("NIC table: cannot open shared memory '{}' ({}): {}. It is created by the "
                                         "local launcher (or local rank 0) of an emulated run.",
                                         name, kNicShmEnv, errno_text()));
  }
  struct stat st{};
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= segment_bytes(1)) {
    base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (base == MAP_FAILED) throw std::runtime_error(fmt::format("NIC table: cannot map shared memory '{}'", name));
  const auto* h = static_cast<const Header*>(base);
  const bool magic = h->magic == kMagic;
  std::atomic_thread_fence(std::memory_order_acquire);
  const auto nodes = static_cast<int>(h->nodes);
  if (!magic || nodes < min_nodes || segment_bytes(nodes) > static_cast<size_t>(st.st_size)) {
    munmap(base, static_cast<size_t>(st.st_size));
    throw std::runtime_error(fmt::format("NIC table: '{}' is not a NIC segment for {} nodes (found {} nodes)", name,
                                         min_nodes, magic ? nodes : -1));
  }
  return std::unique_ptr<SharedNicTable>(new SharedNicTable(base, static_cast<size_t>(st.st_size), nodes));
}

SharedNicTable::~SharedNicTable() { munmap(base_, bytes_); }

std::atomic<int64_t>& SharedNicTable::slot(int node, NicDirection dir) { return *slot_at(base_, node, dir); }

std::string nic_segment_name(const std::string& tag) {
  return fmt::format("/optcc-nic-{}-{}-{}", getuid(), getpid(), tag);
}

}  // namespace optcc

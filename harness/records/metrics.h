// Results writer: one HDF5 file per run, written by one rank (docs/architecture.md §6).
//
// File layout
//   /                      root attributes, all UTF-8 variable-length strings (h5py reads them as str):
//                          the effective config (YAML, may be many KB), git revision, versions, layout, ...
//   /<group>               one group per TableSpec (group may be a path, e.g. "diagnostics/lep");
//                          attribute `columns` = column names in TableSpec order, comma-separated
//   /<group>/<column>      1-D dataset [rows], int64 (H5T_STD_I64LE) or float64 (H5T_IEEE_F64LE),
//                          unlimited and chunked (kChunkRows); attribute `unit` (UTF-8, "" = count/none).
//   All columns of a group have the same length after every flush: row i of the table is element i of
//   each of its datasets.
//
// Durability design ("open per flush"). HDF5 1.10 marks a file opened for writing with libver-latest
// (required for SWMR) in its superblock; a process killed while it holds the file open leaves the mark,
// and a plain open (h5py.File(path, "r")) then fails with "file is already open for write (may use
// <h5clear file> ...)". So the sink does NOT keep the file open: the constructor creates the file and
// closes it; flush() opens it in SWMR-write mode, extends and writes every buffered row, and closes it
// again (~0.3-1 ms for ten columns). Between flushes the file is a normally closed HDF5 file. Hence:
//   * killed (SIGKILL, OOM, scheduler) outside flush(): every row up to the last flush is readable with
//     a plain open from C++ (H5F_ACC_RDONLY) and h5py (h5py.File(path, "r")); rows appended after the
//     last flush are lost (they lived only in this process's memory).
//   * killed inside flush() (a sub-millisecond window per log interval): the superblock keeps the
//     "open for write" mark; h5py.File(path, "r", swmr=True) still reads every row of the previous
//     flush, or of the interrupted one if it got that far, and `h5clear -s path` (Debian: hdf5-tools)
//     makes plain opens work again (checked by killing a writer that flushes back to back).
// The writer opens with file locking disabled (HDF5 >= 1.10.7; older: HDF5_USE_FILE_LOCKING=FALSE), so
// a reader that holds the file open (h5py takes a shared lock) never blocks a flush, and file systems
// without flock work. Two runs never share a file all the same: the constructor creates it exclusively
// and refuses an existing path (ResultsFileExists), so no run truncates another's (or an earlier
// attempt's) results.
//
// Reading a live run (from another process, any time):
//   f = h5py.File(path, "r", swmr=True)           # works during and between flushes
//   loss = f["train/loss"]; loss.refresh(); loss[:]   # refresh() picks up rows flushed since
// or `python3 scripts/h5summary.py path` (summary) / `... --series train/loss` (one series).
// A plain h5py.File(path, "r") also works between flushes but shows a snapshot (reopen to see more) and,
// if it races a flush, fails ("already open for write", "truncated file", checksum) -- retry, or use
// swmr=True (measured: no error in ~1,500 SWMR reads racing back-to-back or 2 ms-spaced flushes).
// Readers need HDF5 >= 1.10 (superblock v3); NFS does not give the write ordering SWMR relies on, so read
// live runs on the node's local disk or a POSIX parallel file system.
//
// Attributes: all root attributes are given at construction (HDF5 1.10 does not support creating objects
// or attributes while in SWMR-write mode, and a concurrent SWMR reader could see a half-written header).
// Record anything known only at the end (final loss, wall time) as a one-row table instead.
//
// Threading and ranks: one writer rank (the harness picks it) owns an Hdf5MetricsSink; every other
// rank uses NullMetricsSink. A sink is used from one thread. During its own HDF5 calls the sink replaces
// HDF5's automatic error-stack printing (restored afterwards): failures come back as std::runtime_error
// carrying HDF5's innermost message (e.g. "errno = 2, error message = 'No such file or directory'").
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace H5 {
class H5File;
}

namespace optcc {

enum class ColumnType { kInt64, kFloat64 };

struct Column {
  std::string name;  // dataset name inside the group; no '/' and no ','
  ColumnType type;
  std::string unit;  // stored as the dataset's `unit` attribute: "nats", "s", "bytes", "" for counts
};

struct TableSpec {
  std::string group;            // e.g. "train" or "diagnostics/lep"; unique within a file
  std::vector<Column> columns;  // at least one; names unique within the group
};

// One value of a row. Pass int64_t for kInt64 columns and double for kFloat64 columns; there is no
// implicit conversion between them (cast sizes and counts: int64_t(bytes)).
using Cell = std::variant<int64_t, double>;

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // Buffers one row of `group`: one Cell per column, in TableSpec order. Throws std::runtime_error on an
  // unknown group, a wrong row length or a wrong cell type; nothing is buffered then.
  virtual void append(const std::string& group, const std::vector<Cell>& row) = 0;
  // Makes every buffered row durable (see the durability design above).
  virtual void flush() = 0;
};

// For ranks that do not write results and for tests: accepts and forgets everything.
class NullMetricsSink final : public MetricsSink {
 public:
  void append(const std::string&, const std::vector<Cell>&) override {}
  void flush() override {}
};

// Thrown by Hdf5MetricsSink's constructor when its path already exists (the message names it).
class ResultsFileExists : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Hdf5MetricsSink final : public MetricsSink {
 public:
  static constexpr std::size_t kChunkRows = 1024;  // rows per HDF5 chunk (8 KiB per column)
  static constexpr std::size_t kReserveSlackBytes = 64 * 1024;  // metadata a flush may add besides chunks

  // Creates `path`, which must not exist, writes `root_attributes` as UTF-8 string attributes of "/",
  // creates every table's group and empty datasets with their units, and closes the file. Never
  // truncates: an existing `path` (an earlier attempt's results) throws ResultsFileExists, also when
  // another process creates it first (exclusive create), and the file is left as it was. Throws
  // std::runtime_error naming the path (missing directory, no permission) or the offending
  // group/column (empty or duplicate names, no columns).
  Hdf5MetricsSink(const std::string& path, const std::map<std::string, std::string>& root_attributes,
                  const std::vector<TableSpec>& tables);
  // Flushes and closes; never throws (a failed final flush is reported on stderr; after a failed
  // flush() the caller has seen, nothing is retried or printed).
  ~Hdf5MetricsSink() override;
  Hdf5MetricsSink(const Hdf5MetricsSink&) = delete;
  Hdf5MetricsSink& operator=(const Hdf5MetricsSink&) = delete;

  // O(columns), in memory only.
  void append(const std::string& group, const std::vector<Cell>& row) override;
  // Opens the file (SWMR-write), appends all buffered rows to their datasets, closes it. No-op when
  // nothing is buffered. First it reserves the bytes the flush can add (posix_fallocate: a generous
  // bound from the new rows and chunks), so a full disk, a quota or a file-size limit fails HERE,
  // before HDF5 writes anything: std::runtime_error naming the file and the OS error, and the file
  // keeps every row flushed before, readable (an HDF5 write that fails half-way would leave a
  // superblock that points past the file's end, and the whole file unreadable). A flush that fails
  // before HDF5 opens the file (no space, the file moved away) keeps the rows buffered, and a later
  // flush writes them at the same positions; after a failure inside HDF5 the sink writes nothing
  // more: later flush() calls (and the destructor) rethrow that error, and the buffered rows are lost.
  void flush() override;

  const std::string& path() const { return path_; }

 private:
  struct Table {
    TableSpec spec;
    std::size_t rows_written = 0;              // rows already in the file
    std::size_t rows_buffered = 0;             // rows in the buffers below
    std::vector<std::vector<int64_t>> ints;    // [column][row], used for kInt64 columns
    std::vector<std::vector<double>> doubles;  // [column][row], used for kFloat64 columns
  };

  void create_file(const std::map<std::string, std::string>& root_attributes);
  void write_new_file(const std::map<std::string, std::string>& root_attributes, bool& created);
  void write_table(H5::H5File& file, Table& table);
  std::size_t bytes_to_reserve() const;
  void reserve_space(std::size_t bytes);

  std::string path_;
  std::string failed_;  // set by a failed flush: no later write touches the file (see flush())
  bool last_flush_failed_ = false;  // the destructor does not repeat an error the caller has seen
  std::vector<Table> tables_;                            // in TableSpec order
  std::unordered_map<std::string, std::size_t> index_;  // group -> position in tables_
};

}  // namespace optcc

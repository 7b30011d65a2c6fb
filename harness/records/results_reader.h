// Reading a results file back (the writer is harness/records/metrics.h, whose layout this follows): one
// table's columns and root string attributes. Used by `optcc trace` and tests. Opens the file
// read-only with file locking off (HDF5 >= 1.10.7), so it works on a finished run and between the
// flushes of a running one (metrics.h: "Reading a live run"); a file whose writer was killed (its run
// lock free, the "open for write" flag still set) is cleared first (clear_stale_write_flag).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace optcc {

/// One table (group) of a results file: int64 columns in `ints`, float64 columns in `doubles`,
/// all `rows` long.
struct TableData {
  size_t rows = 0;
  std::map<std::string, std::vector<int64_t>> ints;
  std::map<std::string, std::vector<double>> doubles;
  const std::vector<int64_t>& int_column(const std::string& name) const;     // throws std::runtime_error
  const std::vector<double>& double_column(const std::string& name) const;  // when absent
};

/// Whether `group` exists in the file at `path`. Throws std::runtime_error when the file cannot be
/// opened (naming it and HDF5's reason).
bool results_has_group(const std::string& path, const std::string& group);
/// Every column of `group` (its `columns` attribute). Throws std::runtime_error naming the file and
/// the group when either is missing or a column is neither int64 nor float64.
TableData read_results_table(const std::string& path, const std::string& group);
/// A UTF-8 string attribute of "/"; "" when absent.
std::string read_root_attribute(const std::string& path, const std::string& name);

/// The results files of run `run` in `dir`, sorted: <run>.h5, <run>.resumed-<S>[.attempt-<N>].h5 and
/// <run>.attempt-<N>.h5 (not the <run>.eval-<step>.h5 of `optcc eval`). Empty when `dir` does not exist.
std::vector<std::string> run_results_files(const std::string& dir, const std::string& run);

/// The run lock of a results file, <dir>/<run>.lock (harness/records/run_lock.h), for any of the
/// names above.
std::string results_lock_path(const std::string& path);

/// What `h5clear -s --increment=0` does, through the HDF5 library: a writer killed in SWMR mode
/// (SIGKILL, a node crash) leaves the superblock's "open for write" flags set, so a plain reader
/// (h5py.File(path, "r"), pandas, h5dump) fails with "file is already open for write"; this clears
/// them and sets the end of the file's address space to its size, so every row the writer flushed
/// reads back. Does nothing to a file without the flags. Call it only where no writer can be at
/// work: holding the run's lock (the trainer on resume), or after the lock was found free (the
/// readers below, scripts/optcc_results.py). True when flags were cleared; false when there were
/// none or the file could not be opened for writing (then it is left as it was).
bool clear_stale_write_flag(const std::string& path);

}  // namespace optcc

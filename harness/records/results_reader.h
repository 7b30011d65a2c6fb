// Reading a results file back (the writer is harness/records/metrics.h, whose layout this follows): one
// table's columns and root string attributes. Used by `optcc trace` and tests. Opens the file
// read-only with file locking off (HDF5 >= 1.10.7), so it works on a finished run and between the
// flushes of a running one (metrics.h: "Reading a live run").
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

}  // namespace optcc

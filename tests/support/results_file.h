// Reading a results file in the integration tests: its columns, written by a process that may have
// died (SWMR read).
#pragma once

#include <H5Cpp.h>

#include <cstdint>
#include <string>
#include <vector>

namespace optcc::testing {

/// /train/step of results file `file` (opened for SWMR reading: the writer may have died in a flush).
inline std::vector<int64_t> read_train_steps(const std::string& file) {
  H5::H5File f(file, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ);
  auto ds = f.openDataSet("/train/step");
  hsize_t n = 0;
  ds.getSpace().getSimpleExtentDims(&n);
  std::vector<int64_t> v(n);
  if (n > 0) ds.read(v.data(), H5::PredType::NATIVE_INT64);
  return v;
}

/// A float64 column (e.g. "/train/loss", "/eval/loss") of results file `file`, read as above.
inline std::vector<double> read_column(const std::string& file, const std::string& dataset) {
  H5::H5File f(file, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ);
  auto ds = f.openDataSet(dataset);
  hsize_t n = 0;
  ds.getSpace().getSimpleExtentDims(&n);
  std::vector<double> v(n);
  if (n > 0) ds.read(v.data(), H5::PredType::NATIVE_DOUBLE);
  return v;
}

}  // namespace optcc::testing

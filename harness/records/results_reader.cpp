// Reading tables and attributes of a results file (see results_reader.h).
#include "harness/records/results_reader.h"

#include <H5Cpp.h>
#include <fmt/core.h>

#include <stdexcept>

namespace optcc {
namespace {

H5::H5File open_read_only(const std::string& path) {
  H5::FileAccPropList fapl;
#if H5_VERSION_GE(1, 10, 7)
  fapl.setFileLocking(false, true);
#endif
  H5E_auto2_t old_func = nullptr;  // no HDF5 error stack on stderr: the exception says it
  void* old_data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  try {
    H5::H5File file(path, H5F_ACC_RDONLY, H5::FileCreatPropList::DEFAULT, fapl);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    return file;
  } catch (const H5::Exception& e) {
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    throw std::runtime_error(fmt::format("cannot open results file '{}' ({}). Fix: give the .h5 file a run wrote.",
                                         path, e.getDetailMsg()));
  }
}

std::string read_string_attribute(const H5::H5Object& where, const std::string& name) {
  if (!where.attrExists(name)) return "";
  H5::Attribute attr = where.openAttribute(name);
  std::string value;
  attr.read(attr.getStrType(), value);
  return value;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      if (i > start) out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

}  // namespace

const std::vector<int64_t>& TableData::int_column(const std::string& name) const {
  auto it = ints.find(name);
  if (it == ints.end()) throw std::runtime_error(fmt::format("results table has no int64 column '{}'", name));
  return it->second;
}

const std::vector<double>& TableData::double_column(const std::string& name) const {
  auto it = doubles.find(name);
  if (it == doubles.end()) throw std::runtime_error(fmt::format("results table has no float64 column '{}'", name));
  return it->second;
}

bool results_has_group(const std::string& path, const std::string& group) {
  H5::H5File file = open_read_only(path);
  return file.nameExists(group);
}

TableData read_results_table(const std::string& path, const std::string& group) {
  H5::H5File file = open_read_only(path);
  if (!file.nameExists(group)) {
    throw std::runtime_error(fmt::format("results file '{}' has no group '/{}'", path, group));
  }
  H5::Group g = file.openGroup(group);
  TableData t;
  for (const std::string& column : split(read_string_attribute(g, "columns"), ',')) {
    H5::DataSet ds = g.openDataSet(column);
    hsize_t rows = 0;
    ds.getSpace().getSimpleExtentDims(&rows);
    t.rows = static_cast<size_t>(rows);
    const H5T_class_t cls = ds.getTypeClass();
    if (cls == H5T_INTEGER) {
      auto& v = t.ints[column];
      v.resize(t.rows);
      if (rows > 0) ds.read(v.data(), H5::PredType::NATIVE_INT64);
    } else if (cls == H5T_FLOAT) {
      auto& v = t.doubles[column];
      v.resize(t.rows);
      if (rows > 0) ds.read(v.data(), H5::PredType::NATIVE_DOUBLE);
    } else {
      throw std::runtime_error(fmt::format("results file '{}': /{}/{} is neither int64 nor float64", path, group, column));
    }
  }
  return t;
}

std::string read_root_attribute(const std::string& path, const std::string& name) {
  H5::H5File file = open_read_only(path);
  return read_string_attribute(file, name);
}

}  // namespace optcc

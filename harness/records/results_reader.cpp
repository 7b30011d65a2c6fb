// Reading tables and attributes of a results file (see results_reader.h).
#include "harness/records/results_reader.h"

#include <H5Cpp.h>
#include <fmt/core.h>

#include <fcntl.h>
#include <hdf5.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>

namespace optcc {
namespace {

// No HDF5 error stack on stderr while it lives: a failure is reported by the caller's exception.
class QuietHdf5 {
 public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

H5::H5File open_plain(const std::string& path) {
  H5::FileAccPropList fapl;
#if H5_VERSION_GE(1, 10, 7)
  fapl.setFileLocking(false, true);
#endif
  return H5::H5File(path, H5F_ACC_RDONLY, H5::FileCreatPropList::DEFAULT, fapl);
}

// A shared flock of the run's lock file: taken while its writer lives (run_lock.h holds it
// exclusively), so taking it says the writer is gone. -1 when the writer is alive; else an open
// descriptor holding the shared lock (or -2: no lock file, nobody holds one).
int share_run_lock(const std::string& results_path) {
  const int fd = ::open(results_lock_path(results_path).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -2;
  if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

H5::H5File open_read_only(const std::string& path) {
  const QuietHdf5 quiet;
  try {
    return open_plain(path);
  } catch (const H5::Exception& e) {
    std::string why = e.getDetailMsg();
    if (why.find("already open for write") != std::string::npos || why.find("H5Fopen") != std::string::npos) {
      // Perhaps a killed writer's flag: cleared when the run lock is free (held shared meanwhile).
      const int lock = share_run_lock(path);
      if (lock != -1) {
        const bool cleared = clear_stale_write_flag(path);
        if (lock >= 0) ::close(lock);
        if (cleared) return open_plain(path);
      } else {
        why += "; its run still holds the lock " + results_lock_path(path) + " (a live run: read it between flushes "
               "with an SWMR reader)";
      }
    }
    throw std::runtime_error(fmt::format("cannot open results file '{}' ({}). Fix: give the .h5 file a run wrote.",
                                         path, why));
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

bool is_run_file(const std::string& name, const std::string& run) {
  if (name.size() < 3 || name.compare(name.size() - 3, 3, ".h5") != 0) return false;
  if (name.find(".eval-") != std::string::npos) return false;  // `optcc eval`'s output
  return name == run + ".h5" || name.rfind(run + ".resumed-", 0) == 0 || name.rfind(run + ".attempt-", 0) == 0;
}

}  // namespace

std::vector<std::string> run_results_files(const std::string& dir, const std::string& run) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec) && is_run_file(e.path().filename().string(), run)) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string results_lock_path(const std::string& path) {
  const std::filesystem::path p(path);
  std::string name = p.filename().string();
  for (const char* suffix : {".resumed-", ".attempt-"}) {  // <run>[.resumed-S][.attempt-N].h5
    const auto at = name.find(suffix);
    if (at != std::string::npos) name = name.substr(0, at) + ".h5";
  }
  return (p.parent_path() / (name.substr(0, name.size() - 3) + ".lock")).string();
}

bool clear_stale_write_flag(const std::string& path) {
  const QuietHdf5 quiet;
  {  // A plain open succeeds: no flag to clear.
    const hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (fid >= 0) {
      H5Fclose(fid);
      return false;
    }
  }
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0) return false;
  hbool_t clear = true;  // the library's own property, the one h5clear sets
  bool cleared = false;
  if (H5Pset(fapl, "clear_status_flags", &clear) >= 0) {
    const hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl);
    if (fid >= 0) {
      const bool grown = H5Fincrement_filesize(fid, 0) >= 0;  // end of address space = the file's size
      cleared = H5Fclose(fid) >= 0 && grown;
    }
  }
  H5Pclose(fapl);
  return cleared;
}

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

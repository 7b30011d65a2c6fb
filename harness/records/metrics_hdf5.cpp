// Hdf5MetricsSink: see metrics.h for the file layout and the durability design (open per flush).
#include "harness/records/metrics.h"

#include <H5Cpp.h>
#include <fmt/core.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <unordered_set>
#include <utility>

namespace optcc {
namespace {

const char* type_name(ColumnType t) { return t == ColumnType::kInt64 ? "int64" : "float64"; }

std::string join_names(const std::vector<Column>& columns, const char* sep) {
  std::string out;
  for (const Column& c : columns) out += (out.empty() ? "" : sep) + c.name;
  return out;
}

// While alive, HDF5 does not print its error stack; instead the first failing API call's stack is
// condensed into detail() ("outermost: innermost" description). The C++ API cannot give this: its
// exceptions carry only "H5Fcreate failed", and destructors run during unwinding clear the stack.
class Hdf5ErrorCapture {
 public:
  Hdf5ErrorCapture() {
    H5Eget_auto2(H5E_DEFAULT, &old_func_, &old_data_);
    H5Eset_auto2(H5E_DEFAULT, &Hdf5ErrorCapture::on_error, &detail_);
  }
  ~Hdf5ErrorCapture() { H5Eset_auto2(H5E_DEFAULT, old_func_, old_data_); }
  const std::string& detail() const { return detail_; }

 private:
  static herr_t on_error(hid_t stack, void* data) {
    auto* detail = static_cast<std::string*>(data);
    if (!detail->empty()) return 0;  // keep the first failure, not those of cleanup calls
    std::vector<std::string> descs;
    H5Ewalk2(stack, H5E_WALK_DOWNWARD, &Hdf5ErrorCapture::collect, &descs);
    if (descs.empty()) return 0;
    const std::string &outer = descs.front(), &inner = descs.back();
    *detail = inner.rfind(outer, 0) == 0 ? inner : outer + ": " + inner;  // no "x: x: ..." repeats
    return 0;
  }
  static herr_t collect(unsigned, const H5E_error2_t* err, void* data) {
    if (err->desc != nullptr && err->desc[0] != '\0')
      static_cast<std::vector<std::string>*>(data)->push_back(err->desc);
    return 0;
  }
  H5E_auto2_t old_func_ = nullptr;
  void* old_data_ = nullptr;
  std::string detail_;
};

// Runs `fn`, turning H5::Exception into std::runtime_error("metrics: <context>: HDF5 <detail>; <hint>").
template <typename Fn>
void with_hdf5(const std::string& context, const std::string& hint, Fn&& fn) {
  Hdf5ErrorCapture capture;
  try {
    fn();
  } catch (const H5::Exception& e) {
    std::string detail = capture.detail().empty() ? e.getDetailMsg() : capture.detail();
    throw std::runtime_error(fmt::format("metrics: {}: HDF5 {}: {}; {}", context, e.getFuncName(),
                                         detail, hint));
  }
}

// Format v110 (superblock v3) is what SWMR needs; locking off so readers never block a flush.
H5::FileAccPropList writer_access() {
  H5::FileAccPropList fapl;
  fapl.setLibverBounds(H5F_LIBVER_V110, H5F_LIBVER_LATEST);
#if H5_VERSION_GE(1, 10, 7)
  fapl.setFileLocking(false, true);
#endif  // older HDF5: export HDF5_USE_FILE_LOCKING=FALSE, or readers holding the file block flushes
  return fapl;
}

void write_string_attribute(const H5::H5Object& where, const std::string& name, const std::string& value) {
  H5::StrType utf8(H5::PredType::C_S1, H5T_VARIABLE);
  utf8.setCset(H5T_CSET_UTF8);
  H5::Attribute attr = where.createAttribute(name, utf8, H5::DataSpace(H5S_SCALAR));
  attr.write(utf8, value);
}

void check_name(const std::string& name, bool is_group, const std::string& where) {
  bool bad = name.empty() || name == "." || name.find(',') != std::string::npos;
  if (is_group)
    bad = bad || name.front() == '/' || name.back() == '/' || name.find("//") != std::string::npos;
  else
    bad = bad || name.find('/') != std::string::npos;
  if (bad)
    throw std::runtime_error(fmt::format(
        "metrics: invalid {} name '{}'{}; use a non-empty name without ','{}", is_group ? "group" : "column",
        name, where, is_group ? " and without leading, trailing or doubled '/'" : " or '/'"));
}

}  // namespace

Hdf5MetricsSink::Hdf5MetricsSink(const std::string& path,
                                 const std::map<std::string, std::string>& root_attributes,
                                 const std::vector<TableSpec>& tables)
    : path_(path) {
  for (const TableSpec& spec : tables) {
    check_name(spec.group, true, fmt::format(" in results file '{}'", path));
    if (spec.columns.empty())
      throw std::runtime_error(fmt::format("metrics: group '{}' of '{}' has no columns; give its TableSpec "
                                           "at least one Column", spec.group, path));
    std::unordered_set<std::string> seen;
    for (const Column& c : spec.columns) {
      check_name(c.name, false, fmt::format(" in group '{}'", spec.group));
      if (!seen.insert(c.name).second)
        throw std::runtime_error(fmt::format("metrics: group '{}' lists column '{}' twice; column names "
                                             "must be unique within a group", spec.group, c.name));
    }
    if (!index_.emplace(spec.group, tables_.size()).second)
      throw std::runtime_error(fmt::format("metrics: group '{}' is given twice for '{}'; merge the two "
                                           "TableSpecs", spec.group, path));
    Table table;
    table.spec = spec;
    table.ints.resize(spec.columns.size());
    table.doubles.resize(spec.columns.size());
    tables_.push_back(std::move(table));
  }
  create_file(root_attributes);
}

void Hdf5MetricsSink::create_file(const std::map<std::string, std::string>& root_attributes) {
  const auto refuse = [&] {
    return ResultsFileExists(fmt::format(
        "metrics: results file '{}' already exists; it is never overwritten (it may hold an earlier attempt's "
        "rows). Fix: write to another path",
        path_));
  };
  if (std::filesystem::exists(path_)) throw refuse();
  bool created = false;
  try {
    with_hdf5(fmt::format("cannot create results file '{}'", path_),
              "check that its directory exists and is writable, or choose another results path",
              [&] { write_new_file(root_attributes, created); });
  } catch (const std::runtime_error&) {
    if (!created && std::filesystem::exists(path_)) throw refuse();  // lost a race for the name
    throw;
  }
}

void Hdf5MetricsSink::write_new_file(const std::map<std::string, std::string>& root_attributes, bool& created) {
  H5::H5File file(path_, H5F_ACC_EXCL, H5::FileCreatPropList::DEFAULT, writer_access());  // fails if it exists
  created = true;
  for (const auto& [name, value] : root_attributes) write_string_attribute(file, name, value);

  const hsize_t empty = 0, unlimited = H5S_UNLIMITED, chunk = kChunkRows;
  H5::DataSpace space(1, &empty, &unlimited);
  H5::DSetCreatPropList dcpl;
  dcpl.setChunk(1, &chunk);
  H5::LinkCreatPropList lcpl;
  lcpl.setCreateIntermediateGroup(true);  // "diagnostics/lep" creates "diagnostics" too
  for (const Table& t : tables_) {
    H5::Group group = file.createGroup(t.spec.group, lcpl);
    write_string_attribute(group, "columns", join_names(t.spec.columns, ","));
    for (const Column& c : t.spec.columns) {
      const H5::PredType& type =
          c.type == ColumnType::kInt64 ? H5::PredType::STD_I64LE : H5::PredType::IEEE_F64LE;
      H5::DataSet ds = group.createDataSet(c.name, type, space, dcpl);
      write_string_attribute(ds, "unit", c.unit);
    }
  }
  file.close();
}

Hdf5MetricsSink::~Hdf5MetricsSink() {
  if (!failed_.empty() || last_flush_failed_) return;  // that error was reported; the file keeps its earlier rows
  try {
    flush();
  } catch (const std::exception& e) {
    fmt::print(stderr, "{} (rows buffered since the last flush are lost)\n", e.what());
  } catch (...) {
    fmt::print(stderr, "metrics: final flush of '{}' failed with an unknown exception\n", path_);
  }
}

void Hdf5MetricsSink::append(const std::string& group, const std::vector<Cell>& row) {
  auto it = index_.find(group);
  if (it == index_.end()) {
    std::string known;
    for (const Table& t : tables_) known += (known.empty() ? "'" : ", '") + t.spec.group + "'";
    throw std::runtime_error(fmt::format("metrics: append to unknown group '{}' of '{}' (known: {}); add "
                                         "a TableSpec for it when constructing the sink",
                                         group, path_, known.empty() ? "none" : known));
  }
  Table& t = tables_[it->second];
  const std::vector<Column>& columns = t.spec.columns;
  if (row.size() != columns.size())
    throw std::runtime_error(fmt::format("metrics: group '{}' expects {} values per row ({}) but got {}",
                                         group, columns.size(), join_names(columns, ", "), row.size()));
  for (std::size_t i = 0; i < columns.size(); ++i) {  // check all before buffering any
    bool is_int = std::holds_alternative<int64_t>(row[i]);
    if (is_int != (columns[i].type == ColumnType::kInt64))
      throw std::runtime_error(fmt::format(
          "metrics: group '{}' column '{}' (value {} of the row) is {} but got {} value; pass {}", group,
          columns[i].name, i + 1, type_name(columns[i].type), is_int ? "an int64" : "a float64",
          is_int ? "a double (e.g. 1.0, or double(x))" : "an int64_t (e.g. int64_t(x))"));
  }
  for (std::size_t i = 0; i < columns.size(); ++i) {
    if (columns[i].type == ColumnType::kInt64)
      t.ints[i].push_back(std::get<int64_t>(row[i]));
    else
      t.doubles[i].push_back(std::get<double>(row[i]));
  }
  ++t.rows_buffered;
}

// An upper bound of what one flush adds to the file: every chunk the new rows start (a chunk is
// allocated whole when first written; the partly filled last one is rewritten in place), an index
// share per column, and slack for object headers and free-space bookkeeping.
std::size_t Hdf5MetricsSink::bytes_to_reserve() const {
  std::size_t bytes = kReserveSlackBytes;
  for (const Table& t : tables_) {
    if (t.rows_buffered == 0) continue;
    const std::size_t chunks_before = (t.rows_written + kChunkRows - 1) / kChunkRows;
    const std::size_t chunks_after = (t.rows_written + t.rows_buffered + kChunkRows - 1) / kChunkRows;
    bytes += t.spec.columns.size() * ((chunks_after - chunks_before) * kChunkRows * 8 + 2048);
  }
  return bytes;
}

// Allocates `bytes` past the file's end, then gives them back, before HDF5 writes: exact for a
// file-size limit or a quota; for a full disk only another writer filling it in that moment slips
// through. Throws naming the file and the OS error.
void Hdf5MetricsSink::reserve_space(std::size_t bytes) {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error(fmt::format("metrics: cannot append rows to results file '{}': cannot open it: {}; check "
                                         "that the file was not moved or deleted during the run",
                                         path_, std::strerror(errno)));
  }
  struct stat st {};
  int error = ::fstat(fd, &st) != 0 ? errno : 0;
  if (error == 0) error = ::posix_fallocate(fd, st.st_size, static_cast<off_t>(bytes));
  if (error == 0 && ::ftruncate(fd, st.st_size) != 0) error = errno;
  ::close(fd);
  if (error == 0) return;
  throw std::runtime_error(fmt::format(
      "metrics: cannot append rows to results file '{}': {} (errno {}) while reserving {} bytes: the disk is full or "
      "a quota or file-size limit is reached. The file keeps every row flushed before and stays readable; the "
      "rows since are lost. Fix: free space there (or point log.dir elsewhere); --resume auto then continues "
      "from the last checkpoint, if there is one, into a new results file",
      path_, std::strerror(error), error, bytes));
}

void Hdf5MetricsSink::flush() {
  if (!failed_.empty()) throw std::runtime_error(failed_);
  bool pending = false;
  for (const Table& t : tables_) pending = pending || t.rows_buffered > 0;
  if (!pending) return;
  last_flush_failed_ = true;           // until this flush succeeds
  reserve_space(bytes_to_reserve());  // fails before the file is touched: the rows stay buffered for a retry
  try {
    with_hdf5(fmt::format("cannot append rows to results file '{}'", path_),
              "check free disk space and that the file was not moved or deleted during the run", [&] {
      H5::H5File file(path_, H5F_ACC_RDWR | H5F_ACC_SWMR_WRITE, H5::FileCreatPropList::DEFAULT,
                      writer_access());
      for (Table& t : tables_)
        if (t.rows_buffered > 0) write_table(file, t);
      file.flush(H5F_SCOPE_GLOBAL);
      file.close();  // clears the superblock's "open for write" mark: a plain open works until next flush
    });
  } catch (const std::runtime_error& e) {
    failed_ = e.what();
    throw;
  }
  last_flush_failed_ = false;
  for (Table& t : tables_) {
    t.rows_written += t.rows_buffered;
    t.rows_buffered = 0;
    for (auto& v : t.ints) v.clear();
    for (auto& v : t.doubles) v.clear();
  }
}

void Hdf5MetricsSink::write_table(H5::H5File& file, Table& t) {
  const hsize_t start = t.rows_written, count = t.rows_buffered, total = start + count;
  H5::DataSpace memory(1, &count);
  for (std::size_t i = 0; i < t.spec.columns.size(); ++i) {
    const Column& c = t.spec.columns[i];
    H5::DataSet ds = file.openDataSet(t.spec.group + "/" + c.name);
    ds.extend(&total);
    H5::DataSpace in_file = ds.getSpace();
    in_file.selectHyperslab(H5S_SELECT_SET, &count, &start);
    if (c.type == ColumnType::kInt64)
      ds.write(t.ints[i].data(), H5::PredType::NATIVE_INT64, memory, in_file);
    else
      ds.write(t.doubles[i].data(), H5::PredType::NATIVE_DOUBLE, memory, in_file);
  }
}

}  // namespace optcc

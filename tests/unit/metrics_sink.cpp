// Hdf5MetricsSink in one process: round trip through the HDF5 C++ API, errors, a file-size limit,
// flush cost.
#include <H5Cpp.h>
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

#include "harness/records/metrics.h"

namespace optcc {
namespace {

namespace fs = std::filesystem;

class MetricsSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("optcc_metrics_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  static std::vector<TableSpec> tables() {
    return {{"train",
             {{"step", ColumnType::kInt64, ""},
              {"loss", ColumnType::kFloat64, "nats"},
              {"lr", ColumnType::kFloat64, ""},
              {"step_seconds", ColumnType::kFloat64, "s"}}},
            {"eval", {{"step", ColumnType::kInt64, ""}, {"ppl", ColumnType::kFloat64, ""}}},
            {"diagnostics/traffic",
             {{"step", ColumnType::kInt64, ""},
              {"bytes", ColumnType::kInt64, "bytes"},
              {"seconds", ColumnType::kFloat64, "s"}}}};
  }
  fs::path dir_;
};

template <typename T>
std::vector<T> read_series(const H5::H5File& f, const std::string& name) {
  H5::DataSet ds = f.openDataSet(name);
  hsize_t n = 0;
  ds.getSpace().getSimpleExtentDims(&n);
  std::vector<T> out(n);
  const H5::PredType& memory_type =
      std::is_same_v<T, int64_t> ? H5::PredType::NATIVE_INT64 : H5::PredType::NATIVE_DOUBLE;
  if (n > 0) ds.read(out.data(), memory_type);
  return out;
}

std::string read_string_attr(const H5::H5Object& obj, const std::string& name) {
  H5::Attribute attr = obj.openAttribute(name);
  std::string value;
  attr.read(attr.getStrType(), value);
  return value;
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST_F(MetricsSinkTest, RoundTripsValuesLengthsAttributesAndUnits) {
  std::string config = "# effective config\nmodel:\n  layers: 12\n  note: \"µ-batch ≥ 1\"\n";
  while (config.size() < 6000) config += "  padding_key: 0123456789abcdef\n";  // configs are KBs
  const std::string path = file("run.h5");
  {
    Hdf5MetricsSink sink(path, {{"config", config}, {"git_revision", "abc123"}}, tables());
    for (int64_t i = 0; i < 2500; ++i) {  // crosses chunk boundaries (kChunkRows = 1024)
      sink.append("train", {i, 10.0 / double(i + 1), 1e-3 * double(i % 7), 0.125 * double(i)});
      if (i % 100 == 99) sink.append("eval", {i, 1.5 + double(i)});
      if (i % 10 == 0) sink.append("diagnostics/traffic", {i, int64_t{1} << 40, 1e-6});
      if (i % 300 == 299) sink.flush();
    }
    sink.flush();
    sink.flush();  // nothing buffered: no-op
    sink.append("eval", {int64_t{9999}, 2.0});  // written by the destructor
  }
  H5::H5File f(path, H5F_ACC_RDONLY);
  EXPECT_EQ(read_string_attr(f, "config"), config);
  EXPECT_EQ(read_string_attr(f, "git_revision"), "abc123");

  auto step = read_series<int64_t>(f, "train/step");
  auto loss = read_series<double>(f, "train/loss");
  auto lr = read_series<double>(f, "train/lr");
  auto secs = read_series<double>(f, "train/step_seconds");
  ASSERT_EQ(step.size(), 2500u);
  ASSERT_EQ(loss.size(), 2500u);
  ASSERT_EQ(lr.size(), 2500u);
  ASSERT_EQ(secs.size(), 2500u);
  for (int64_t i = 0; i < 2500; ++i) {
    ASSERT_EQ(step[i], i);
    ASSERT_EQ(loss[i], 10.0 / double(i + 1));
    ASSERT_EQ(lr[i], 1e-3 * double(i % 7));
    ASSERT_EQ(secs[i], 0.125 * double(i));
  }
  auto eval_step = read_series<int64_t>(f, "eval/step");
  auto ppl = read_series<double>(f, "eval/ppl");
  ASSERT_EQ(eval_step.size(), 26u);
  EXPECT_EQ(eval_step[0], 99);
  EXPECT_EQ(ppl[0], 100.5);
  EXPECT_EQ(eval_step[25], 9999);
  EXPECT_EQ(ppl[25], 2.0);
  auto bytes = read_series<int64_t>(f, "diagnostics/traffic/bytes");
  ASSERT_EQ(bytes.size(), 250u);
  EXPECT_EQ(bytes[249], int64_t{1} << 40);

  // Units, column order and on-disk types.
  EXPECT_EQ(read_string_attr(f.openDataSet("train/loss"), "unit"), "nats");
  EXPECT_EQ(read_string_attr(f.openDataSet("train/step_seconds"), "unit"), "s");
  EXPECT_EQ(read_string_attr(f.openDataSet("train/step"), "unit"), "");
  EXPECT_EQ(read_string_attr(f.openDataSet("diagnostics/traffic/bytes"), "unit"), "bytes");
  EXPECT_EQ(read_string_attr(f.openGroup("train"), "columns"), "step,loss,lr,step_seconds");
  EXPECT_EQ(f.openDataSet("train/step").getDataType(), H5::PredType::STD_I64LE);
  EXPECT_EQ(f.openDataSet("train/loss").getDataType(), H5::PredType::IEEE_F64LE);
}

TEST_F(MetricsSinkTest, RejectsBadRowsWithoutBufferingThem) {
  const std::string path = file("errors.h5");
  {
    Hdf5MetricsSink sink(path, {}, tables());
    std::string e = error_of([&] { sink.append("valid", {int64_t{1}}); });
    EXPECT_NE(e.find("unknown group 'valid'"), std::string::npos) << e;
    EXPECT_NE(e.find("known: 'train', 'eval', 'diagnostics/traffic'"), std::string::npos) << e;
    EXPECT_NE(e.find(path), std::string::npos) << e;

    e = error_of([&] { sink.append("eval", {int64_t{1}}); });
    EXPECT_NE(e.find("group 'eval' expects 2 values per row (step, ppl) but got 1"), std::string::npos) << e;

    e = error_of([&] { sink.append("train", {int64_t{1}, 2.0, int64_t{3}, 4.0}); });
    EXPECT_NE(e.find("column 'lr' (value 3 of the row) is float64 but got an int64 value"), std::string::npos)
        << e;
    e = error_of([&] { sink.append("eval", {1.0, 2.0}); });
    EXPECT_NE(e.find("column 'step'"), std::string::npos) << e;
    EXPECT_NE(e.find("pass an int64_t"), std::string::npos) << e;

    sink.append("train", {int64_t{7}, 2.0, 3.0, 4.0});
  }
  H5::H5File f(path, H5F_ACC_RDONLY);
  for (const char* name : {"train/step", "train/loss", "train/lr", "train/step_seconds"})
    EXPECT_EQ(read_series<double>(f, name).size(), 1u) << name;  // the rejected row left nothing
  EXPECT_EQ(read_series<int64_t>(f, "train/step")[0], 7);
  EXPECT_EQ(read_series<double>(f, "eval/ppl").size(), 0u);
}

TEST_F(MetricsSinkTest, ReportsUnwritablePathAndBadSpecs) {
  const std::string missing = file("no_such_dir/run.h5");
  std::string e = error_of([&] { Hdf5MetricsSink sink(missing, {}, tables()); });
  EXPECT_NE(e.find("cannot create results file '" + missing + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("No such file or directory"), std::string::npos) << e;  // HDF5's detail, not "failed"
  EXPECT_NE(e.find("check that its directory exists"), std::string::npos) << e;

  e = error_of([&] { Hdf5MetricsSink s(file("a.h5"), {}, {{"t", {}}}); });
  EXPECT_NE(e.find("group 't'"), std::string::npos) << e;
  EXPECT_NE(e.find("no columns"), std::string::npos) << e;
  TableSpec t{"t", {{"x", ColumnType::kInt64, ""}}};
  e = error_of([&] { Hdf5MetricsSink s(file("b.h5"), {}, {t, t}); });
  EXPECT_NE(e.find("group 't' is given twice"), std::string::npos) << e;
  e = error_of([&] { Hdf5MetricsSink s(file("c.h5"), {}, {{"t", {t.columns[0], t.columns[0]}}}); });
  EXPECT_NE(e.find("lists column 'x' twice"), std::string::npos) << e;
  e = error_of([&] { Hdf5MetricsSink s(file("d.h5"), {}, {{"t", {{"a/b", ColumnType::kInt64, ""}}}}); });
  EXPECT_NE(e.find("invalid column name 'a/b' in group 't'"), std::string::npos) << e;
}

TEST_F(MetricsSinkTest, FlushOfDeletedFileThrowsAndKeepsRows) {
  const std::string path = file("gone.h5");
  Hdf5MetricsSink sink(path, {}, tables());
  sink.append("eval", {int64_t{1}, 2.0});
  fs::rename(path, path + ".moved");
  std::string e = error_of([&] { sink.flush(); });
  EXPECT_NE(e.find("cannot append rows to results file '" + path + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("moved or deleted"), std::string::npos) << e;
  fs::rename(path + ".moved", path);
  sink.flush();  // the retry writes the kept row
  H5::H5File f(path, H5F_ACC_RDONLY);
  EXPECT_EQ(read_series<double>(f, "eval/ppl"), std::vector<double>{2.0});
}

// A file-size limit (ulimit -f; the same failing write as a full disk or a quota): the flush that
// would pass it fails before HDF5 writes anything, naming the file and the OS error; the file stays
// readable with every row flushed before (an HDF5 write failing half-way would leave it unreadable);
// later rows are refused. The soft limit is put back before the file is read.
TEST_F(MetricsSinkTest, FileSizeLimitFailsTheFlushAndKeepsEarlierRowsReadable) {
  const std::string path = file("full.h5");
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  getrlimit(RLIMIT_FSIZE, &old_limit);
  std::string error;
  int64_t flushed = 0;
  {
    Hdf5MetricsSink sink(path, {{"config", std::string(4000, 'x')}}, tables());
    rlimit limit = old_limit;
    limit.rlim_cur = static_cast<rlim_t>(fs::file_size(path)) + 600 * 1024;  // room for a few flushes
    setrlimit(RLIMIT_FSIZE, &limit);
    for (int64_t step = 1; step <= 100000 && error.empty(); ++step) {
      sink.append("train", {step, 1.0 * step, 1e-3, 0.5});
      sink.append("diagnostics/traffic", {step, int64_t{8} * step, 0.25});
      if (step % 50 == 0) {
        try {
          sink.flush();
          flushed = step;
        } catch (const std::runtime_error& e) {
          error = e.what();
        }
      }
    }
    EXPECT_THROW(sink.flush(), std::runtime_error);  // rows are refused after the failure, not half-written
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(error.empty()) << "the limit was never reached";
  EXPECT_NE(error.find("cannot append rows to results file '" + path + "': File too large (errno 27)"),
            std::string::npos) << error;
  EXPECT_NE(error.find("stays readable"), std::string::npos) << error;
  ASSERT_GT(flushed, 0);
  H5::H5File f(path, H5F_ACC_RDONLY);  // a plain open: not "truncated file"
  const auto steps = read_series<int64_t>(f, "train/step");
  ASSERT_EQ(steps.size(), static_cast<size_t>(flushed));
  for (int64_t i = 0; i < flushed; ++i) ASSERT_EQ(steps[i], i + 1);
  EXPECT_EQ(read_series<int64_t>(f, "diagnostics/traffic/bytes").back(), 8 * flushed);
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A second sink on an existing results file (a re-run, a requeue) is refused and the file keeps its
// bytes, its rows among them: the sink creates exclusively, it never truncates.
TEST_F(MetricsSinkTest, NeverTruncatesAnExistingFile) {
  const std::string path = file("run.h5");
  {
    Hdf5MetricsSink first(path, {{"attempt", "1"}}, tables());
    first.append("eval", {int64_t{1}, 2.0});
  }
  const std::string before = file_bytes(path);
  ASSERT_GT(before.size(), 0u);
  try {
    Hdf5MetricsSink second(path, {{"attempt", "2"}}, tables());
    FAIL() << "expected ResultsFileExists";
  } catch (const ResultsFileExists& e) {
    EXPECT_NE(std::string(e.what()).find("results file '" + path + "' already exists; it is never overwritten"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(file_bytes(path) == before) << path << " changed";
  H5::H5File f(path, H5F_ACC_RDONLY);
  EXPECT_EQ(read_series<double>(f, "eval/ppl"), std::vector<double>{2.0});
  EXPECT_EQ(read_string_attr(f, "attempt"), "1");

  const std::string text = file("notes.h5");  // not even HDF5: left alone too
  std::ofstream(text) << "keep me";
  EXPECT_THROW(Hdf5MetricsSink s(text, {}, tables()), ResultsFileExists);
  EXPECT_EQ(file_bytes(text), "keep me");
}

TEST_F(MetricsSinkTest, FlushOfTenRowsTakesMilliseconds) {
  Hdf5MetricsSink sink(file("speed.h5"), {{"config", std::string(4000, 'x')}}, tables());
  const int kFlushes = 100;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < kFlushes * 10; ++i) {
    sink.append("train", {i, 1.0, 2.0, 3.0});
    sink.append("diagnostics/traffic", {i, i, 0.5});
    if (i % 10 == 9) sink.flush();
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ metrics  ] %.3f ms per flush (7 columns, 10 rows)\n", ms / kFlushes);
  EXPECT_LT(ms / kFlushes, 20.0);
}

TEST(NullMetricsSink, AcceptsAnything) {
  NullMetricsSink sink;
  MetricsSink& s = sink;
  s.append("anything", {int64_t{1}, 2.0});
  s.flush();
}

}  // namespace
}  // namespace optcc

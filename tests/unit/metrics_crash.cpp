// Hdf5MetricsSink across processes: a writer child killed with SIGKILL leaves a file that C++ and plain
// h5py open; a live writer's flushed rows are visible to SWMR readers (C++ and h5py).
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <filesystem>
#include <string>
#include <vector>

#include "harness/records/metrics.h"

namespace optcc {
namespace {

namespace fs = std::filesystem;

const std::vector<TableSpec> kTables = {
    {"train", {{"step", ColumnType::kInt64, ""}, {"loss", ColumnType::kFloat64, "nats"}}}};
const std::map<std::string, std::string> kRoot = {{"config", "model:\n  layers: 2\n"}};

double loss_at(int64_t i) { return 0.25 * double(i) - 3.0; }  // exact in decimal, for python too

// A forked writer. The child runs `body(sink, from_parent, to_parent)` and is killed by the parent.
class WriterChild {
 public:
  template <typename Body>
  WriterChild(const std::string& path, Body body) {
    int up[2], down[2];
    if (::pipe(up) != 0 || ::pipe(down) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(up[0]);
      ::close(down[1]);
      int rc = 0;
      try {
        Hdf5MetricsSink sink(path, kRoot, kTables);
        body(sink, down[0], up[1]);
        char c;
        while (::read(down[0], &c, 1) > 0) {}  // wait to be killed
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writer child: %s\n", e.what());
        rc = 1;
      }
      ::_exit(rc);
    }
    ::close(up[1]);
    ::close(down[0]);
    from_child_ = up[0];
    to_child_ = down[1];
  }
  ~WriterChild() {
    kill();
    ::close(from_child_);
    ::close(to_child_);
  }
  // Waits (at most 5 s) for the child's next readiness byte.
  bool wait_ready() {
    pollfd p{from_child_, POLLIN, 0};
    char c;
    return ::poll(&p, 1, 5000) == 1 && ::read(from_child_, &c, 1) == 1;
  }
  void tell() { ASSERT_EQ(::write(to_child_, "g", 1), 1); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int from_child_ = -1, to_child_ = -1;
};

void signal_parent(int fd) { (void)!::write(fd, "r", 1); }
void wait_parent(int fd) {
  char c;
  (void)!::read(fd, &c, 1);
}

// Appends rows [from, to) to "train", flushing after every `every` rows (0: never).
void append_rows(Hdf5MetricsSink& sink, int64_t from, int64_t to, int64_t every) {
  for (int64_t i = from; i < to; ++i) {
    sink.append("train", {i, loss_at(i)});
    if (every > 0 && (i + 1) % every == 0) sink.flush();
  }
}

void expect_rows(H5::H5File& f, size_t n) {
  H5::DataSet step = f.openDataSet("train/step"), loss = f.openDataSet("train/loss");
  H5Drefresh(step.getId());  // no-op for a non-SWMR open; picks up new rows for a SWMR reader
  H5Drefresh(loss.getId());
  hsize_t ns = 0, nl = 0;
  step.getSpace().getSimpleExtentDims(&ns);
  loss.getSpace().getSimpleExtentDims(&nl);
  ASSERT_EQ(ns, n);
  ASSERT_EQ(nl, n);
  std::vector<int64_t> s(n);
  std::vector<double> l(n);
  step.read(s.data(), H5::PredType::NATIVE_INT64);
  loss.read(l.data(), H5::PredType::NATIVE_DOUBLE);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(s[i], int64_t(i));
    ASSERT_EQ(l[i], loss_at(int64_t(i)));
  }
}

// A python3 that imports h5py ($OPTCC_PYTHON, python3, /usr/bin/python3), or "" if none.
std::string python_with_h5py() {
  std::vector<std::string> candidates = {"python3", "/usr/bin/python3"};
  if (const char* env = std::getenv("OPTCC_PYTHON")) candidates.insert(candidates.begin(), env);
  for (const std::string& py : candidates)
    if (std::system((py + " -c 'import h5py' >/dev/null 2>&1").c_str()) == 0) return py;
  return "";
}

// Runs `python -c <code> <path>`; returns its exit status and stdout.
std::pair<int, std::string> run_python(const std::string& py, const std::string& code,
                                       const std::string& path) {
  FILE* p = ::popen((py + " -c '" + code + "' '" + path + "' 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Reads train/* with h5py, checks every value, prints "rows <n> <type of the config attr> <unit>".
std::string h5py_check(bool swmr) {
  const std::string open =
      swmr ? R"(h5py.File(sys.argv[1], "r", swmr=True))" : R"(h5py.File(sys.argv[1], "r"))";
  return "import sys, h5py\nf = " + open + R"(
s, l = f["train/step"][:], f["train/loss"][:]
assert len(s) == len(l)
assert all(int(s[i]) == i and float(l[i]) == 0.25 * i - 3.0 for i in range(len(s)))
print("rows", len(s), type(f.attrs["config"]).__name__, f["train/loss"].attrs["unit"])
)";
}

class MetricsCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() / ("optcc_metrics_crash_" + std::to_string(::getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                                          ".h5")).string();
  }
  void TearDown() override { fs::remove(path_); }
  std::string path_;
};

TEST_F(MetricsCrashTest, SigkillAfterFlushLeavesPlainReadableFile) {
  {
    WriterChild child(path_, [](Hdf5MetricsSink& sink, int, int to_parent) {
      append_rows(sink, 0, 50, 10);      // flushed at 10, 20, ..., 50
      signal_parent(to_parent);
      append_rows(sink, 50, 5000, 0);    // buffered only: lost by the kill
    });
    ASSERT_TRUE(child.wait_ready()) << "writer child did not reach row 50";
    child.kill();
  }
  {
    H5::H5File f(path_, H5F_ACC_RDONLY);  // plain read-only open, no SWMR, no h5clear
    expect_rows(f, 50);
  }
  std::string py = python_with_h5py();
  if (py.empty()) GTEST_SKIP() << "no python3 with h5py (apt install python3-h5py, or set OPTCC_PYTHON)";
  auto [rc, out] = run_python(py, h5py_check(false), path_);  // plain h5py.File(path, "r")
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "rows 50 str nats\n");
}

TEST_F(MetricsCrashTest, LiveWriterIsReadableBySwmrReaders) {
  WriterChild child(path_, [](Hdf5MetricsSink& sink, int from_parent, int to_parent) {
    append_rows(sink, 0, 50, 10);
    signal_parent(to_parent);
    wait_parent(from_parent);
    append_rows(sink, 50, 100, 10);
    signal_parent(to_parent);
  });
  ASSERT_TRUE(child.wait_ready());

  H5::FileAccPropList fapl;
#if H5_VERSION_GE(1, 10, 7)
  fapl.setFileLocking(false, true);  // a reader that opens, keeps the file, and refreshes
#endif
  H5::H5File reader(path_, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5::FileCreatPropList::DEFAULT, fapl);
  expect_rows(reader, 50);
  std::string py = python_with_h5py();
  if (!py.empty()) {
    auto [rc, out] = run_python(py, h5py_check(true), path_);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(out, "rows 50 str nats\n");
  }

  child.tell();  // the writer appends and flushes 50 more rows while we hold the file open
  ASSERT_TRUE(child.wait_ready());
  expect_rows(reader, 100);
  if (!py.empty()) {
    auto [rc, out] = run_python(py, h5py_check(false), path_);  // between flushes a plain open works too
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(out, "rows 100 str nats\n");
  }
  reader.close();
  child.kill();
  if (py.empty()) GTEST_SKIP() << "C++ readers checked; no python3 with h5py for the h5py readers";
}

}  // namespace
}  // namespace optcc

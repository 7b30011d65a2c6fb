#include "harness/records/run_lock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <stdexcept>

namespace optcc {
namespace {

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

std::string holder_line(const std::string& run_name) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32] = {};
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const char* launcher = std::getenv("OPTCC_LAUNCHER_PID");  // a rank of `optcc train --nproc`
  return fmt::format("pid {} host {} started {} run {}{}", getpid(), host, when, run_name,
                     launcher ? fmt::format(" (global rank 0 of the --nproc launcher pid {})", launcher) : "");
}

}  // namespace

RunLock::RunLock(const std::string& path, const std::string& what, const std::string& run_name) : path_(path) {
  // Open, lock, then make sure the path still names the locked file: a holder that just released
  // removes the file, and a lock on a removed file would lock nothing.
  for (int attempt = 0;; ++attempt) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw std::runtime_error(fmt::format("cannot create the lock file {} of {}: {}. Fix: make that directory "
                                           "writable, or choose another one",
                                           path, what, std::strerror(errno)));
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      const std::string holder = read_all(fd_);
      ::close(fd_);
      fd_ = -1;
      if (e == EWOULDBLOCK) {
        throw RunLockHeld(fmt::format(
            "{} is in use by another run ({}: {}). Two runs must not share checkpoints or results. Fix: wait for "
            "that run to end, or give this one another log.run_name (and checkpoint.dir)",
            what, path, holder.empty() ? "holder unknown" : holder));
      }
      throw std::runtime_error(fmt::format("cannot lock {} of {}: {}. Fix: use a file system with flock (Lustre: "
                                           "mount with -o flock), or another directory",
                                           path, what, std::strerror(e)));
    }
    struct stat by_fd {}, by_path {};
    if (::fstat(fd_, &by_fd) == 0 && ::stat(path.c_str(), &by_path) == 0 && by_fd.st_ino == by_path.st_ino &&
        by_fd.st_dev == by_path.st_dev) {
      break;
    }
    ::close(fd_);
    fd_ = -1;
    if (attempt > 100) throw std::runtime_error(fmt::format("cannot lock {}: it keeps being replaced", path));
  }
  stale_holder_ = read_all(fd_);  // a dead holder's line (its lock went with it); "" for a new file
  const std::string line = holder_line(run_name) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error(fmt::format("cannot write the lock file {} of {}: {}", path, what, std::strerror(e)));
  }
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still locked: a waiting run then finds a new file, not this one
  ::close(fd_);
}

}  // namespace optcc

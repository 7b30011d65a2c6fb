// One run per checkpoint directory and results name: an exclusive lock held for the run's life.
//
// The lock is flock(2) on a file (`<checkpoint.dir>/optcc.lock`, `<log.dir>/<run>.lock`) whose text
// names the holder: "pid <pid> host <host> started <UTC time> run <run name>". The kernel releases a
// flock when its holder dies, however it dies, so a lock file left by a dead process (SIGKILL, OOM,
// a node crash on a network file system that drops the lock with the client) is taken over, with a
// warning naming the old holder; a live holder's lock is refused at once, naming it. On Linux NFS
// clients flock is carried as a POSIX lock (held across hosts); Lustre needs the `flock` mount
// option. Released (and the file removed) when the RunLock is destroyed.
#pragma once

#include <stdexcept>
#include <string>

namespace optcc {

/// Thrown by RunLock when another live process holds the lock; the message names the holder.
class RunLockHeld : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RunLock {
 public:
  /// Takes the lock of `path` (its directory must exist), writing this process's line into it.
  /// `what` names the locked thing in messages ("checkpoint.dir /x/ckpt/run"). Throws RunLockHeld
  /// naming the holder's line and the fix; std::runtime_error naming the path and the OS error when
  /// the file cannot be created or locked for another reason. `stale_holder()` is the line of a
  /// dead holder whose file this lock took over ("" when none).
  RunLock(const std::string& path, const std::string& what, const std::string& run_name);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const { return path_; }
  const std::string& stale_holder() const { return stale_holder_; }

 private:
  std::string path_;
  std::string stale_holder_;
  int fd_ = -1;
};

}  // namespace optcc

// Child processes for the integration tests that run the real binary (tests/integration/): start
// one with its output in files, wait for its exit status, read a file whole. POSIX only.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace optcc::testing {

/// The whole file (binary-safe); "" when it cannot be opened.
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Starts args[0] (a path) with `args`, stdout to `out` (truncated) and stderr to `err`, or to
/// `out` too when `err` is empty; environment `env` ("K=V" entries), or this process's when null.
/// Returns the child's pid, or -1 when posix_spawn failed.
inline pid_t spawn_logged(std::vector<std::string> args, const std::string& out, const std::string& err = "",
                          const std::vector<std::string>* env = nullptr) {
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_copy = env ? *env : std::vector<std::string>{};
  for (auto& e : env_copy) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (err.empty()) {
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  } else {
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), env ? envp.data() : environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

/// Waits for `pid` to end: its exit status, or 128 + the signal that ended it.
inline int wait_exit_code(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// spawn_logged, then wait_exit_code; -1 when the process could not be started.
inline int run_logged(std::vector<std::string> args, const std::string& out, const std::string& err = "") {
  const pid_t pid = spawn_logged(std::move(args), out, err);
  return pid < 0 ? -1 : wait_exit_code(pid);
}

/// This process's environment without any launcher variables (Slurm's, torchrun's, optcc's,
/// MASTER_*), plus `extra` ("K=V" entries).
inline std::vector<std::string> child_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const bool launcher = kv.rfind("SLURM_", 0) == 0 || kv.rfind("OPTCC_", 0) == 0 || kv.rfind("RANK=", 0) == 0 ||
                          kv.rfind("WORLD_SIZE=", 0) == 0 || kv.rfind("MASTER_", 0) == 0 ||
                          kv.rfind("LOCAL_RANK=", 0) == 0 || kv.rfind("LOCAL_WORLD_SIZE=", 0) == 0;
    if (!launcher) env.push_back(kv);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

/// Waits until the file `log` contains `text`; false after `limit` or when `pid` ended first.
inline bool wait_for(pid_t pid, const std::string& log, const std::string& text,
                     std::chrono::seconds limit = std::chrono::seconds(120)) {
  const auto start = std::chrono::steady_clock::now();
  while (slurp(log).find(text) == std::string::npos) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid || std::chrono::steady_clock::now() - start > limit) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

inline void kill_and_reap(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
}

/// The exit code of `pid` (128 + signal when a signal ended it), or -1 (after killing it) when it
/// still runs after `limit`.
inline int run_to_end(pid_t pid, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - start > limit) {
      kill_and_reap(pid);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace optcc::testing

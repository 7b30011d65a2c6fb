// Child processes for the integration tests that run the real binary (tests/integration/): start
// one with its output in files, wait for its exit status, read a file whole. POSIX only.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
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

}  // namespace optcc::testing

#include "harness/records/run_info.h"

#include "compat/torch_compat.h"  // torch_version()

#include "optcc_git_rev.h"  // generated at build time (cmake/git_rev.cmake)

#include <torch/torch.h>
#include <unistd.h>

#include <ctime>

namespace optcc {

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string utc_timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::map<std::string, std::string> run_attributes(const std::string& command_line) {
  return {
      {"git_revision", OPTCC_GIT_REV},
      {"torch_version", torch_version()},
      {"compiler", OPTCC_COMPILER},
      {"host", hostname()},
      {"start_time", utc_timestamp()},
      {"command", command_line},
      {"threads", std::to_string(at::get_num_threads())},
  };
}

}  // namespace optcc

// Running a child program without a shell (no string injection): argv is passed as is.
#pragma once

#include <string>
#include <vector>

namespace optcc::data {

struct ProcessResult {
  int exit_code = 0;   // exit status; 128 + signal number when the child was killed by a signal
  std::string out;     // everything the child wrote to stdout
  std::string err;     // everything the child wrote to stderr
};

// Runs argv[0] (looked up on PATH) with argv, waits for it and captures stdout and stderr.
// Throws std::runtime_error when the program cannot be started; the message names the program and
// appends `install_hint` (e.g. "install Node.js/npm: `make deps`"). A non-zero exit is NOT an error
// here: callers inspect `exit_code` and report `err` in their own words.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& install_hint = "");

// The command line as a human would type it, for messages ("npm pack nlp-corpus@4.4.0 ...").
std::string format_command(const std::vector<std::string>& argv);

}  // namespace optcc::data

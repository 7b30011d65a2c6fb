#include "harness/parallel/stop_signal.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace optcc {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void record_stop_signal(int signal) {
  if (g_stop_signal == 0) g_stop_signal = signal;
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = record_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocking read or collective is not interrupted: the step finishes
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int stop_signal_received() { return g_stop_signal; }

void clear_stop_signal() { g_stop_signal = 0; }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGINT: return "SIGINT";
    case SIGKILL: return "SIGKILL";
    default: return "a signal";
  }
}

void die_with_launcher() {
  const char* launcher = std::getenv("OPTCC_LAUNCHER_PID");
  if (launcher == nullptr) return;
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The launcher may have died between our start and prctl: then nobody would signal us.
  if (std::to_string(getppid()) != launcher) {
    std::fprintf(stderr, "error: this rank's launcher (pid %s) is gone; the rank exits\n", launcher);
    std::exit(1);
  }
}

}  // namespace optcc

#include "harness/parallel/stop_signal.h"

#include <pthread.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

namespace optcc {
namespace {

// Lock-free atomics: read and written from the signal thread and the fallback handler alike.
std::atomic<int> g_first{0};       // the first stop signal recorded (stop_signal_received)
std::atomic<int> g_unforwarded{0};  // the latest not yet taken (take_stop_signal)
std::atomic<bool> g_record{false};  // record (train, launcher) or end the process (default)
std::once_flag g_thread_started;

void record(int signal) {
  int none = 0;
  g_first.compare_exchange_strong(none, signal);
  g_unforwarded.store(signal);
}

extern "C" void record_stop_signal(int signal) { record(signal); }

// The signal's default action, from this thread: the process ends by it (its parent sees the signal).
[[noreturn]] void die_of(int signal) {
  std::signal(signal, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signal);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(signal);
  _exit(128 + signal);  // not reached: SIGTERM and SIGUSR1 end a process by default
}

void signal_thread() {
  pthread_setname_np(pthread_self(), "optcc-signals");
  const sigset_t set = stop_signal_set();
  for (;;) {
    int signal = 0;
    if (sigwait(&set, &signal) != 0) continue;
    if (!g_record.load()) die_of(signal);
    record(signal);
  }
}

}  // namespace

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}

void block_stop_signals() {
  const sigset_t set = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

bool stop_signals_blocked() {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, SIGTERM) == 1 && sigismember(&now, SIGUSR1) == 1;
}

void start_stop_signal_thread() {
  block_stop_signals();  // before the thread exists: it and every later thread inherit the mask
  std::call_once(g_thread_started, [] { std::thread(signal_thread).detach(); });
}

void record_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = record_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  g_record.store(true);
  start_stop_signal_thread();
}

int stop_signal_received() { return g_first.load(); }

int take_stop_signal() { return g_unforwarded.exchange(0); }

void clear_stop_signal() {
  g_first.store(0);
  g_unforwarded.store(0);
}

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

ChildSignals::ChildSignals() {
  posix_spawnattr_init(&attr_);
  sigset_t mask;
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  sigdelset(&mask, SIGTERM);
  sigdelset(&mask, SIGUSR1);
  const sigset_t defaults = stop_signal_set();
  posix_spawnattr_setsigmask(&attr_, &mask);
  posix_spawnattr_setsigdefault(&attr_, &defaults);
  posix_spawnattr_setflags(&attr_, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
}

ChildSignals::~ChildSignals() { posix_spawnattr_destroy(&attr_); }

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

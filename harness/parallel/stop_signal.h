// Stopping a run early on a signal, and ranks that end with their launcher.
//
// A batch system ends a job at its time limit with SIGTERM (Slurm: then SIGKILL after KillWait), and
// can be asked to warn before it (`sbatch --signal=B:USR1@<seconds>`). How optcc takes them:
//
// - Blocked everywhere but one thread. Every optcc process blocks SIGTERM and SIGUSR1 from its start
//   (ensure_process_start, threads.h: the mask is set before the re-exec, so even the threads that
//   libraries start before main(), OpenBLAS's pool, inherit it), and so does every thread created
//   later: LibTorch's OpenMP workers, Gloo's communication threads, the link emulator's. One thread,
//   "optcc-signals" (start_stop_signal_thread), takes them with sigwait(). So no system call of a
//   compute or communication thread is ever interrupted by a stop signal: the step it lands in runs
//   exactly as it would have without it.
// - What the signal thread does with it. By default (every command but `train` and the launcher):
//   what the signal's default would have done, the process ends by it. After record_stop_signals()
//   (`optcc train`) it only records the first signal; the training loop reads it once per step, all
//   ranks agree on it in the step's flag all-reduce (so every rank stops after the SAME step, whichever
//   rank the signal reached), then write a checkpoint, flush the results and exit with
//   kStoppedExitCode. `--resume auto` continues from that checkpoint (for Slurm: docs/configuration.md,
//   "Stopping early"). SIGINT (Ctrl-C) keeps its default: the run ends at once.
// - Children. The local launcher (`--nproc`, distributed.h) records the same way and forwards each
//   SIGTERM/SIGUSR1 to its ranks; the ranks it starts (this binary again) keep the two signals blocked
//   through their exec, and take them in their own signal thread. Any other program optcc starts
//   (optcc-data, and through it npm) gets them unblocked and at their default action (ChildSignals).
// - Each rank the launcher starts asks the kernel for SIGTERM when the launcher dies
//   (PR_SET_PDEATHSIG, die_with_launcher), so a launcher killed with SIGKILL never leaves ranks
//   training on their own.
#pragma once

#include <signal.h>
#include <spawn.h>

namespace optcc {

/// The exit code of a run that stopped on SIGTERM/SIGUSR1 after writing its checkpoint
/// (EX_TEMPFAIL of sysexits.h: "try again later"; the batch scripts requeue on it).
inline constexpr int kStoppedExitCode = 75;

/// The stop signals: SIGTERM and SIGUSR1.
sigset_t stop_signal_set();

/// Blocks SIGTERM and SIGUSR1 in the calling thread (threads it creates afterwards inherit that).
void block_stop_signals();

/// True when the calling thread blocks both stop signals.
bool stop_signals_blocked();

/// Starts the one thread that takes SIGTERM/SIGUSR1 (sigwait), named "optcc-signals"; blocks them in
/// the calling thread first. Idempotent. Until record_stop_signals(), a stop signal ends the process
/// as its default action would.
void start_stop_signal_thread();

/// From now on the signal thread records stop signals instead of ending the process (`optcc train`
/// and the local launcher). Starts the signal thread if needed. Also installs a handler that records
/// them, for a thread that does not block them (one a library started before the mask was set, when
/// the re-exec of ensure_process_start was not possible): never the default's sudden death.
void record_stop_signals();

/// The first SIGTERM/SIGUSR1 recorded since record_stop_signals(), or 0. Async-signal-safe.
int stop_signal_received();

/// Each recorded signal once: the oldest not yet taken, or 0 (the launcher forwards each it takes).
int take_stop_signal();

/// "SIGTERM", "SIGUSR1", ... (for log lines).
const char* signal_name(int signal);

/// Test hook: forget received signals.
void clear_stop_signal();

/// posix_spawn attributes for a program that is not an optcc rank: it starts with SIGTERM and SIGUSR1
/// unblocked and at their default action, so a batch system's signal ends it as usual.
class ChildSignals {
 public:
  ChildSignals();
  ~ChildSignals();
  ChildSignals(const ChildSignals&) = delete;
  ChildSignals& operator=(const ChildSignals&) = delete;
  const posix_spawnattr_t* get() const { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

/// In a rank started by launch_local (OPTCC_LAUNCHER_PID set): SIGTERM to this process when the
/// launcher dies; exits at once (code 1, with a message) when the launcher is already gone.
/// Elsewhere nothing.
void die_with_launcher();

}  // namespace optcc

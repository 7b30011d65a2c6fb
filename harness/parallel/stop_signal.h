// Stopping a run early on a signal, and ranks that end with their launcher.
//
// A batch system ends a job at its time limit with SIGTERM (Slurm: then SIGKILL after KillWait), and
// can be asked to warn before it (`sbatch --signal=B:USR1@<seconds>`). `optcc train` installs
// handlers for SIGTERM and SIGUSR1 that only record the signal (async-signal-safe); the training
// loop reads it once per step, all ranks agree on it in the step's overflow all-reduce (so every
// rank stops after the SAME step, whichever rank the signal reached), then write a checkpoint, flush
// the results and exit with kStoppedExitCode. `--resume auto` (the default in a Slurm job)
// continues from that checkpoint. SIGINT (Ctrl-C) keeps its default: the run ends at once.
//
// The local launcher (`--nproc`, distributed.h) forwards SIGTERM and SIGUSR1 to its ranks and waits
// for them; each rank it starts asks the kernel for SIGTERM when the launcher dies (PR_SET_PDEATHSIG,
// die_with_launcher), so a launcher killed with SIGKILL never leaves ranks training on their own.
#pragma once

namespace optcc {

/// The exit code of a run that stopped on SIGTERM/SIGUSR1 after writing its checkpoint
/// (EX_TEMPFAIL of sysexits.h: "try again later"; the batch scripts requeue on it).
inline constexpr int kStoppedExitCode = 75;

/// Installs the recording handlers for SIGTERM and SIGUSR1 (idempotent; this process only).
void install_stop_signal_handlers();

/// The first SIGTERM/SIGUSR1 received since install_stop_signal_handlers(), or 0.
int stop_signal_received();

/// "SIGTERM", "SIGUSR1", ... (for log lines).
const char* signal_name(int signal);

/// Test hook: forget a received signal.
void clear_stop_signal();

/// In a rank started by launch_local (OPTCC_LAUNCHER_PID set): SIGTERM to this process when the
/// launcher dies; exits at once (code 1, with a message) when the launcher is already gone.
/// Elsewhere nothing.
void die_with_launcher();

}  // namespace optcc

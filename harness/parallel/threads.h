// CPU thread control for LibTorch (OpenMP intra-op pool) and the BLAS behind it (OpenBLAS).
//
// Why both: on Debian, LibTorch calls OpenBLAS, which keeps its own pthread pool sized to all cores,
// while LibTorch's OpenMP pool runs the element-wise work. By default OpenMP workers spin-wait
// between regions and steal the cores OpenBLAS's threads need: measured on a 2-core machine, the
// `mini` training step took 1370 ms with both pools at 2 threads and spinning, 590 ms with
// OpenMP waiting passively (and 915 ms with BLAS at 1 thread).
#pragma once

#include <cstdint>

namespace optcc {

/// Sets LibTorch's intra-op threads and, when OpenBLAS is loaded, OpenBLAS's threads to `n`
/// (n >= 1). Call once per process before compute.
void set_cpu_threads(int64_t n);

/// What must hold before any library starts a thread, which some do before main(): OMP_WAIT_POLICY
/// (read when libgomp loads) and the blocked stop signals (stop_signal.h: OpenBLAS's pool, started
/// when it loads, must not take a SIGTERM). If OMP_WAIT_POLICY is unset this sets it to PASSIVE;
/// if SIGTERM/SIGUSR1 are not blocked it blocks them; then it re-executes the current binary with the
/// same arguments (once; it never returns then). Call first thing in main(). Users may set
/// OMP_WAIT_POLICY themselves to opt out of the passive workers.
void ensure_process_start(char** argv);

}  // namespace optcc

#!/usr/bin/env python3
"""The Fig. 14 reference point on the GPU machine: the compressed-backpropagation low-rank compressor as a
PyTorch-Python program writes it, timed on the same device as optcc's bench_compression.

What one compress call does (per slice M of shape n x m, rank r; all fp32):
  M += E                      error feedback (E: what the previous call left out)
  Q = orth(Q)                 the warm-started right factor, made orthonormal
  P = orth(M Q)               left factor
  Q = M^T P                   new right factor (sent with P)
  E = M - P Q^T               what P Q^T leaves out, kept for the next call
and decompress is P Q^T. orth is modified Gram-Schmidt, one column at a time, each column divided by
(its norm + 1e-8). Times are medians of 7 calls after one untimed call, synchronised with the device;
GB/s counts the uncompressed slice, n * m * 4 bytes, per call (bench_compression's fig14 counters use
the same bytes).

Usage: reference_lowrank.py [DEVICE] [THREADS]   DEVICE: cuda (default), cuda:N or cpu
Prints one line per (slice, rank) and, with --json FILE, writes them as a list of objects.
"""
import argparse
import json
import statistics
import sys
import time

try:
    import torch
except ImportError:
    sys.exit("reference_lowrank.py: needs PyTorch (python3 -c 'import torch')")

SLICES = [(1024, 1920), (1024, 3072), (2048, 12288)]  # bench_compression's fig14 slices (rows x cols)
RANKS = [8, 16, 24, 32, 40]  # bench_compression's fig14 ranks
REPEATS = 7


def orthonormalize(a):
    """Modified Gram-Schmidt on the columns of a, in place."""
    cols = a.shape[1]
    for i in range(cols):
        col = a[:, i:i + 1]
        col.div_(col.norm() + 1e-8)
        if i + 1 < cols:
            later = a[:, i + 1:]
            later.sub_(col @ (col.t() @ later))
    return a


class LowRankWithFeedback:
    def __init__(self, rows, cols, rank, device):
        self.q = orthonormalize(torch.randn(cols, rank, device=device))
        self.error = torch.zeros(rows, cols, device=device)

    def compress(self, m):
        m.add_(self.error)
        orthonormalize(self.q)
        p = orthonormalize(m @ self.q)
        self.q = m.t() @ p
        self.error = m - p @ self.q.t()
        return p, self.q


def median_seconds(fn, device):
    def wait():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    wait()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("device", nargs="?", default="cuda")
    ap.add_argument("threads", nargs="?", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("reference_lowrank.py: device cuda asked for, but torch sees no GPU")
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {args.threads} thread(s)"
    print(f"# reference low-rank compressor, PyTorch {torch.__version__}, {name}; median of {REPEATS}")
    rows = []
    for (n, m) in SLICES:
        grad = torch.randn(n, m, device=device)
        for r in RANKS:
            comp = LowRankWithFeedback(n, m, r, device)
            p, q = comp.compress(grad.clone())
            t_enc = median_seconds(lambda: comp.compress(grad.clone()), device)
            t_dec = median_seconds(lambda: p @ q.t(), device)
            gb = n * m * 4 / 1e9
            row = {"slice": f"{n}x{m}", "rank": r, "compress_ms": t_enc * 1e3, "decompress_ms": t_dec * 1e3,
                   "compress_GBps": gb / t_enc, "decompress_GBps": gb / t_dec, "device": name,
                   "torch": torch.__version__}
            rows.append(row)
            print(f"{n}x{m} r={r} compress_ms={row['compress_ms']:.3f} decompress_ms={row['decompress_ms']:.3f} "
                  f"compress_GBps={row['compress_GBps']:.2f} decompress_GBps={row['decompress_GBps']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

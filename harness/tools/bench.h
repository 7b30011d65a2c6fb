// `optcc bench step`: times the training step of a config on this machine and relates it to the
// machine's fp32 GEMM speed measured in the same run: every GEMM library of this build
// (kernels/gemm.h: ATen on LibTorch's BLAS, oneDNN) at the model's own forward GEMM shapes
// (qkv, proj, fc1, fc2, output layer on one micro-batch), the best of them as the reference.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/config/config.h"

namespace optcc {

/// One ATen operation's share of a profiled step (bench_step's profile_top): its name, how often it
/// ran, its self time (its own span less the spans of the operations it called) and its total span,
/// in ms, on the profile's clock (StepBenchResult::profile_clock).
struct ProfiledOp {
  std::string name;
  int64_t calls = 0;
  double self_ms = 0;
  double total_ms = 0;
};

struct StepBenchResult {
  double step_seconds = 0;       // median over timed steps, s
  double tokens_per_second = 0;  // global_batch_size * seq_len / step_seconds
  double model_gflops = 0;       // achieved: gpt_train_flops / step_seconds / 1e9
  double gemm_gflops = 0;        // the best library's GEMM rate at the model's shapes in the compute dtype, GFLOP/s
  std::string gemm_library;      // ... and its name
  std::vector<std::pair<std::string, double>> gemm;  // every library: name, GFLOP/s
  std::string linear_library;    // what the model's linear layers ran on (kernels/gemm.h compute_gemm_library())
  std::string thin_gemm;         // the compressors' thin GEMMs (kernels/thin_gemm.h thin_gemm_isa()), for the record
  std::string allocator;         // the heap allocator (harness/parallel/allocator.h cpu_allocator())
  double ratio = 0;              // model_gflops / gemm_gflops; near 1 = GEMM-bound at full speed
  int64_t threads = 0;
  std::string device;            // where the step ran: "cpu" or "cuda:0" (parallel.device)
  std::string precision;         // train.precision the step computed in (fp32, bf16)
  std::string attention;         // the attention kernel the step used: explicit | fused (models/gpt.h)
  std::string cpu_bf16;          // the CPU's bf16 instructions (kernels/gemm.h cpu_bf16_instructions())
  std::vector<ProfiledOp> profile;  // profile_top > 0: the top operations by self time, largest first
  std::string profile_clock;        // "CPU" (the host's time per operation) or "CUDA" (the GPU's)
  double profile_step_ms = 0;       // the profiled step's wall time (profiling slows it)
};

/// Runs `warmup` untimed and `steps` timed training steps of `cfg` on random tokens (no data files
/// needed; model.vocab_size 0 falls back to the dataset's, then to data.vocab_size). Sets the
/// intra-op thread count to `threads` (0 = cfg's). Single process; all ranks' work in one, on
/// parallel.device (device.h's rules for one process; GEMM rates are measured on the same device,
/// ATen only on a GPU).
/// profile_top > 0: after the timed steps, one more step under LibTorch's profiler (the legacy
/// one: every ATen operation's span on the host clock, and on a GPU each operation's span on the
/// GPU's clock from CUDA events); the profile_top operations with the largest self time go to
/// `profile`, with self time on the GPU's clock on CUDA and the host's elsewhere.
StepBenchResult bench_step(Config cfg, int64_t steps, int64_t warmup, int64_t threads, int64_t profile_top = 0);

}  // namespace optcc

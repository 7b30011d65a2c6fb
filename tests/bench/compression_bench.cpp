// bench_compression: single-thread CPU cost of every optcc compressor (Google Benchmark).
//
// Device: OPTCC_BENCH_DEVICE=cuda puts every benchmark's tensors on cuda:0 (same values: drawn on
// the CPU from the same seeds, then copied), waits for the GPU (torch::cuda::synchronize) before
// each timed iteration ends and reports wall time (UseRealTime); the memory bandwidth and
// sgemm_1024 context lines are then the GPU's, timed the same way. On CUDA only the ATen path of
// the low-rank products applies (thin and mm_f32_out are CPU kernels that hand CUDA tensors to
// ATen), so gemm/ registers `aten` and `fill` only; int8, int4 and hadamard run their ATen form
// on the device (codecs.h), while topk and the element-wise reducers run their CPU loops through
// host copies (as in a CUDA run). Without a
// usable GPU every benchmark is skipped with the reason and the program exits 1. Unset (or cpu):
// the CPU benchmarks below, unchanged.
//
// Setup: one thread everywhere (LibTorch intra-op and OpenMP, OpenBLAS's own pool, oneDNN),
// fp32, inputs from a fixed seed (randn). Times are the main thread's CPU time (Google
// Benchmark's default; every computation runs on that thread), so a busy machine inflates them
// less than wall time; on an idle machine they are equal. main() warns when other threads burn
// CPU.
//
// Families (names are `kind/compressor/op/set/shape[/param][/r<rank>]`, for --benchmark_filter):
//   membw/copy_256MiB                 copy_ of a 256 MiB fp32 tensor (read + write: 512 MiB per
//                                     iteration), reported for the record.
//   codec/<name>/{encode,decode}/fig14/<rows>x<cols>[/r<r>]
//                                     every point-to-point codec of act_codec_names() on the
//                                     Fig. 14 slice shapes (docs/design.md §8.3: 1024×1920, 1024×3072,
//                                     2048×12288 = tokens × hidden per TP rank). lowrank at
//                                     r = 8, 16, 24, 32, 40 (token_major view, hidden = cols);
//                                     the others at their defaults (int8/int4: hidden = cols;
//                                     topk: fraction 0.01). One warm-up encode first (lowrank:
//                                     warm-start Q). decode gets a payload of that input, after
//                                     one warm-up decode (the reused output buffer allocated).
//   codec/<name>/{encode,decode}/<preset>/<param>/<rows>x<cols>[/r16]
//                                     the same codecs on the weight shapes of the tiny, mini and
//                                     small presets (models/presets.cpp), hidden = cols: qkv
//                                     3h×h, proj h×h, fc1 4h×h, fc2 h×4h, embedding V×h with V =
//                                     8064 (the 8k tokenizer padded to a multiple of 128).
//   kernel/hadamard/{encode,decode}/fig14/<rows>x<cols>/{blocked,per_tile}
//                                     the hadamard codec's host kernel (tile 64, 4 bits) as the codec
//                                     runs it, 16 tiles per transposed block, and as the per-tile loops
//                                     it replaced (same bytes out): the baseline, in the same run.
//   reducer/<name>/reduce/fig14/<rows>x<cols>[/r<r>]
//   reducer/<name>/reduce/<preset>/layer
//   reducer/<name>/reduce/<preset>/embedding/<V>x<h>
//                                     every DP GradReducer of the registry filled by
//                                     register_builtin_grad_reducers() (names() at start-up, so
//                                     new reducers are picked up), on a Communicator of ONE rank
//                                     (compressing reducers still compress; none/fp16/bf16
//                                     return at once). powersgd: rank r (8..40 on Fig. 14, 16
//                                     on the presets), other options default; every other
//                                     reducer: its defaults. fig14: one matrix; layer: one
//                                     transformer layer's 12 gradients in parameter order
//                                     (ln1 w,b; qkv W [3h,h], b; proj W [h,h], b; ln2 w,b; fc1 W
//                                     [4h,h], b; fc2 W [h,4h], b); embedding: V×h alone. One
//                                     warm-up call (EF and Q allocated); each timed call gets a
//                                     fresh copy of the same gradients (copy not timed; skipped
//                                     when the warm-up left them unchanged: identity reducers).
//
//   codec/lowrank/encode/fig14/<rows>x<cols>/r<r>/batched
//                                     the lowrank encode through the batched kernels (lowrank_batch.h,
//                                     B = 1: what CUDA messages take) beside the per-matrix CPU path
//                                     (the name without /batched), CPU only.
//   reducer/powersgd/reduce/fig14/<rows>x<cols>/r<r>/B4/{per_matrix,batched}
//                                     four same-shape gradients (a stage's layers) per call, through
//                                     the per-matrix CPU path and the batched path (powersgd.h), CPU only.
//   opcount/lowrank/encode/96x128/r<r>/B<b>/{batched,per_matrix_tensor_ops}
//                                     r = 4, 16, 64 and B = 1, 8, 32: one encode of B matrices, batched
//                                     or per matrix with the tensor-operation MGS (the non-CPU path
//                                     before batching), with counters aten_kernels and aten_calls.
//
// Counters:
//   bytes_per_second  input bytes (message or gradients, fp32) per second: "GB/s of slice".
//   ratio             codecs: 4·numel / payload_bytes(numel); reducers: raw_bytes / payload_bytes
//                     of the last call (0 when nothing is sent: none/fp16/bf16 on one rank).
//   touch_MB          the bytes the compressor must move per call (model below), in MB.
//   bw_fraction       (touch bytes / time) / B, with B this machine's memory bandwidth measured
//                     in main() before any benchmark (median of 9 copies of 256 MiB, read +
//                     write bytes, same CPU clock): the fraction of the bandwidth bound reached.
//                     0 where the model is 0 bytes. Shapes that fit in the 32 MiB L3 can exceed 1
//                     (the bound is DRAM bandwidth).
//   aten_kernels      lowrank encodes and opcount/: the computing ATen operations one encode
//                     issues (tests/support/op_counter.h), the CPU-visible proxy for GPU launches;
//                     aten_calls (opcount/) every dispatcher call.
//   GFLOPs            lowrank and powersgd: GEMM flop rate (encode 4·N·r, decode 2·N·r, PowerSGD
//                     6·N·r per compressed matrix). A GEMM pass over M does 2r flop per 4-byte
//                     element: at r = 16, 8 flop/B, above this machine's balance (context:
//                     sgemm_1024_GFLOPs / memory_bandwidth_GBps, about 5). So lowrank encode (2
//                     such passes, 8 bytes of traffic per element) is compute bound: its
//                     bw_fraction cannot exceed balance / 8 even at the GEMM's peak; so is
//                     decode (32 flop per 4 bytes written). PowerSGD (96 flop per 28 bytes)
//                     is below the balance, but its GEMM passes and element-wise passes run one
//                     after the other, so its time is about the sum of both.
//
// "Bytes a compressor must touch": a lower bound on DRAM traffic for ANY implementation of its
// algorithm, per element of the fp32 input (N elements; payload factors of size r·(rows+cols)
// are small and ignored). A pass that must finish before the next one can start (a global
// reduction, a GEMM whose result the next step needs) forces another read.
//   codecs               encode                       decode
//     none               0 (the part aliases x)       0 (returns the part)
//     fp16, bf16         4 read + 2 write = 6         2 + 4 = 6
//     lowrank            8: M read for P = M·Q and    4: M̂ = P̂·Qᵀ written
//                        again for Q = Mᵀ·P̂ (after
//                        orthogonalising P)
//     int8               4 + 1 = 5 (per-row min/max   1 + 4 = 5
//                        and quantisation: a row is
//                        short enough to stay cached)
//     int4               4 + 0.5 = 4.5                0.5 + 4 = 4.5
//     topk (fraction f)  4 + 12f (values + int64)     12f + 4
//     other codecs       4 (read x)                   4 (write the result)
//   reducers (one rank; per element of a compressed fp32 gradient, default options)
//     powersgd (EF)  28 = 7 passes × 4: M = g + EF (read g, read EF, write M into EF), P = M·Q
//                    (read M), Q = Mᵀ·P̂ after orthogonalising P (read M), then out = P̂·Qᵀ and
//                    EF = M − out in one pass (read M, write g, write EF). Without EF: 12.
//     topk (EF)      24: c = g + EF (3), the k-th largest |c| (needs all of c) then out and
//                    EF = c − out (read c, write g, write EF: 3).
//     randomk (EF)   16: indices come from the seed, so one pass: read g, EF; write g, EF.
//     qsgd (no EF)   8: per bucket (cached): read g, write g.
//     signsgd (EF)   24: as topk (the per-tensor scale mean|c| needs all of c first).
//     none, fp16, bf16  0: identity on one rank.
//     other reducers 8: read and write the gradient once.
//   Tensors a compressing reducer sends raw (biases, norms): 8 (read, write after ÷ dp).
//
// Run (from the repository root, after building the bench_compression target):
//   mkdir -p results/bench
//   ./build/tests/bench/bench_compression --benchmark_out=results/bench/compression.json --benchmark_out_format=json
// Each benchmark runs for --benchmark_min_time seconds (default here 0.1 unless given; the
// whole set takes about 2 minutes on 2 cores). Subsets: --benchmark_filter='fig14' (paper
// shapes), --benchmark_filter='membw|fig14/[0-9x]+(/r16)?$' (r = 16 and the defaults on Fig. 14),
// --benchmark_filter='reducer/' (DP reducers). The JSON goes wherever --benchmark_out points;
// by convention results/bench/compression.json; its context holds memory_bandwidth_GBps.

#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compression/act_codec.h"
#include "compression/codecs.h"
#include "compression/grad_reducer.h"
#include "compression/lowrank_batch.h"
#include "compression/orthogonalize.h"
#include "compression/powersgd.h"
#include "compression/raw_loops.h"
#include "kernels/thin_gemm.h"
#include "kernels/gemm.h"
#include "compression/registry.h"
#include "harness/parallel/communicator.h"
#include "models/presets.h"
#include "tests/support/op_counter.h"

namespace {

double g_bandwidth_bytes_per_s = 0.0;  // set in main() before any benchmark

// OPTCC_BENCH_DEVICE (file header), set in main() before anything else.
bool g_cuda = false;                     // OPTCC_BENCH_DEVICE=cuda
torch::Device g_device = torch::kCPU;    // where the benchmarks' tensors live
std::string g_device_error;              // non-empty: every benchmark is skipped with it

/// GPU work is asynchronous: wait for it before a timed iteration ends. Nothing on the CPU.
void device_sync() {
  if (g_cuda) torch::cuda::synchronize();
}

/// The same tensor on the benchmark device (`t` itself on the CPU).
torch::Tensor on_device(const torch::Tensor& t) { return g_cuda ? t.to(g_device) : t; }

constexpr int64_t kPaddedVocab = 8064;  // 8000-token tokenizer padded to a multiple of 128
const std::vector<std::pair<int64_t, int64_t>> kFig14 = {{1024, 1920}, {1024, 3072}, {2048, 12288}};
const std::vector<int64_t> kFig14Ranks = {8, 16, 24, 32, 40};
const std::vector<std::string> kPresets = {"tiny", "mini", "small"};

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

/// randn [rows, cols] fp32 from a fixed seed, generated once per shape (read-only: callers copy).
const torch::Tensor& random_matrix(int64_t rows, int64_t cols) {
  static std::map<std::pair<int64_t, int64_t>, torch::Tensor> cache;
  auto& t = cache[{rows, cols}];
  if (!t.defined()) {
    auto gen = at::detail::createCPUGenerator(1234);
    t = on_device(torch::randn({rows, cols}, gen, torch::kFloat));
  }
  return t;
}

std::string shape_name(int64_t rows, int64_t cols) { return fmt::format("{}x{}", rows, cols); }

void set_counters(benchmark::State& state, double input_bytes, double touch_bytes, double ratio,
                  double flops = 0.0) {
  const auto iters = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(input_bytes * iters));
  state.counters["ratio"] = ratio;
  if (flops > 0) state.counters["GFLOPs"] = benchmark::Counter(flops * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["touch_MB"] = touch_bytes / 1e6;
  // kIsRate divides by the measured time: (touch bytes per second) / bandwidth.
  state.counters["bw_fraction"] = benchmark::Counter(
      g_bandwidth_bytes_per_s > 0 ? touch_bytes * iters / g_bandwidth_bytes_per_s : 0.0,
      benchmark::Counter::kIsRate);
}

// --- memory bandwidth ---------------------------------------------------------------------------

constexpr int64_t kCopyFloats = 256LL * 1024 * 1024 / 4;

/// Seconds for main()'s context measurements: the main thread's CPU time, or wall time on CUDA
/// (the CPU thread only waits there).
double timer_seconds() {
  if (g_cuda) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  return thread_cpu_seconds();
}

/// Median over `reps` copies of 256 MiB of (read + write bytes) / CPU seconds (CUDA: wall seconds).
double measure_bandwidth(int reps) {
  torch::NoGradGuard no_grad;
  auto src = on_device(torch::rand({kCopyFloats}, torch::kFloat));
  auto dst = torch::empty({kCopyFloats}, torch::dtype(torch::kFloat).device(g_device));
  dst.copy_(src);  // fault pages in
  device_sync();
  std::vector<double> rates;
  for (int i = 0; i < reps; ++i) {
    const double t0 = timer_seconds();
    dst.copy_(src);
    device_sync();
    rates.push_back(2.0 * kCopyFloats * 4 / (timer_seconds() - t0));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

void bm_copy(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  auto src = on_device(torch::rand({kCopyFloats}, torch::kFloat));
  auto dst = torch::empty({kCopyFloats}, torch::dtype(torch::kFloat).device(g_device));
  dst.copy_(src);
  device_sync();
  for (auto _ : state) {
    dst.copy_(src);
    device_sync();
    benchmark::DoNotOptimize(dst.data_ptr());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * kCopyFloats * 4);
  state.counters["bw_fraction"] = benchmark::Counter(
      g_bandwidth_bytes_per_s > 0 ? 2.0 * kCopyFloats * 4 * static_cast<double>(state.iterations()) /
                                        g_bandwidth_bytes_per_s
                                  : 0.0,
      benchmark::Counter::kIsRate);
}

// --- point-to-point codecs ----------------------------------------------------------------------

struct CodecCase {
  std::string codec;
  int64_t rows = 0, cols = 0;
  int64_t rank = 0;      // lowrank only
  bool batched = false;  // lowrank only: the batched (device) path on CPU tensors (lowrank_batch.h)
};

YAML::Node codec_options(const CodecCase& c) {
  YAML::Node o;
  if (c.codec == "lowrank") {
    o["rank"] = c.rank;
    o["hidden"] = c.cols;
  } else if (c.codec == "int8" || c.codec == "int4" || c.codec == "hadamard") {
    o["hidden"] = c.cols;  // hadamard: tiles of its default 64
  } else if (c.codec == "topk") {
    o["fraction"] = 0.01;
  }
  return o;  // null for the option-less codecs and for codecs this file does not know
}

/// Bytes per element of the fp32 message an encode (decode) must move (file header).
double codec_touch_per_element(const std::string& codec, bool encode) {
  if (codec == "none") return 0.0;
  if (codec == "fp16" || codec == "bf16") return 6.0;
  if (codec == "lowrank") return encode ? 8.0 : 4.0;
  if (codec == "int8") return 5.0;
  if (codec == "int4") return 4.5;
  if (codec == "hadamard") return 4.5 + 8.0 / 64;  // fp32 in, 4-bit codes and two fp32 per 64-element tile out
  if (codec == "topk") return 4.0 + 12.0 * 0.01;
  return 4.0;
}

void bm_codec(benchmark::State& state, const CodecCase& c, bool encode) {
  torch::NoGradGuard no_grad;
  std::unique_ptr<optcc::ActCodec> codec;
  try {
    codec = optcc::make_act_codec(c.codec, codec_options(c));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  if (c.batched) dynamic_cast<optcc::LowRankCodec&>(*codec).use_batched_on_cpu(true);
  const int64_t numel = c.rows * c.cols;
  const auto x = random_matrix(c.rows, c.cols).reshape({-1});
  optcc::Payload p = codec->encode(x);  // warm-up (lowrank: draws Q, later encodes warm-start)
  device_sync();
  if (c.codec == "lowrank" && encode) {  // the ATen operations of one encode (op_counter.h)
    const auto n = optcc::testing::count_aten_ops([&] { codec->encode(x); });
    state.counters["aten_kernels"] = static_cast<double>(n.kernels);
  }
  if (encode) {
    for (auto _ : state) {
      auto q = codec->encode(x);
      device_sync();
      benchmark::DoNotOptimize(q.parts[0].data_ptr());
    }
  } else {
    p = codec->encode(x);
    for (auto& part : p.parts) part = part.clone();  // detach from x and the codec's state
    // Warm-up decode: the codec's reused output buffer is allocated (and its pages faulted in)
    // once, as in a run, where a link decodes thousands of messages into it.
    benchmark::DoNotOptimize(codec->decode(p, numel).data_ptr());
    device_sync();
    for (auto _ : state) {
      auto y = codec->decode(p, numel);
      device_sync();
      benchmark::DoNotOptimize(y.data_ptr());
    }
  }
  const double gemm_flops =  // lowrank: P = M·Q and Q = Mᵀ·P̂ (encode), P̂·Qᵀ (decode)
      c.codec == "lowrank" ? (encode ? 4.0 : 2.0) * static_cast<double>(numel * codec->wire_shapes(numel)[0][1]) : 0.0;
  set_counters(state, 4.0 * numel, codec_touch_per_element(c.codec, encode) * numel,
               4.0 * numel / static_cast<double>(codec->payload_bytes(numel)), gemm_flops);
}

// --- DP gradient reducers -----------------------------------------------------------------------

struct ReducerCase {
  std::string reducer;
  std::vector<std::vector<int64_t>> shapes;
  int64_t rank = 16;     // powersgd only
  bool batched = false;  // powersgd only: the batched (device) path on CPU tensors (powersgd.h)
};

YAML::Node reducer_options(const ReducerCase& c) {
  YAML::Node o;
  if (c.reducer == "powersgd") o["rank"] = c.rank;
  return o;  // every other reducer: its defaults
}

/// Bytes per element of a compressed fp32 gradient one call must move (file header).
double reducer_touch_per_element(const std::string& reducer) {
  if (reducer == "none" || reducer == "fp16" || reducer == "bf16") return 0.0;
  if (reducer == "powersgd") return 28.0;
  if (reducer == "topk" || reducer == "signsgd") return 24.0;
  if (reducer == "randomk") return 16.0;
  if (reducer == "qsgd") return 8.0;
  return 8.0;
}

optcc::Registry<optcc::GradReducer>& reducer_registry() {
  static optcc::Registry<optcc::GradReducer> registry = [] {
    optcc::Registry<optcc::GradReducer> r;
    optcc::register_builtin_grad_reducers(r);
    return r;
  }();
  return registry;
}

void bm_reducer(benchmark::State& state, const ReducerCase& c) {
  torch::NoGradGuard no_grad;
  std::unique_ptr<optcc::GradReducer> reducer;
  try {
    reducer = reducer_registry().create(c.reducer, reducer_options(c));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  if (c.batched) dynamic_cast<optcc::PowerSgdReducer&>(*reducer).use_batched_on_cpu(true);
  optcc::Communicator comm(optcc::ProcessGroupPtr(), {0}, 0, "bench", optcc::Link::kIntraNode, nullptr,
                           std::chrono::seconds(10));
  std::vector<torch::Tensor> fresh, grads;  // fresh: the gradients every call starts from
  for (const auto& s : c.shapes) {
    const int64_t rows = s[0], cols = s.size() > 1 ? s[1] : 1;
    fresh.push_back(random_matrix(rows, cols).view(s));
    grads.push_back(fresh.back().clone());
  }
  reducer->reduce(grads, comm, 0);  // warm-up: EF, Q, generators
  device_sync();
  double touch = 0.0, flops = 0.0;
  const double per_element = reducer_touch_per_element(c.reducer);
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto numel = static_cast<double>(grads[i].numel());
    const bool compressed = i < reducer->records().size() && reducer->records()[i].compressed;
    touch += per_element == 0.0 ? 0.0 : (compressed ? per_element : 8.0) * numel;
    // PowerSGD: P = M·Q, Q = Mᵀ·P̂, out = P̂·Qᵀ
    if (c.reducer == "powersgd" && compressed) flops += 6.0 * numel * static_cast<double>(reducer->records()[i].rank);
  }
  // Identity reducers on one rank leave the gradients as they are: no refresh needed (and with a
  // timed part of ~0 s, an untimed copy per iteration would make the benchmark run for ever).
  bool modifies = false;
  for (size_t i = 0; i < grads.size(); ++i) modifies = modifies || !torch::equal(grads[i], fresh[i]);
  int64_t step = 1;
  for (auto _ : state) {
    if (modifies) {
      state.PauseTiming();
      for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(fresh[i]);  // a fresh gradient (not timed)
      device_sync();
      state.ResumeTiming();
    }
    reducer->reduce(grads, comm, step++);
    device_sync();
    benchmark::DoNotOptimize(grads[0].data_ptr());
  }
  const double raw = static_cast<double>(reducer->raw_bytes());
  const double payload = static_cast<double>(reducer->payload_bytes());
  set_counters(state, raw, touch, payload > 0 ? raw / payload : 0.0, flops);
}

// --- ATen operations of one low-rank encode -------------------------------------------------------

/// One encode of B matrices M [96, 128] at rank r (Q's upkeep, P = MQ, P̂, Q = MᵀP̂): `batched`, the
/// batched kernels (lowrank_batch.h: what CUDA tensors take); else per matrix with the tensor-
/// operation MGS (orthogonalize_mgs_tensor_ops_: what CUDA tensors took before). Times the encode
/// and reports the ATen operations it issues (op_counter.h): aten_kernels (computing ops, the
/// proxy for GPU launches) and aten_calls (every dispatcher call).
void bm_encode_op_count(benchmark::State& state, int64_t r, int64_t b, bool batched) {
  torch::NoGradGuard no_grad;
  const auto m = torch::randn({b, 96, 128});
  auto q = torch::randn({b, 128, r});
  auto p = torch::empty({b, 96, r});
  optcc::CounterNormal gen(1);
  const auto encode = [&] {
    if (batched) {
      optcc::prepare_q_batched_(q, gen);
      optcc::lowrank_encode_p(m, q, p);
      optcc::lowrank_encode_q(m, p, q);
      return;
    }
    for (int64_t i = 0; i < b; ++i) {
      auto qi = q[i], pi = p[i];
      optcc::orthogonalize_mgs_tensor_ops_(qi);
      torch::mm_out(pi, m[i], qi);
      optcc::orthogonalize_mgs_tensor_ops_(pi);
      torch::mm_out(qi, m[i].t(), pi);
    }
  };
  const auto n = optcc::testing::count_aten_ops(encode);
  for (auto _ : state) {
    encode();
    benchmark::DoNotOptimize(q.data_ptr());
  }
  state.counters["aten_kernels"] = static_cast<double>(n.kernels);
  state.counters["aten_calls"] = static_cast<double>(n.all);
}

// --- registration -------------------------------------------------------------------------------

/// The weight shapes of one transformer layer and the word embedding, [rows, cols] as stored.
struct PresetShapes {
  std::vector<std::pair<std::string, std::vector<int64_t>>> matrices;  // name, [rows, cols]
  std::vector<std::vector<int64_t>> layer;                             // the 12 gradients of a layer
};

PresetShapes preset_shapes(const std::string& preset) {
  const auto* p = optcc::find_model_preset(preset);
  TORCH_CHECK(p != nullptr, "bench_compression: unknown preset ", preset);
  const int64_t h = p->hidden_size;
  PresetShapes s;
  s.matrices = {{"qkv", {3 * h, h}},
                {"proj", {h, h}},
                {"fc1", {4 * h, h}},
                {"fc2", {h, 4 * h}},
                {"embedding", {kPaddedVocab, h}}};
  s.layer = {{h}, {h}, {3 * h, h}, {3 * h}, {h, h}, {h}, {h}, {h}, {4 * h, h}, {4 * h}, {h, 4 * h}, {h}};
  return s;
}

// --- the hadamard codec's kernel, blocked against per tile -----------------------------------------

/// kernels::hadamard_encode_tiles / hadamard_decode_tiles (16 tiles per transposed block, what the codec
/// runs) against the per-tile loops they replaced (hadamard_transform, min_max, quant_grid, quantize,
/// pack_bits per tile; unpack_bits, dequantize, hadamard_transform back), which give the same bytes: the
/// baseline of the same run. Raw pointers, no tensor overhead; tile 64, 4 bits; bytes: the fp32 slice.
void bm_hadamard_kernel(benchmark::State& state, int64_t rows, int64_t cols, bool encode, bool blocked) {
  constexpr int64_t tile = 64;
  constexpr int bits = 4;
  const int64_t n = rows * cols, tiles = n / tile, row_bytes = tile * bits / 8;
  auto gen = at::detail::createCPUGenerator(97);
  const auto x = torch::randn({n}, gen, torch::kFloat);
  std::vector<uint8_t> codes(tiles * row_bytes), q(tile);
  std::vector<float> meta(2 * tiles), y(n), scratch(tile);
  const float levels = (1 << bits) - 1;
  auto per_tile_encode = [&] {
    for (int64_t i = 0; i < tiles; ++i) {
      std::copy(x.data_ptr<float>() + i * tile, x.data_ptr<float>() + (i + 1) * tile, scratch.begin());
      optcc::kernels::hadamard_transform(scratch.data(), tile);
      float lo, hi;
      optcc::kernels::min_max(scratch.data(), tile, &lo, &hi);
      const auto g = optcc::kernels::quant_grid(lo, hi, levels);
      meta[2 * i] = g.scale, meta[2 * i + 1] = g.offset;
      optcc::kernels::quantize(scratch.data(), tile, g.offset, 1.0f / g.safe, levels, q.data());
      optcc::kernels::pack_bits(q.data(), tile, bits, codes.data() + i * row_bytes);
    }
  };
  optcc::kernels::hadamard_encode_tiles(x.data_ptr<float>(), tiles, tile, bits, codes.data(), meta.data());
  for (auto _ : state) {
    if (encode && blocked) {
      optcc::kernels::hadamard_encode_tiles(x.data_ptr<float>(), tiles, tile, bits, codes.data(), meta.data());
    } else if (encode) {
      per_tile_encode();
    } else if (blocked) {
      optcc::kernels::hadamard_decode_tiles(codes.data(), meta.data(), tiles, tile, bits, y.data());
    } else {
      for (int64_t i = 0; i < tiles; ++i) {
        optcc::kernels::unpack_bits(codes.data() + i * row_bytes, tile, bits, q.data());
        optcc::kernels::dequantize(q.data(), tile, meta[2 * i], meta[2 * i + 1], y.data() + i * tile);
        optcc::kernels::hadamard_transform(y.data() + i * tile, tile);
      }
    }
    benchmark::DoNotOptimize(codes.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 4);
}

// --- the low-rank products, kernel against library -------------------------------------------------

/// One of the three products of a low-rank compressor on a Fig. 14 slice M [rows, cols] at rank r
/// (kernels/thin_gemm.h): "project" P = M·Q, "back-project" Q = Mᵀ·P̂, "expand" M̂ = P̂·Qᵀ into a
/// reused output, through `how`: "thin" (thin_mm_f32_out, what the codecs run), "mm_f32_out" (the
/// general GEMM: oneDNN when the build has it) or "aten" (at::mm, LibTorch's BLAS); and, for
/// expand, "fill": fill_ of the output with a constant, the same bytes written with no arithmetic
/// (what normal stores reach). Bytes: M read (project, back-project) or written (expand), 4 per
/// element; 2·r flop per element.
void bm_lowrank_product(benchmark::State& state, int64_t rows, int64_t cols, int64_t r, const std::string& product,
                        const std::string& how) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(99);
  const auto p = on_device(torch::randn({rows, r}, gen, torch::kFloat));
  const auto q = on_device(torch::randn({cols, r}, gen, torch::kFloat));
  const bool expand = product == "expand";
  const auto on = torch::TensorOptions().device(g_device);
  auto m = expand ? torch::empty({rows, cols}, on) : on_device(torch::randn({rows, cols}, gen, torch::kFloat));
  m.fill_(0.0f);  // fault the pages in
  if (!expand) {
    if (g_cuda) {
      m.copy_(torch::randn({rows, cols}, gen, torch::kFloat));  // the CPU generator draws, as below
    } else {
      m.normal_(0.0, 1.0, gen);
    }
  }
  auto out = product == "project"        ? torch::empty({rows, r}, on)
             : product == "back-project" ? torch::empty({cols, r}, on)
                                         : m;
  device_sync();
  const torch::Tensor a = product == "project" ? m : product == "back-project" ? m.t() : p;
  const torch::Tensor b = product == "project" ? q : product == "back-project" ? p : q.t();
  if (how == "thin") state.SetLabel(optcc::thin_gemm_isa() + " " + optcc::thin_gemm_path(out, a, b));
  for (auto _ : state) {
    if (how == "fill") {
      out.fill_(1.0f);
    } else if (how == "thin") {
      optcc::thin_mm_f32_out(out, a, b);
    } else if (how == "mm_f32_out") {
      optcc::mm_f32_out(out, a, b);
    } else {
      optcc::mm_f32_out_with(optcc::GemmLibrary::kAten, out, a, b);
    }
    device_sync();
    benchmark::DoNotOptimize(out.data_ptr());
    benchmark::ClobberMemory();
  }
  const double numel = static_cast<double>(rows * cols);
  set_counters(state, 4.0 * numel, 4.0 * numel, 0.0, how == "fill" ? 0.0 : 2.0 * numel * static_cast<double>(r));
}

/// Registers `fn`: on the CPU as it is; on CUDA with wall time, or skipped with the reason the GPU
/// cannot be used.
template <class F>
benchmark::internal::Benchmark* register_on_device(const std::string& name, F fn) {
  if (!g_cuda) return benchmark::RegisterBenchmark(name.c_str(), fn);
  return benchmark::RegisterBenchmark(name.c_str(),
                                      [fn](benchmark::State& st) {
                                        if (!g_device_error.empty()) {
                                          st.SkipWithError(g_device_error.c_str());
                                          return;
                                        }
                                        fn(st);
                                      })
      ->UseRealTime();
}

template <class F>
void add(const std::string& name, F fn) {
  register_on_device(name, fn)->Unit(benchmark::kMicrosecond);
}

void register_all() {
  register_on_device("membw/copy_256MiB", bm_copy)->Unit(benchmark::kMillisecond);
  for (const auto& shape : kFig14) {
    for (const std::string product : {"project", "back-project", "expand"}) {
      for (const std::string how : {"thin", "mm_f32_out", "aten", "fill"}) {
        if (how == "fill" && product != "expand") continue;
        if (g_cuda && (how == "thin" || how == "mm_f32_out")) continue;  // CPU kernels: ATen on CUDA
        const int64_t rows = shape.first, cols = shape.second;
        add(fmt::format("gemm/{}/fig14/{}/r16/{}", product, shape_name(rows, cols), how),
            [=](benchmark::State& st) { bm_lowrank_product(st, rows, cols, 16, product, how); });
      }
    }
  }
  if (!g_cuda) {  // host kernels
    for (const auto& shape : kFig14) {
      for (bool encode : {true, false}) {
        for (bool blocked : {true, false}) {
          const int64_t rows = shape.first, cols = shape.second;
          add(fmt::format("kernel/hadamard/{}/fig14/{}/{}", encode ? "encode" : "decode", shape_name(rows, cols),
                          blocked ? "blocked" : "per_tile"),
              [=](benchmark::State& st) { bm_hadamard_kernel(st, rows, cols, encode, blocked); });
        }
      }
    }
  }
  const auto codecs = optcc::act_codec_names();
  for (const auto& codec : codecs) {
    for (bool encode : {true, false}) {
      const std::string op = encode ? "encode" : "decode";
      for (const auto& shape : kFig14) {
        const int64_t rows = shape.first, cols = shape.second;
        const std::string base = fmt::format("codec/{}/{}/fig14/{}", codec, op, shape_name(rows, cols));
        if (codec == "lowrank") {
          for (int64_t r : kFig14Ranks) {
            add(fmt::format("{}/r{}", base, r),
                [=](benchmark::State& st) { bm_codec(st, CodecCase{codec, rows, cols, r}, encode); });
            if (encode && !g_cuda) {  // the batched path beside it (on CUDA the plain name is that path)
              add(fmt::format("{}/r{}/batched", base, r),
                  [=](benchmark::State& st) { bm_codec(st, CodecCase{codec, rows, cols, r, true}, encode); });
            }
          }
        } else {
          add(base, [=](benchmark::State& st) { bm_codec(st, CodecCase{codec, rows, cols, 0}, encode); });
        }
      }
    }
  }
  for (const auto& preset : kPresets) {
    const auto shapes = preset_shapes(preset);
    for (const auto& codec : codecs) {
      for (bool encode : {true, false}) {
        for (const auto& matrix : shapes.matrices) {
          const std::string& param = matrix.first;
          const int64_t rows = matrix.second[0], cols = matrix.second[1];
          std::string name = fmt::format("codec/{}/{}/{}/{}/{}", codec, encode ? "encode" : "decode", preset,
                                         param, shape_name(rows, cols));
          if (codec == "lowrank") name += "/r16";
          add(name, [=](benchmark::State& st) { bm_codec(st, CodecCase{codec, rows, cols, 16}, encode); });
        }
      }
    }
  }
  const auto reducers = reducer_registry().names();
  for (const auto& red : reducers) {
    for (const auto& shape : kFig14) {
      const int64_t rows = shape.first, cols = shape.second;
      const std::string base = fmt::format("reducer/{}/reduce/fig14/{}", red, shape_name(rows, cols));
      if (red == "powersgd") {
        for (int64_t r : kFig14Ranks) {
          add(fmt::format("{}/r{}", base, r),
              [=](benchmark::State& st) { bm_reducer(st, ReducerCase{red, {{rows, cols}}, r}); });
          // Four same-shape gradients (a stage's layers): per matrix against batched, same run.
          const std::vector<std::vector<int64_t>> four(4, {rows, cols});
          if (!g_cuda) {
            for (bool batched : {false, true}) {
              add(fmt::format("{}/r{}/B4/{}", base, r, batched ? "batched" : "per_matrix"),
                  [=](benchmark::State& st) { bm_reducer(st, ReducerCase{red, four, r, batched}); });
            }
          }
        }
      } else {
        add(base, [=](benchmark::State& st) { bm_reducer(st, ReducerCase{red, {{rows, cols}}, 16}); });
      }
    }
  }
  for (int64_t r : {4, 16, 64}) {
    for (int64_t b : {1, 8, 32}) {
      for (bool batched : {true, false}) {
        add(fmt::format("opcount/lowrank/encode/96x128/r{}/B{}/{}", r, b, batched ? "batched" : "per_matrix_tensor_ops"),
            [=](benchmark::State& st) { bm_encode_op_count(st, r, b, batched); });
      }
    }
  }
  for (const auto& preset : kPresets) {
    const auto shapes = preset_shapes(preset);
    const auto& emb = shapes.matrices.back().second;
    for (const auto& red : reducers) {
      const std::string suffix = red == "powersgd" ? "/r16" : "";
      add(fmt::format("reducer/{}/reduce/{}/layer{}", red, preset, suffix),
          [=](benchmark::State& st) { bm_reducer(st, ReducerCase{red, shapes.layer, 16}); });
      add(fmt::format("reducer/{}/reduce/{}/embedding/{}{}", red, preset, shape_name(emb[0], emb[1]), suffix),
          [=](benchmark::State& st) { bm_reducer(st, ReducerCase{red, {emb}, 16}); });
    }
  }
}

/// One thread for LibTorch/OpenMP (and so oneDNN) and for OpenBLAS's own pool, which
/// at::set_num_threads does not reach (harness/parallel/threads.h does the same for training).
void single_thread() {
  at::set_num_threads(1);
  using SetThreads = void (*)(int);
  if (auto* set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_blas(1);
  }
}

/// Warns when a GEMM burns CPU on threads other than the main one (times would be too low).
void check_single_thread() {
  torch::NoGradGuard no_grad;
  auto a = torch::randn({512, 512});
  auto c = torch::empty({512, 512});
  at::mm_out(c, a, a);
  const double p0 = process_cpu_seconds(), t0 = thread_cpu_seconds();
  for (int i = 0; i < 10; ++i) at::mm_out(c, a, a);
  const double proc = process_cpu_seconds() - p0, thread = thread_cpu_seconds() - t0;
  if (proc > 1.2 * thread) {
    std::fprintf(stderr, "bench_compression: WARNING: other threads used %.0f%% of the main thread's CPU time in a "
                         "GEMM; the times below are not single-thread times\n",
                 100.0 * (proc - thread) / thread);
  }
}

/// fp32 GEMM rate of mm_f32_out (the compressors' GEMM) on 1024×1024×1024, median of 5.
double measure_gemm_flops() {
  torch::NoGradGuard no_grad;
  auto a = on_device(torch::randn({1024, 1024}));
  auto c = torch::empty({1024, 1024}, torch::TensorOptions().device(g_device));
  optcc::mm_f32_out(c, a, a);
  device_sync();
  std::vector<double> rates;
  for (int i = 0; i < 5; ++i) {
    const double t0 = timer_seconds();
    optcc::mm_f32_out(c, a, a);
    device_sync();
    rates.push_back(2.0 * 1024 * 1024 * 1024 / (timer_seconds() - t0));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

/// Reads OPTCC_BENCH_DEVICE (file header); false when its value is not a device.
bool select_device() {
  const char* env = std::getenv("OPTCC_BENCH_DEVICE");
  const std::string value = env != nullptr ? env : "";
  if (value.empty() || value == "cpu") return true;
  if (value != "cuda") {
    std::fprintf(stderr, "bench_compression: OPTCC_BENCH_DEVICE='%s' is not a device this benchmark knows. Fix: "
                         "cpu (the default, also when unset) or cuda (cuda:0)\n", value.c_str());
    return false;
  }
  g_cuda = true;
  if (!torch::cuda::is_available()) {
    g_device_error = std::string("OPTCC_BENCH_DEVICE=cuda, but torch::cuda::is_available() is false (LibTorch ") +
                     (at::hasCUDA() ? "sees no GPU" : "built without CUDA") +
                     "). Fix: unset OPTCC_BENCH_DEVICE for the CPU benchmarks, or build against a CUDA LibTorch "
                     "on a machine with a GPU (scripts/gpu/check.sh)";
    std::fprintf(stderr, "bench_compression: %s\n", g_device_error.c_str());
  } else {
    g_device = torch::Device(torch::kCUDA, 0);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (!select_device()) return 2;
  single_thread();
  check_single_thread();
  // Default --benchmark_min_time=0.1 (Google Benchmark's 0.5 s would make the set take ~10 min).
  std::vector<char*> args(argv, argv + argc);
  std::string min_time = "--benchmark_min_time=0.1";
  bool has_min_time = false;
  for (int i = 1; i < argc; ++i) has_min_time = has_min_time || std::strncmp(argv[i], "--benchmark_min_time", 20) == 0;
  if (!has_min_time) args.insert(args.begin() + 1, min_time.data());
  int args_count = static_cast<int>(args.size());
  benchmark::Initialize(&args_count, args.data());
  if (benchmark::ReportUnrecognizedArguments(args_count, args.data())) return 1;
  if (!g_cuda) {
    g_bandwidth_bytes_per_s = measure_bandwidth(9);
    benchmark::AddCustomContext("memory_bandwidth_GBps", fmt::format("{:.2f}", g_bandwidth_bytes_per_s / 1e9));
    benchmark::AddCustomContext("bandwidth_method", "median of 9 copy_ of 256 MiB fp32, (read+write bytes)/thread CPU s");
    benchmark::AddCustomContext("sgemm_1024_GFLOPs", fmt::format("{:.1f}", measure_gemm_flops() / 1e9));
  } else if (g_device_error.empty()) {
    benchmark::AddCustomContext("device", g_device.str());
    g_bandwidth_bytes_per_s = measure_bandwidth(9);
    benchmark::AddCustomContext("memory_bandwidth_GBps", fmt::format("{:.2f}", g_bandwidth_bytes_per_s / 1e9));
    benchmark::AddCustomContext("bandwidth_method",
                                "median of 9 copy_ of 256 MiB fp32 on " + g_device.str() +
                                    ", (read+write bytes)/wall s, torch::cuda::synchronize() before the clock stops");
    benchmark::AddCustomContext("sgemm_1024_GFLOPs", fmt::format("{:.1f}", measure_gemm_flops() / 1e9));
  } else {
    benchmark::AddCustomContext("device_error", g_device_error);
  }
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return g_device_error.empty() ? 0 : 1;
}

// bench_compression: single-thread CPU cost of optcc's compressors (Google Benchmark).
//
// What it measures (at::set_num_threads(1), fp32, random input from a fixed seed):
//   BM_MemoryBandwidth   copy_ of a 256 MiB fp32 tensor; bytes = 2 × 256 MiB per iteration (read +
//                        write). Registered first: its GB/s is kept and later benchmarks report
//                        bw_fraction = (their minimum bytes touched per second) / that bandwidth.
//   BM_LowRankEncode     the CB codec (`lowrank`, token_major view, hidden = cols) on the Fig. 14
//   BM_LowRankDecode     slice shapes 1024×1920, 1024×3072, 2048×12288, ranks 8..40 (Args: rows,
//                        cols, rank). One warm-up encode first (warm-start Q). bytes_per_second is
//                        GB/s of slice (rows·cols·4 per iteration). Counters: ratio = rows·cols /
//                        (r·(rows+cols)); bw_fraction with minimum traffic encode 2·rows·cols·4
//                        (M read for MQ and MᵀP), decode rows·cols·4 (the output written).
//   BM_PowerSgdReduce    PowerSgdReducer (rank 16, error feedback on, warm start) on one worker (a
//                        Communicator of size 1: compresses, no communication), one matrix per
//                        call, same shapes. bytes_per_second = GB/s of gradient; bw_fraction with
//                        minimum traffic 4·rows·cols·4 (EF add, MQ, MᵀP, reconstruction).
//
// Run (from the repository root, after building the bench_compression target):
//   mkdir -p results/bench
//   ./build/tests/bench/bench_compression --benchmark_min_time=0.2 --benchmark_out=results/bench/compression.json --benchmark_out_format=json
// The JSON goes wherever --benchmark_out points; by convention results/bench/compression.json.
// bw_fraction depends on BM_MemoryBandwidth having run first in the same process (it is 0
// otherwise, e.g. under a --benchmark_filter that excludes it).

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "compression/codecs.h"
#include "compression/powersgd.h"
#include "harness/communicator.h"

namespace {

double g_bandwidth_bytes_per_s = 0.0;  // set by BM_MemoryBandwidth

torch::Tensor random_matrix(int64_t rows, int64_t cols) {
  auto gen = at::detail::createCPUGenerator(1234);
  return torch::randn({rows, cols}, gen, torch::kFloat);
}

void set_common_counters(benchmark::State& state, int64_t rows, int64_t cols, int64_t r,
                         double min_bytes_per_iter) {
  const double elems = static_cast<double>(rows) * static_cast<double>(cols);
  state.SetBytesProcessed(state.iterations() * rows * cols * 4);
  state.counters["ratio"] = elems / (static_cast<double>(r) * static_cast<double>(rows + cols));
  // kIsRate divides by the elapsed time: (min bytes touched per second) / measured bandwidth.
  const double total_min_bytes = min_bytes_per_iter * static_cast<double>(state.iterations());
  state.counters["bw_fraction"] = benchmark::Counter(
      g_bandwidth_bytes_per_s > 0 ? total_min_bytes / g_bandwidth_bytes_per_s : 0.0,
      benchmark::Counter::kIsRate);
}

void BM_MemoryBandwidth(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  const int64_t n = 256LL * 1024 * 1024 / 4;
  auto src = torch::rand({n}, torch::kFloat);
  auto dst = torch::empty({n}, torch::kFloat);
  dst.copy_(src);  // fault pages in
  const int64_t bytes = n * 4;
  double seconds = 0.0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    dst.copy_(src);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(dst.data_ptr());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
  if (seconds > 0) g_bandwidth_bytes_per_s = 2.0 * bytes * state.iterations() / seconds;
  state.counters["GBps"] = g_bandwidth_bytes_per_s / 1e9;
}

// The CB codec with the token-major view (rows = tokens, cols = hidden), the paper's seed.
optcc::LowRankCodec token_major_codec(int64_t cols, int64_t rank) {
  optcc::MatrixView view;
  view.kind = optcc::MatrixView::Kind::kTokenMajor;
  view.hidden = cols;
  return optcc::LowRankCodec(view, rank, 714);
}

void BM_LowRankEncode(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  const int64_t rows = state.range(0), cols = state.range(1), rank = state.range(2);
  optcc::LowRankCodec codec = token_major_codec(cols, rank);
  auto x = random_matrix(rows, cols).reshape({-1});
  codec.encode(x);  // warm-up: draws Q, later encodes warm-start from it
  for (auto _ : state) {
    auto p = codec.encode(x);
    benchmark::DoNotOptimize(p.parts[0].data_ptr());
  }
  set_common_counters(state, rows, cols, codec.rank_for(rows * cols), 2.0 * rows * cols * 4);
}

void BM_LowRankDecode(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  const int64_t rows = state.range(0), cols = state.range(1), rank = state.range(2);
  optcc::LowRankCodec codec = token_major_codec(cols, rank);
  auto x = random_matrix(rows, cols).reshape({-1});
  codec.encode(x);
  optcc::Payload p = codec.encode(x);
  for (auto& part : p.parts) part = part.clone();  // detach from the codec's state
  for (auto _ : state) {
    auto y = codec.decode(p, rows * cols);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  set_common_counters(state, rows, cols, codec.rank_for(rows * cols), 1.0 * rows * cols * 4);
}

void BM_PowerSgdReduce(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  const int64_t rows = state.range(0), cols = state.range(1), rank = state.range(2);
  optcc::Communicator comm(optcc::ProcessGroupPtr(), {0}, 0, "bench", optcc::Link::kIntraNode, nullptr,
                           std::chrono::seconds(10));
  optcc::PowerSgdOptions opt;
  opt.rank = rank;
  opt.error_feedback = true;
  optcc::PowerSgdReducer reducer(opt);
  const auto g0 = random_matrix(rows, cols);
  std::vector<torch::Tensor> grads{g0.clone()};
  reducer.reduce(grads, comm, 0);  // warm-up: allocates EF and Q
  int64_t step = 1;
  for (auto _ : state) {
    state.PauseTiming();
    grads[0].copy_(g0);  // a fresh gradient each step (not timed)
    state.ResumeTiming();
    reducer.reduce(grads, comm, step++);
    benchmark::DoNotOptimize(grads[0].data_ptr());
  }
  set_common_counters(state, rows, cols, std::min({rank, rows, cols}), 4.0 * rows * cols * 4);
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1024, 1920}, {1024, 3072}, {2048, 12288}};

void small_args(benchmark::internal::Benchmark* b) {
  for (auto [rows, cols] : kShapes)
    if (rows * cols < 2048LL * 12288)
      for (int64_t r : {8, 16, 24, 32, 40}) b->Args({rows, cols, r});
}
void large_args(benchmark::internal::Benchmark* b) {
  for (int64_t r : {8, 16, 24, 32, 40}) b->Args({2048, 12288, r});
}

}  // namespace

BENCHMARK(BM_MemoryBandwidth)->Unit(benchmark::kMillisecond)->UseRealTime();
// The 2048×12288 slices are capped at 0.2 s each whatever --benchmark_min_time says.
BENCHMARK(BM_LowRankEncode)->Apply(small_args)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_LowRankEncode)->Apply(large_args)->MinTime(0.2)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_LowRankDecode)->Apply(small_args)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_LowRankDecode)->Apply(large_args)->MinTime(0.2)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_PowerSgdReduce)->Args({1024, 1920, 16})->Args({1024, 3072, 16})
    ->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_PowerSgdReduce)->Args({2048, 12288, 16})->MinTime(0.2)
    ->Unit(benchmark::kMicrosecond)->UseRealTime();

int main(int argc, char** argv) {
  at::set_num_threads(1);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

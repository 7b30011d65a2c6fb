#include "harness/tools/bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "harness/train/optimizer.h"
#include "harness/parallel/threads.h"
#include "harness/train/trainer.h"
#include "models/gpt.h"

namespace optcc {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double gemm_gflops(int64_t n) {
  auto a = torch::randn({n, n});
  auto b = torch::randn({n, n});
  auto c = torch::mm(a, b);  // warm-up
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    torch::mm_out(c, a, b);
    times.push_back(seconds_since(t0));
  }
  return 2.0 * n * n * n / median(times) / 1e9;
}

}  // namespace

StepBenchResult bench_step(Config cfg, int64_t steps, int64_t warmup, int64_t threads, int64_t gemm_size) {
  if (cfg.model.vocab_size == 0) {
    try {
      resolve_vocab(cfg);
    } catch (const ConfigError&) {
      cfg.model.vocab_size = cfg.data.vocab_size;
    }
  }
  cfg.validate(cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp);
  StepBenchResult r;
  r.threads = threads > 0 ? threads : threads_for(cfg);
  set_cpu_threads(r.threads);
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));

  const GptOptions o = gpt_options(cfg);
  GptModel model(o);
  model->train();
  auto optimizer = make_adamw(*model, cfg.train);
  const auto params = model->parameters();
  // All data-parallel replicas' micro-batches run here, so FLOPs cover the global batch.
  const int64_t micro_batches = cfg.train.global_batch_size / cfg.train.micro_batch_size;
  auto batch = torch::randint(0, o.vocab_size, {cfg.train.micro_batch_size, o.seq_len + 1}, torch::kLong);

  std::vector<double> times;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    auto t0 = Clock::now();
    optimizer->zero_grad();
    for (int64_t m = 0; m < micro_batches; ++m) (model->loss(batch) / static_cast<double>(micro_batches)).backward();
    clip_grad_global_norm(params, cfg.train.clip_grad);
    optimizer->step();
    if (i >= warmup) times.push_back(seconds_since(t0));
  }
  r.step_seconds = median(times);
  r.tokens_per_second = cfg.train.global_batch_size * o.seq_len / r.step_seconds;
  r.model_gflops = gpt_train_flops(o, cfg.train.global_batch_size) / r.step_seconds / 1e9;
  r.gemm_gflops = gemm_gflops(gemm_size);
  r.ratio = r.model_gflops / r.gemm_gflops;
  return r;
}

}  // namespace optcc

#include "harness/tools/bench.h"

#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <map>

#include "harness/train/optimizer.h"
#include "harness/parallel/allocator.h"
#include "harness/parallel/device.h"
#include "harness/parallel/threads.h"
#include "harness/train/trainer.h"
#include "kernels/gemm.h"
#include "kernels/thin_gemm.h"
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

// The forward GEMMs of one micro-batch, as the model's linear layers run them (x [b·s, in] times
// wᵀ, w [out, in]): qkv, proj, fc1, fc2 and the output layer, which multiplies by the whole padded
// embedding (padded_vocab_size rows, a multiple of 128: GPT-2's 50257 alone would leave the output
// rows misaligned, a far slower GEMM on a GPU than the model ever runs). Backward GEMMs have the
// same sizes.
std::vector<std::array<int64_t, 3>> model_gemm_shapes(const GptOptions& o, int64_t micro_batch) {
  const int64_t rows = micro_batch * o.seq_len, h = o.hidden_size;
  return {{rows, h, 3 * h}, {rows, h, h}, {rows, h, 4 * h}, {rows, 4 * h, h}, {rows, h, o.padded_vocab_size}};
}

// GFLOP/s of `mm` (out = a·b) over `shapes` (each m x k times the transpose of an [n, k] weight) in
// `dtype`: total FLOPs over the median time of 5 passes through all shapes, after one untimed pass.
template <class Mm>
double gemm_gflops(const Mm& mm, const std::vector<std::array<int64_t, 3>>& shapes, const torch::Device& device,
                   torch::ScalarType dtype) {
  std::vector<torch::Tensor> xs, ws, ys;
  double flops = 0;
  const auto on = torch::TensorOptions().dtype(dtype).device(device);
  for (const auto& [m, k, n] : shapes) {
    xs.push_back(torch::randn({m, k}, on));
    ws.push_back(torch::randn({n, k}, on));
    ys.push_back(torch::empty({m, n}, on));
    flops += 2.0 * double(m) * double(k) * double(n);
  }
  auto pass = [&] {
    for (size_t i = 0; i < shapes.size(); ++i) mm(ys[i], xs[i], ws[i].t());
  };
  pass();
  synchronize(device);
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    SpanTimer timer(device);  // CUDA events on a GPU
    pass();
    times.push_back(timer.seconds());
  }
  return flops / median(times) / 1e9;
}

// The GEMM rates at the model's shapes in the step's compute dtype, into r.gemm and the best into
// r.gemm_gflops / r.gemm_library. fp32: every library this build has (on a GPU only ATen: oneDNN and
// the thin kernels are CPU libraries). bf16 / fp16: ATen, which the model uses.
void measure_gemm_rates(StepBenchResult& r, const GptOptions& o, int64_t micro_batch, const Placement& placement) {
  const auto shapes = model_gemm_shapes(o, micro_batch);
  if (o.compute_dtype == torch::kFloat) {
    const auto libraries = placement.on_gpu() ? std::vector<GemmLibrary>{GemmLibrary::kAten} : gemm_libraries();
    for (GemmLibrary lib : libraries) {
      const auto mm = [lib](torch::Tensor& y, const torch::Tensor& a, const torch::Tensor& b) { mm_f32_out_with(lib, y, a, b); };
      const double g = gemm_gflops(mm, shapes, placement.device, torch::kFloat);
      r.gemm.push_back({gemm_library_name(lib), g});
      if (g > r.gemm_gflops) r.gemm_gflops = g, r.gemm_library = gemm_library_name(lib);
    }
    return;
  }
  const auto mm = [](torch::Tensor& y, const torch::Tensor& a, const torch::Tensor& b) { at::mm_out(y, a, b); };
  r.gemm_library = std::string("ATen at::mm ") + c10::toString(o.compute_dtype);
  r.gemm_gflops = gemm_gflops(mm, shapes, placement.device, o.compute_dtype);
  r.gemm.push_back({r.gemm_library, r.gemm_gflops});
}

/// The operations of a legacy profile by self time, largest first (at most `top`). Each thread's
/// events are push/pop pairs (matched by their RecordFunction handle) nested like the calls; self =
/// span − the spans of the calls directly inside. On `cuda`, spans on the GPU's clock.
std::vector<ProfiledOp> top_operations(const torch::autograd::profiler::thread_event_lists& lists, bool cuda,
                                       int64_t top) {
  using torch::autograd::profiler::EventKind;
  using torch::autograd::profiler::LegacyEvent;
  std::map<std::string, ProfiledOp> by_name;
  for (const auto& events : lists) {
    struct Open {
      const LegacyEvent* push;
      double children_ms = 0;
    };
    std::vector<Open> open;
    for (const auto& e : events) {
      if (e.kind() == EventKind::PushRange) {
        open.push_back({&e});
      } else if (e.kind() == EventKind::PopRange && !open.empty()) {
        auto it = std::find_if(open.rbegin(), open.rend(), [&](const Open& o) { return o.push->handle() == e.handle(); });
        if (it == open.rend()) continue;
        const LegacyEvent& push = *it->push;
        const double span_ms = (cuda && push.hasCuda() ? push.cudaElapsedUs(e) : push.cpuElapsedUs(e)) / 1e3;
        std::string name = push.name();  // optcc's autograd nodes without the namespace noise
        for (const std::string noise : {"torch::autograd::", "optcc::(anonymous namespace)::", "optcc::"}) {
          for (auto at = name.find(noise); at != std::string::npos; at = name.find(noise)) name.erase(at, noise.size());
        }
        auto& op = by_name[name];
        op.name = name;
        op.calls += 1;
        op.total_ms += span_ms;
        op.self_ms += span_ms - it->children_ms;
        open.erase(std::next(it).base(), open.end());
        if (!open.empty()) open.back().children_ms += span_ms;
      }
    }
  }
  std::vector<ProfiledOp> out;
  for (auto& [name, op] : by_name) out.push_back(op);
  std::sort(out.begin(), out.end(), [](const ProfiledOp& a, const ProfiledOp& b) { return a.self_ms > b.self_ms; });
  if (static_cast<int64_t>(out.size()) > top) out.resize(static_cast<size_t>(top));
  return out;
}

/// One more step under LibTorch's legacy profiler (GPU clock on CUDA, host clock elsewhere): its
/// wall time and its `top` operations by self time go into r.
void profile_one_step(StepBenchResult& r, const std::function<void()>& one_step, bool cuda, int64_t top) {
  namespace prof = torch::autograd::profiler;
  prof::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(
      cuda ? torch::profiler::impl::ProfilerState::CUDA : torch::profiler::impl::ProfilerState::CPU));
  const auto t0 = Clock::now();
  one_step();
  r.profile_step_ms = seconds_since(t0) * 1e3;
  r.profile = top_operations(prof::disableProfilerLegacy(), cuda, top);
  r.profile_clock = cuda ? "CUDA" : "CPU";
}

}  // namespace

StepBenchResult bench_step(Config cfg, int64_t steps, int64_t warmup, int64_t threads, int64_t profile_top) {
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
  // One process: parallel.device decides (auto: this build's GPU if it sees one); no groups are made.
  const Placement placement = this_rank_placement(cfg.parallel.device, "auto", 0, 1);
  use_device(placement.device);
  r.device = placement.device.str();

  const GptOptions o = gpt_options(cfg);
  GptModel model(o);
  model->to(placement.device);
  model->train();
  auto optimizer = make_adamw(*model, cfg.train);
  const auto params = model->parameters();
  // All data-parallel replicas' micro-batches run here, so FLOPs cover the global batch.
  const int64_t micro_batches = cfg.train.global_batch_size / cfg.train.micro_batch_size;
  auto batch = torch::randint(0, o.vocab_size, {cfg.train.micro_batch_size, o.seq_len + 1}, torch::kLong)
                   .to(placement.device);

  const auto one_step = [&] {
    optimizer->zero_grad();
    for (int64_t m = 0; m < micro_batches; ++m) (model->loss(batch) / static_cast<double>(micro_batches)).backward();
    clip_grad_global_norm(params, cfg.train.clip_grad);
    optimizer->step();
    synchronize(placement.device);  // CUDA: the step is over when the GPU is done
  };
  std::vector<double> times;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    auto t0 = Clock::now();
    one_step();
    if (i >= warmup) times.push_back(seconds_since(t0));
  }
  if (profile_top > 0) profile_one_step(r, one_step, placement.on_gpu(), profile_top);
  r.step_seconds = median(times);
  r.tokens_per_second = cfg.train.global_batch_size * o.seq_len / r.step_seconds;
  r.model_gflops = gpt_train_flops(o, cfg.train.global_batch_size) / r.step_seconds / 1e9;
  r.precision = cfg.train.precision;
  r.attention = attention_kernel_name(attention_kernel_used(o.attention, placement.on_gpu(), o.attention_dropout, true));
  r.cpu_bf16 = cpu_bf16_instructions();
  r.linear_library = placement.on_gpu() ? "ATen (CUDA)" : compute_gemm_library(o.compute_dtype);
  r.allocator = cpu_allocator();
  r.thin_gemm = placement.on_gpu() ? "ATen (CUDA)" : "kernels/thin_gemm.h, " + thin_gemm_isa();
  measure_gemm_rates(r, o, cfg.train.micro_batch_size, placement);
  r.ratio = r.model_gflops / r.gemm_gflops;
  return r;
}

}  // namespace optcc

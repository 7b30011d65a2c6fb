#include "harness/train/sc_choice.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "compression/grad_reducer.h"
#include "compression/registry.h"
#include "harness/parallel/device.h"
#include "harness/parallel/stage_link.h"
#include "harness/train/data_loader.h"
#include "harness/train/grad_sync.h"

namespace optcc {

using Clock = std::chrono::steady_clock;

namespace {

// Seconds one DP all-reduce of `grads` (cloned, so each call sees the same input) takes with the
// registry's reducer `name`, from a barrier of the DP group; called by every rank of the group.
double timed_dp_reduce(Distributed& d, const std::vector<torch::Tensor>& grads, const std::string& name,
                       const YAML::Node& options) {
  Registry<GradReducer> registry;
  register_builtin_grad_reducers(registry);
  auto reducer = registry.create(name, options);
  std::vector<torch::Tensor> work;
  for (const auto& g : grads) work.push_back(g.clone());
  synchronize(d.placement.device);
  d.dp->barrier();
  const auto t = Clock::now();
  reducer->reduce(work, *d.dp, 0);
  synchronize(d.placement.device);
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// `all`: one row per rank, [stage, pipeline end, raw all-reduce, compressed all-reduce] seconds. Per
// stage the slowest of its ranks; stage k compresses iff its raw all-reduce would end after stage 0's
// compressed one.
ScChoice choose_stages(const torch::Tensor& all, int stages) {
  ScChoice c;
  c.end.assign(stages, 0.0), c.raw.assign(stages, 0.0), c.comp0.assign(stages, 0.0);
  auto a = all.accessor<double, 2>();
  for (int64_t r = 0; r < all.size(0); ++r) {
    const int k = static_cast<int>(a[r][0]);
    c.end[k] = std::max(c.end[k], a[r][1]), c.raw[k] = std::max(c.raw[k], a[r][2]);
    c.comp0[k] = std::max(c.comp0[k], a[r][3]);
  }
  c.compress.assign(stages, false);
  for (int k = 0; k < stages; ++k) c.compress[k] = c.end[k] + c.raw[k] > c.end[0] + c.comp0[0];
  return c;
}

}  // namespace

ScChoice calibrate_sc_auto(const Config& cfg, Distributed& d, GptModel& model, const PipelineSchedule& pipeline,
                           GptStageFunctions& fn, const std::vector<int64_t>& act_shape, int64_t m,
                           const RunData& data) {
  const RankCoord coord = d.coord();
  // Nothing of the run may change: generators are restored, the data position is not advanced,
  // the pipeline codec (LEP, Q) is not used (an uncompressed link), no optimizer step.
  auto cpu_gen = at::detail::getDefaultCPUGenerator();
  const torch::Tensor cpu_state = cpu_gen.get_state();
  const torch::Tensor attention_state = model->attention_generator().get_state();
  fn.batches.clear();
  if (model->stage().is_first || model->stage().is_last) {
    BatchLoader calib(data.train, cfg.model.seq_len, cfg.train.micro_batch_size, coord.dp, cfg.parallel.dp, 0,
                      d.placement.device);
    for (int64_t i = 0; i < m; ++i) fn.batches.push_back(calib.next());
  }
  StageLink plain(*d.pp, d.tp.get(), StageLinkShapes{act_shape, act_shape},
                  torch::TensorOptions().dtype(model->options().compute_dtype).device(d.placement.device), nullptr,
                  pipeline.chunks());
  auto params = model->parameters();
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  const torch::Device device = d.placement.device;  // CUDA: times wait for the GPU (device.h synchronize)
  synchronize(device);
  d.world->barrier();
  const auto t0 = Clock::now();
  run_pipeline_step(pipeline, fn, plain, static_cast<int>(m));
  synchronize(device);
  const double end = std::chrono::duration<double>(Clock::now() - t0).count();
  auto grads = ensure_grads(params);
  std::vector<torch::Tensor> copy;
  for (const auto& g : grads) copy.push_back(g.clone());
  const double raw = d.dp->size() > 1 ? timed_dp_reduce(d, copy, "none", YAML::Node()) : 0.0;
  const double comp = d.dp->size() > 1 && coord.pp == 0
                          ? timed_dp_reduce(d, copy, cfg.compression.dp.name, cfg.compression.dp.options)
                          : 0.0;
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  fn.batches.clear();
  cpu_gen.set_state(cpu_state);
  model->attention_generator().set_state(attention_state);
  auto mine = torch::tensor({static_cast<double>(coord.pp), end, raw, comp}, torch::kDouble);
  auto all = d.world->all_gather(mine.unsqueeze(0), Traffic::kControl, 0);
  d.meter.reset();
  return choose_stages(all, static_cast<int>(cfg.parallel.pp));
}

std::string sc_stages_text(const Config& cfg, const std::vector<bool>& sc_compress) {
  if (cfg.compression.dp.name == "none") return std::string("all raw");
  std::string out;
  for (size_t k = 0; k < sc_compress.size(); ++k) out += fmt::format("{}{}", out.empty() ? "" : ",", sc_compress[k] ? "c" : "raw");
  return out;
}

}  // namespace optcc

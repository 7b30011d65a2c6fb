#include "harness/trainer.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "datasets/gpt_dataset.h"
#include "datasets/indexed_dataset.h"
#include "harness/checkpoint.h"
#include "harness/data_loader.h"
#include "harness/metrics.h"
#include "harness/optimizer.h"
#include "harness/run_info.h"
#include "harness/threads.h"
#include "models/gpt.h"

namespace optcc {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;


std::string format_eta(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds));
  return fmt::format("{:02d}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

std::vector<TableSpec> result_tables() {
  return {
      {"train",
       {{"step", ColumnType::kInt64, "steps"},
        {"loss", ColumnType::kFloat64, "nats"},
        {"lr", ColumnType::kFloat64, ""},
        {"grad_norm", ColumnType::kFloat64, ""},
        {"step_seconds", ColumnType::kFloat64, "s"},
        {"tokens_per_second", ColumnType::kFloat64, "tokens/s"}}},
      {"eval",
       {{"step", ColumnType::kInt64, "steps"},
        {"loss", ColumnType::kFloat64, "nats"},
        {"ppl", ColumnType::kFloat64, ""}}},
  };
}

// The data a run reads: train and validation sample streams over the indexed dataset.
struct RunData {
  std::shared_ptr<const data::GptDataset> train, valid;
};

RunData open_data(const Config& c) {
  const std::string prefix = c.data.prefix;
  if (!fs::exists(prefix + ".idx") || !fs::exists(prefix + ".bin")) {
    throw std::runtime_error(fmt::format(
        "data error: the indexed dataset {}.bin/.idx (data.prefix) does not exist. Fix: run "
        "`optcc data fetch --config {}` and `optcc data prepare --config {}` first.",
        prefix, c.source_path, c.source_path));
  }
  auto indexed = std::make_shared<const data::IndexedDataset>(prefix);
  const auto splits = data::split_documents(indexed->num_documents(), c.data.split);
  const std::string cache = (fs::path(c.data.dir) / "cache").string();
  const auto seed = static_cast<uint64_t>(c.train.seed);
  RunData d;
  d.train = std::make_shared<const data::GptDataset>(
      indexed, splits[0],
      data::GptDatasetOptions{c.model.seq_len, c.train.train_steps * c.train.global_batch_size, seed, cache, "train"});
  if (splits[1].end_doc > splits[1].begin_doc) {
    d.valid = std::make_shared<const data::GptDataset>(
        indexed, splits[1],
        data::GptDatasetOptions{c.model.seq_len, c.train.eval_iters * c.train.micro_batch_size, seed, cache, "valid"});
  }
  return d;
}

double evaluate(GptModel& model, const Config& c, const data::GptDataset& valid) {
  torch::NoGradGuard no_grad;
  model->eval();
  BatchLoader loader(std::shared_ptr<const data::GptDataset>(&valid, [](auto*) {}), c.model.seq_len,
                     c.train.micro_batch_size);
  double sum = 0.0;
  for (int64_t i = 0; i < c.train.eval_iters; ++i) sum += model->loss(loader.next()).item<double>();
  model->train();
  return sum / static_cast<double>(c.train.eval_iters);
}

std::string results_path_for(const Config& c, int64_t first_step) {
  fs::create_directories(c.log.dir);
  std::string name = c.run_name();
  if (first_step > 0) name += fmt::format(".resumed-{}", first_step);
  return (fs::path(c.log.dir) / (name + ".h5")).string();
}

}  // namespace

GptOptions gpt_options(const Config& c) {
  GptOptions o;
  o.num_layers = c.model.num_layers;
  o.hidden_size = c.model.hidden_size;
  o.num_heads = c.model.num_heads;
  o.seq_len = c.model.seq_len;
  o.max_positions = c.model.max_position_embeddings > 0 ? c.model.max_position_embeddings : c.model.seq_len;
  o.vocab_size = c.model.vocab_size;
  o.padded_vocab_size = c.padded_vocab_size();
  o.hidden_dropout = c.model.hidden_dropout;
  o.attention_dropout = c.model.attention_dropout;
  o.init_std = c.model.init_std;
  o.seed = static_cast<uint64_t>(c.train.seed);
  return o;
}

int64_t threads_for(const Config& cfg, int64_t local_ranks) {
  if (cfg.train.threads > 0) return cfg.train.threads;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  return std::max<int64_t>(1, hw / std::max<int64_t>(1, local_ranks));
}

TrainSummary run_training(Config cfg, const TrainOptions& options) {
  resolve_vocab(cfg);
  cfg.validate(/*world_size=*/1);
  spdlog::set_level(spdlog::level::from_str(cfg.log.level));
  set_cpu_threads(threads_for(cfg));
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));

  RunData data = open_data(cfg);
  GptModel model(gpt_options(cfg));
  model->train();
  auto optimizer = make_adamw(*model, cfg.train);
  const LrSchedule schedule = LrSchedule::from(cfg.train);
  const CheckpointLayout layout{cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.dp, 0};
  const std::string config_yaml = to_yaml(cfg);

  TrainState state;
  if (options.resume) {
    state = load_checkpoint(*options.resume, *model, *optimizer, layout);
    spdlog::info("resumed from {} at step {}", *options.resume, state.step);
  }
  BatchLoader loader(data.train, cfg.model.seq_len, cfg.train.micro_batch_size, 0, cfg.parallel.dp,
                     state.consumed_samples);

  TrainSummary summary;
  summary.first_step = state.step;
  summary.results_path = results_path_for(cfg, state.step);
  auto attrs = run_attributes(options.command_line);
  attrs["config"] = config_yaml;
  attrs["layout"] = fmt::format("tp={} pp={} dp={}", cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.dp);
  attrs["resumed_from_step"] = std::to_string(state.step);
  attrs["network_emulation"] = cfg.network.emulate ? "on" : "off";
  attrs["parameters"] = std::to_string(count_parameters(model));
  Hdf5MetricsSink sink(summary.results_path, attrs, result_tables());

  const int64_t micro_batches = cfg.num_micro_batches();
  const int64_t tokens_per_step = cfg.train.global_batch_size * cfg.model.seq_len;
  if (!options.quiet) {
    spdlog::info("model: {} layers, h={}, heads={}, seq={}, vocab={} (padded {}), {:.2f}M parameters",
                 cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_heads, cfg.model.seq_len,
                 cfg.model.vocab_size, cfg.padded_vocab_size(), count_parameters(model) / 1e6);
    spdlog::info("training {} steps of {} sequences ({} micro-batches of {}), {} threads; results -> {}",
                 cfg.train.train_steps, cfg.train.global_batch_size, micro_batches,
                 cfg.train.micro_batch_size, at::get_num_threads(), summary.results_path);
  }

  auto run_eval = [&](int64_t step) {
    if (!data.valid) return;
    const double loss = evaluate(model, cfg, *data.valid);
    const double ppl = std::exp(std::min(20.0, loss));
    summary.eval_losses.push_back(loss);
    sink.append("eval", {step, loss, ppl});
    sink.flush();
    if (!options.quiet) spdlog::info("eval  step {:>6} | valid loss {:.4f} | ppl {:.2f}", step, loss, ppl);
  };

  const auto params = model->parameters();
  double seconds_run = 0.0;
  while (state.step < cfg.train.train_steps) {
    const auto t0 = Clock::now();
    const double lr = schedule.at(state.step);
    set_lr(*optimizer, lr);
    optimizer->zero_grad();
    double loss_sum = 0.0;
    for (int64_t i = 0; i < micro_batches; ++i) {
      auto loss = model->loss(loader.next()) / static_cast<double>(micro_batches);
      loss.backward();
      loss_sum += loss.item<double>();
    }
    if (!std::isfinite(loss_sum)) {
      throw std::runtime_error(fmt::format("training diverged: loss is {} at step {}. Fix: lower "
                                           "train.lr or raise train.warmup_steps.",
                                           loss_sum, state.step + 1));
    }
    const double grad_norm = clip_grad_global_norm(params, cfg.train.clip_grad);
    optimizer->step();
    state.step += 1;
    state.consumed_samples = loader.consumed_samples();

    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    seconds_run += dt;
    summary.train_losses.push_back(loss_sum);
    sink.append("train", {state.step, loss_sum, lr, grad_norm, dt, tokens_per_step / dt});
    if (state.step % cfg.log.interval == 0 || state.step == cfg.train.train_steps) {
      sink.flush();
      const double avg = seconds_run / static_cast<double>(state.step - summary.first_step);
      if (!options.quiet) {
        spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:>8.0f} tok/s | "
                     "{:.0f} ms/step | ETA {}",
                     state.step, cfg.train.train_steps, loss_sum, lr, grad_norm, tokens_per_step / avg,
                     avg * 1e3, format_eta(avg * (cfg.train.train_steps - state.step)));
      }
    }
    if (cfg.train.eval_interval > 0 && state.step % cfg.train.eval_interval == 0 &&
        state.step != cfg.train.train_steps) {
      run_eval(state.step);
    }
    const bool periodic = cfg.checkpoint.interval > 0 && state.step % cfg.checkpoint.interval == 0;
    const bool final = cfg.checkpoint.save_final && state.step == cfg.train.train_steps;
    if (periodic || final) {
      sink.flush();
      summary.last_checkpoint = save_checkpoint(cfg.checkpoint_dir(), state, *model, *optimizer, layout,
                                                config_yaml, cfg.checkpoint.keep);
      if (!options.quiet) spdlog::info("checkpoint -> {}", summary.last_checkpoint);
    }
  }
  run_eval(state.step);
  sink.flush();
  summary.last_step = state.step;
  return summary;
}

}  // namespace optcc

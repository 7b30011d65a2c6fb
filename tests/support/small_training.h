// Test fixture: a small GPT trained for a few steps on a synthetic corpus, ranks as threads.
// The tests of training behaviour (parity with one rank, evaluation leaving training alone, loss
// skipping, DiLoCo) share this model and run loop and change only what they test.
#pragma once

#include <map>
#include <ostream>
#include <optional>
#include <string>
#include <vector>

#include "harness/config/config.h"
#include "harness/parallel/distributed.h"
#include "harness/train/trainer.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/synthetic_corpus.h"

namespace optcc::testing {

/// Tensor x pipeline x data parallel sizes of a run (processes).
struct Dims {
  int tp, pp, dp;
};
/// gtest's name for a Dims parameter: tp2_pp1_dp1.
inline void PrintTo(const Dims& d, std::ostream* os) { *os << "tp" << d.tp << "_pp" << d.pp << "_dp" << d.dp; }

/// 4 layers of h = 32 (4 heads), s = 16, the vocabulary padded to a multiple of 32 (64 tokens pad to
/// 64 for every tp here), dropout off; micro-batch 2, global batch 8 (sequences), 6 steps, lr 1e-3
/// after 1 warmup step, one thread per rank. Data: the indexed corpus at dir/"corpus" (write it with
/// write_synthetic_corpus), split 80/20 so there is a validation set; evaluation only at the end
/// (eval_interval 0), 2 micro-batches. Results under dir/"results" as `run_name`.
inline Config small_training_config(const TempDir& dir, Dims d, const std::string& run_name) {
  Config c;
  c.data.prefix = dir / "corpus";
  c.data.dir = dir / "data";
  c.data.split = "80,20,0";
  c.log.dir = dir / "results";
  c.log.run_name = run_name;
  c.model.num_layers = 4;
  c.model.hidden_size = 32;
  c.model.num_heads = 4;
  c.model.seq_len = 16;
  c.model.vocab_divisor = 32;
  c.model.hidden_dropout = 0.0;
  c.model.attention_dropout = 0.0;
  c.parallel.tp = d.tp;
  c.parallel.pp = d.pp;
  c.parallel.dp = d.dp;
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 8;
  c.train.train_steps = 6;
  c.train.warmup_steps = 1;
  c.train.lr = 1e-3;
  c.train.threads = 1;
  c.train.eval_iters = 2;
  c.train.eval_interval = 0;
  return c;
}

/// What a run returns: the losses (the same on every rank) and the final parameters.
struct TrainedRun {
  std::vector<double> train_losses, eval_losses;                 // nats, one per step / evaluation
  std::map<std::string, torch::Tensor> parameters;               // global rank 0's
  std::vector<std::map<std::string, torch::Tensor>> every_rank;  // by global rank
  std::string results;                                           // the HDF5 file
};

/// Trains `cfg` on dims.tp * dims.pp * dims.dp thread ranks (quiet, parameters kept), resuming
/// from `resume` (a checkpoint folder) when given.
inline TrainedRun train_small(const Config& cfg, Dims dims, const std::optional<std::string>& resume = std::nullopt) {
  TrainedRun out;
  out.every_rank.resize(static_cast<size_t>(dims.tp * dims.pp * dims.dp));
  run_layout({dims.tp, dims.pp, dims.dp}, [&](int rank, Distributed& dist) {
    TrainOptions opt;
    opt.quiet = true;
    opt.keep_parameters = true;
    opt.resume = resume;
    auto s = run_training(cfg, opt, dist);
    out.every_rank[static_cast<size_t>(rank)] = s.parameters;
    if (rank == 0) {
      out.train_losses = s.train_losses, out.eval_losses = s.eval_losses;
      out.parameters = s.parameters, out.results = s.results_path;
    }
  });
  return out;
}

}  // namespace optcc::testing

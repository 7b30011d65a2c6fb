#include "harness/checkpoints/checkpoint_reshard.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <limits>
#include <vector>

#include "harness/train/trainer.h"
#include "models/sharding.h"

namespace optcc {
namespace {

namespace fs = std::filesystem;

std::string shape_text(const torch::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

double max_abs_difference(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.sizes().equals(b.sizes())) return std::numeric_limits<double>::infinity();
  return a.numel() == 0 ? 0.0 : (a - b).abs().max().item<double>();
}

// The shards of one stage, DP replica 0: [whole name][tp rank].
using StageShards = std::map<std::string, std::vector<torch::Tensor>>;

struct Reader {
  MergedCheckpoint& out;
  std::map<std::string, std::vector<int64_t>> whole_shapes;  // of a whole model built from the config
  std::map<std::string, TpSplit> splits;                      // of the same model
  std::vector<StageShards> stages;                    // [pp]

  // Rank `rank`'s file: its parameters under their whole-model names, checked against the model.
  void read_rank(int64_t rank) {
    const CheckpointLayout& l = out.layout;
    const int64_t tp = rank % l.tp, dp = (rank / l.tp) % l.dp, pp = rank / (l.tp * l.dp);
    const CheckpointFile file = read_checkpoint_file(out.dir, rank);
    if (file.layout.tp != l.tp || file.layout.pp != l.pp || file.layout.dp != l.dp || file.step != out.step) {
      throw std::runtime_error(fmt::format("checkpoint: {} holds layout tp={} pp={} dp={} at step {}, rank 0's file "
                                           "tp={} pp={} dp={} at step {}: not one checkpoint",
                                           file.path, file.layout.tp, file.layout.pp, file.layout.dp, file.step, l.tp,
                                           l.pp, l.dp, out.step));
    }
    const StageRange range = stage_range(out.config, static_cast<int>(pp));
    for (const auto& [local, tensor] : file.parameters) {
      const std::string name = whole_model_name(local, range);
      if (!whole_shapes.count(name)) {
        throw std::runtime_error(fmt::format("checkpoint: {} holds parameter '{}' ('{}' of the whole model), which "
                                             "the model of its stored config does not have",
                                             file.path, local, name));
      }
      auto& shards = stages[pp][name];
      if (dp == 0) {
        shards.resize(l.tp);
        shards[tp] = tensor;
      } else {
        out.max_replica_difference = std::max(out.max_replica_difference, max_abs_difference(tensor, shards.at(tp)));
      }
    }
  }

  // Every whole-model parameter from the first stage that holds it; later copies are compared.
  void merge() {
    for (const auto& [name, shape] : whole_shapes) {
      for (size_t k = 0; k < stages.size(); ++k) {
        const auto it = stages[k].find(name);
        if (it == stages[k].end()) continue;
        for (size_t r = 0; r < it->second.size(); ++r) {
          if (!it->second[r].defined()) {
            throw std::runtime_error(fmt::format("checkpoint: {}: stage {} holds parameter '{}' on some TP ranks but not "
                                                 "on TP rank {}", out.dir, k, name, r));
          }
        }
        const TpSplit& split = splits.at(name);
        for (size_t r = 1; r < it->second.size() && split.dim < 0; ++r) {  // TP ranks' copies of a replicated one
          out.max_tp_copy_difference =
              std::max(out.max_tp_copy_difference, max_abs_difference(it->second[r], it->second[0]));
        }
        torch::Tensor t = merge_tp_shards(it->second, split);
        if (t.sizes().vec() != shape) {
          throw std::runtime_error(fmt::format("checkpoint: {}: parameter '{}' merges to shape {} (stage {}), but the "
                                               "model of its stored config has [{}]",
                                               out.dir, name, shape_text(t), k, fmt::join(shape, ", ")));
        }
        if (out.parameters.count(name)) {
          out.max_tied_difference = std::max(out.max_tied_difference, max_abs_difference(t, out.parameters[name]));
        } else {
          out.parameters[name] = t;
        }
      }
      if (!out.parameters.count(name)) {
        throw std::runtime_error(fmt::format("checkpoint: {} holds no parameter '{}' on any stage", out.dir, name));
      }
    }
  }
};

}  // namespace

MergedCheckpoint read_checkpoint_config(const std::string& checkpoint) {
  const CheckpointFile meta = read_checkpoint_file(checkpoint, 0, /*with_parameters=*/false);
  MergedCheckpoint out;
  out.dir = fs::path(meta.path).parent_path().string();
  out.step = meta.step;
  out.layout = meta.layout;
  out.config = load_config_text(meta.config_yaml, "the config stored in " + meta.path);
  return out;
}

MergedCheckpoint merge_checkpoint(const std::string& checkpoint) {
  MergedCheckpoint out = read_checkpoint_config(checkpoint);
  Reader reader{out, {}, {}, std::vector<StageShards>(out.layout.pp)};
  torch::NoGradGuard no_grad;
  {
    const GptModel whole(gpt_options(out.config));  // the whole model of the stored config: names, shapes, splits
    for (const auto& p : whole->named_parameters()) reader.whole_shapes[p.key()] = p.value().sizes().vec();
    reader.splits = tp_splits(*whole);
  }
  const int64_t world = out.layout.tp * out.layout.pp * out.layout.dp;
  for (int64_t rank = 0; rank < world; ++rank) reader.read_rank(rank);
  reader.merge();
  return out;
}

void load_whole_model(GptModelImpl& model, const std::map<std::string, torch::Tensor>& whole, int64_t tp_rank,
                      int64_t tp_size) {
  torch::NoGradGuard no_grad;
  const auto splits = tp_splits(model);
  const GptOptions& o = model.options();
  for (auto& p : model.named_parameters()) {
    const std::string name = whole_model_name(p.key(), model.stage());
    const auto it = whole.find(name);
    if (it == whole.end()) {
      throw std::runtime_error(fmt::format("re-shard: the checkpoint holds no parameter '{}' (this stage's '{}')", name,
                                           p.key()));
    }
    const TpSplit& split = splits.at(p.key());
    const torch::Tensor source =
        split.vocab_padded ? fit_vocab_rows(it->second, o.vocab_size, o.padded_vocab_size) : it->second;
    const torch::Tensor shard = tp_shard(source, split, tp_rank, tp_size);
    if (!shard.sizes().equals(p.value().sizes())) {
      throw std::runtime_error(fmt::format("re-shard: parameter '{}' of the checkpoint gives a shard of shape {} for TP "
                                           "rank {} of {}, but the model has {} (a model of other sizes)",
                                           name, shape_text(shard), tp_rank, tp_size, shape_text(p.value())));
    }
    p.value().copy_(shard);
  }
}

}  // namespace optcc

#include "harness/train/grad_sync.h"

#include <cmath>
#include <limits>

#include "harness/parallel/timeline.h"
#include "models/precision.h"

namespace optcc {

std::vector<torch::Tensor> ensure_grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) {
    if (!p.grad().defined()) const_cast<torch::Tensor&>(p).mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  return grads;
}

void sync_tied_embedding_grad(GptModel& model, Communicator* embedding) {
  if (!embedding || embedding->size() == 1) return;
  auto w = model->word_embedding();
  TORCH_CHECK(w.defined() && w.grad().defined(), "embedding sync on a stage without the word embedding");
  torch::NoGradGuard no_grad;
  auto g = w.grad().contiguous();
  embedding->all_reduce(g, Traffic::kEmbedding);
  w.mutable_grad() = g;
}

std::unique_ptr<GradReducer> make_dp_reducer(const Config& cfg, bool compresses) {
  if (compresses && cfg.compression.dp.name != "none") {
    Registry<GradReducer> registry;
    register_builtin_grad_reducers(registry);
    return registry.create(cfg.compression.dp.name, cfg.compression.dp.options);
  }
  return std::make_unique<NoneReducer>(precision_dtype(uncompressed_dp_dtype(cfg)));
}

GradientSync::GradientSync(const Config& cfg, GptModel& model, Communicator* dp, Communicator* embedding,
                           Communicator* fused_embedding, int stage, std::optional<bool> compress_dp)
    : model_(model),
      dp_(dp),
      embedding_(embedding),
      fused_embedding_(fused_embedding),
      dp_size_(cfg.parallel.dp),
      fused_(cfg.compression.fused_embedding),
      local_replica_(cfg.compression.diloco_on()) {
  Registry<GradReducer> registry;
  register_builtin_grad_reducers(registry);
  if (compress_dp) {
    compress_dp_ = *compress_dp;
  } else {
    if (cfg.compression.dp_stages == DpStages::automatic()) {
      throw std::invalid_argument("GradientSync: compression.dp_stages = auto needs the stage's choice");
    }
    compress_dp_ = stage_compresses_dp(cfg.compression.dp_stages, stage, cfg.parallel.pp, cfg.compression.dp.name != "none");
  }
  compress_dp_ = compress_dp_ && cfg.compression.dp.name != "none";
  dp_reducer_ = make_dp_reducer(cfg, compress_dp_);
  if (!compress_dp_ && !local_replica_) uncompressed_ = static_cast<NoneReducer*>(dp_reducer_.get());
  if (cfg.compression.embedding.name != "none") {
    embedding_reducer_ = registry.create(cfg.compression.embedding.name, cfg.compression.embedding.options);
    embedding_reducer_->set_traffic_class(Traffic::kEmbedding);
  }
  // The tensors each reducer gets, by name and shape: its state is checked against them on load.
  auto w = model_->word_embedding();
  std::vector<TensorSpec> dp_tensors, embedding_tensors;
  for (const auto& item : model_->named_parameters()) {
    all_names_.push_back(item.key());
    const bool is_word_embedding = w.defined() && item.value().is_same(w);
    if (is_word_embedding) embedding_tensors.push_back({item.key(), item.value().sizes().vec()});
    if (fused_ && is_word_embedding) continue;
    dp_names_.push_back(item.key());
    dp_tensors.push_back({item.key(), item.value().sizes().vec()});
  }
  dp_reducer_->set_tensors(std::move(dp_tensors));
  if (embedding_reducer_) embedding_reducer_->set_tensors(std::move(embedding_tensors));  // none: middle stage
}

double GradientSync::wire_overflow_limit() const {
  return uncompressed_ ? uncompressed_->wire_overflow_limit(dp_size_) : std::numeric_limits<double>::infinity();
}

bool GradientSync::reduce(const std::vector<torch::Tensor>& params, int64_t step, double loss_scale) {
  if (uncompressed_) uncompressed_->set_wire_scale(loss_scale);
  auto grads = ensure_grads(params);
  auto w = model_->word_embedding();
  torch::Tensor wgrad;
  std::vector<torch::Tensor> dp_grads;
  dp_grads.reserve(grads.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (fused_ && w.defined() && params[i].is_same(w)) {
      wgrad = grads[i];
      continue;
    }
    dp_grads.push_back(grads[i]);
  }
  bool finite = true;
  if (!local_replica_) {
    try {
      TimelineScope event(compress_dp_ ? EventKind::kCompress : EventKind::kDpReduce, Stream::kDataParallel);
      dp_reducer_->reduce(dp_grads, *dp_, step);  // in place: DP average (or its compressed estimate)
    } catch (const NonFiniteGradients&) {
      finite = false;
    }
  }
  auto reduce_embedding = [&](torch::Tensor& g, Communicator& group) {
    std::vector<torch::Tensor> one{g};
    TimelineScope event(EventKind::kCompress, Stream::kEmbedding);  // a compressing embedding reducer
    try {
      embedding_reducer_->reduce(one, group, step);  // the group's mean
    } catch (const NonFiniteGradients&) {
      finite = false;
    }
  };
  torch::NoGradGuard no_grad;
  if (fused_) {
    if (!fused_embedding_) return finite;  // middle stage: no word embedding
    TORCH_CHECK(wgrad.defined(), "FE on a stage without the word embedding");
    if (embedding_reducer_) {
      reduce_embedding(wgrad, *fused_embedding_);  // mean over the 2d (d when pp == 1) ranks
      if (fused_embedding_->size() == 2 * dp_size_) wgrad.mul_(2.0);
    } else {
      fused_embedding_->all_reduce(wgrad, Traffic::kEmbedding);  // Σ_j (g_first,j + g_last,j)
      wgrad.div_(static_cast<double>(dp_size_));
    }
    return finite;
  }
  if (!embedding_ || embedding_->size() == 1) return finite;
  if (embedding_reducer_) {
    torch::Tensor g = w.grad();
    reduce_embedding(g, *embedding_);  // mean of the pair
    g.mul_(2.0);
  } else {
    sync_tied_embedding_grad(model_, embedding_);
  }
  return finite;
}

std::vector<CheckpointPart> GradientSync::checkpoint_parts() {
  std::vector<CheckpointPart> parts;
  GradReducer* dp = dp_reducer_.get();
  parts.push_back({"dp_reducer", dp->name(), [dp](auto& a) { dp->save(a); }, [dp](auto& a) { dp->load(a); }});
  if (GradReducer* e = embedding_reducer_.get()) {
    parts.push_back({"embedding_reducer", e->name(), [e](auto& a) { e->save(a); }, [e](auto& a) { e->load(a); }});
  }
  return parts;
}

double sum_of_squares(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> sums;  // per tensor a 0-d double (exact: a widening of its own dtype's sum)
  for (const auto& g : grads) {
    if (g.defined()) sums.push_back(g.pow(2).sum().to(torch::kDouble));
  }
  if (sums.empty()) return 0.0;
  const auto host = torch::stack(sums).cpu();  // the one host sync
  const double* v = host.data_ptr<double>();
  double total = 0.0;
  for (int64_t i = 0; i < host.numel(); ++i) total += v[i];  // list order, as the loop it replaces
  return total;
}

double global_grad_norm(GptModel& model, Communicator* model_parallel, int tp_rank, int stages) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> counted;
  for (const auto& item : model->named_parameters()) {
    const auto& g = item.value().grad();
    if (!g.defined()) continue;
    if (is_tp_replicated_parameter(item.key()) && tp_rank != 0) continue;
    if (item.key() == "embedding.weight" && stages > 1 && !model->stage().is_first) continue;
    counted.push_back(g);
  }
  double sum_sq = sum_of_squares(counted);
  if (model_parallel && model_parallel->size() > 1) {
    auto t = torch::tensor({sum_sq}, torch::kDouble);
    model_parallel->all_reduce(t, Traffic::kControl);
    sum_sq = t.item<double>();
  }
  return std::sqrt(sum_sq);
}

void clip_grads_to(const std::vector<torch::Tensor>& params, double norm, double max_norm) {
  if (!(max_norm > 0 && norm > max_norm)) return;
  torch::NoGradGuard no_grad;
  const double scale = max_norm / (norm + 1e-6);
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (!grads.empty()) at::_foreach_mul_(grads, scale);
}

}  // namespace optcc

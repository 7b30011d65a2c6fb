#include "harness/grad_sync.h"

#include <cmath>

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

double global_grad_norm(GptModel& model, Communicator* model_parallel, int tp_rank, int stages) {
  torch::NoGradGuard no_grad;
  double sum_sq = 0.0;
  for (const auto& item : model->named_parameters()) {
    const auto& g = item.value().grad();
    if (!g.defined()) continue;
    if (is_tp_replicated_parameter(item.key()) && tp_rank != 0) continue;
    if (item.key() == "embedding.weight" && stages > 1 && !model->stage().is_first) continue;
    sum_sq += g.pow(2).sum().item<double>();
  }
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
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().mul_(scale);
  }
}

}  // namespace optcc

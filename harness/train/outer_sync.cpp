#include "harness/train/outer_sync.h"

#include <fmt/format.h>

#include <stdexcept>

#include "harness/parallel/timeline.h"
#include "models/sharding.h"

namespace optcc {

int64_t outer_sync_point(int64_t fragment, int64_t inner_steps, int64_t fragments) {
  return (fragment + 1) * inner_steps / fragments;
}

int64_t outer_last_landed_sync(int64_t fragment, int64_t step, int64_t inner_steps, int64_t fragments,
                               int64_t sync_delay) {
  const int64_t latest = step - sync_delay;  // a sync started after this step has landed by `step`
  if (latest < 1) return 0;
  const int64_t point = outer_sync_point(fragment, inner_steps, fragments) % inner_steps;  // 0: period end
  const int64_t s = latest - ((latest - point) % inner_steps + inner_steps) % inner_steps;
  return s >= 1 ? s : 0;
}

int64_t outer_fragment_of_layer(int64_t layer, int64_t num_layers, int64_t fragments) {
  return layer * fragments / num_layers;
}

OuterSync::OuterSync(const Config& cfg, GptModel& model, Communicator* dp, Communicator* embedding)
    : opt_(cfg.compression.diloco), model_(model), dp_(dp), embedding_(embedding) {
  const StageRange& stage = model_->stage();
  first_stage_ = stage.is_first;
  tied_copy_ = stage.is_last && !stage.is_first && embedding_ && embedding_->size() > 1;
  num_layers_ = cfg.model.num_layers;
  stage_ = stage;
  Registry<GradReducer> registry;
  register_builtin_grad_reducers(registry);
  fragments_.resize(static_cast<size_t>(opt_.fragments));
  for (auto& f : fragments_) {
    f.reducer = registry.create(opt_.outer.name, opt_.outer.options);
    f.reducer->set_traffic_class(Traffic::kOuter);
  }
  torch::NoGradGuard no_grad;
  const auto w = model_->word_embedding();
  std::vector<std::vector<TensorSpec>> specs(fragments_.size());
  for (const auto& item : model_->named_parameters()) {
    const size_t i = params_.size();
    names_.push_back(item.key());
    params_.push_back(item.value());
    backup_.push_back(item.value().detach().to(torch::kFloat).clone());
    momentum_.emplace_back();
    pending_.emplace_back();
    const bool is_word = w.defined() && item.value().is_same(w);
    if (is_word) word_embedding_ = static_cast<int64_t>(i);
    if (is_word && tied_copy_) continue;  // stage 0's copy takes the outer step (see the header)
    const int64_t f = fragment_of(item.key());
    fragments_[f].params.push_back(i);
    specs[f].push_back({item.key(), item.value().sizes().vec()});
  }
  for (size_t f = 0; f < fragments_.size(); ++f) {
    std::vector<std::string> names;
    for (const auto& s : specs[f]) names.push_back(s.name);
    fragments_[f].reducer->set_tensor_names(std::move(names));
    fragments_[f].reducer->set_tensors(std::move(specs[f]));
  }
}

int64_t outer_fragment_of(const std::string& name, const StageRange& stage, int64_t num_layers, int64_t fragments) {
  if (const auto layer = whole_model_layer(name, stage)) {
    return outer_fragment_of_layer(*layer, num_layers, fragments);
  }
  if (name.rfind("final_ln", 0) == 0) return fragments - 1;
  return 0;  // word and position embeddings
}

int64_t OuterSync::fragment_of(const std::string& name) const {
  return outer_fragment_of(name, stage_, num_layers_, opt_.fragments);
}

std::vector<std::string> OuterSync::fragment_names(int64_t f) const {
  std::vector<std::string> out;
  for (size_t i : fragments_.at(f).params) out.push_back(names_[i]);
  return out;
}

void OuterSync::after_step(int64_t step) {
  const int64_t H = opt_.inner_steps, F = opt_.fragments, tau = opt_.sync_delay;
  for (int64_t f = 0; f < F; ++f) {
    Fragment& frag = fragments_[f];
    if (frag.started_at >= 0 && frag.started_at + tau == step) apply(frag, f);
  }
  for (int64_t f = 0; f < F; ++f) {
    if (step % H != outer_sync_point(f, H, F) % H) continue;
    start(fragments_[f], f, step);
    if (tau == 0) apply(fragments_[f], f);
  }
}

// Outer gradient, its mean over the replicas, the outer SGD: the fragment's new global values, kept
// in pending_ until apply().
void OuterSync::start(Fragment& frag, int64_t index, int64_t step) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> deltas;
  deltas.reserve(frag.params.size());
  for (size_t i : frag.params) deltas.push_back(backup_[i] - params_[i].detach().to(torch::kFloat));
  if (!deltas.empty()) {
    TimelineScope event(EventKind::kDpReduce, Stream::kDataParallel);
    frag.reducer->reduce(deltas, *dp_, step);  // in place: the DP mean (or its compressed estimate)
  }
  const double mu = opt_.outer_momentum;
  for (size_t k = 0; k < frag.params.size(); ++k) {
    const size_t i = frag.params[k];
    torch::Tensor u = deltas[k];
    if (mu > 0) {
      if (!momentum_[i].defined()) momentum_[i] = torch::zeros_like(u);
      momentum_[i].mul_(mu).add_(u);
      u = opt_.nesterov ? u.add(momentum_[i], mu) : momentum_[i];
    }
    pending_[i] = backup_[i].sub(u, opt_.outer_lr);
  }
  frag.started_at = step;
  (void)index;
}

void OuterSync::apply(Fragment& frag, int64_t index) {
  torch::NoGradGuard no_grad;
  const double alpha = opt_.mix;
  const auto land = [&](size_t i) {
    backup_[i] = pending_[i];
    pending_[i] = torch::Tensor();
    auto p = params_[i].detach();
    if (alpha == 0.0) {
      p.copy_(backup_[i]);
    } else {
      p.copy_(p.to(torch::kFloat).mul(alpha).add(backup_[i], 1.0 - alpha));
    }
  };
  for (size_t i : frag.params) land(i);
  frag.started_at = -1;
  if (index == 0) sync_tied_copy();
}

// Fragment 0 landed: stage 0's word-embedding global value goes to the last stage's copy.
void OuterSync::sync_tied_copy() {
  if (!embedding_ || embedding_->size() < 2 || word_embedding_ < 0) return;
  const int root = first_stage_ ? embedding_->rank() : 1 - embedding_->rank();
  const size_t i = static_cast<size_t>(word_embedding_);
  torch::NoGradGuard no_grad;
  torch::Tensor global = first_stage_ ? backup_[i].clone() : torch::empty_like(backup_[i]);
  embedding_->broadcast(global, root, Traffic::kEmbedding);
  if (!tied_copy_) return;
  pending_[i] = global;
  backup_[i] = pending_[i];
  pending_[i] = torch::Tensor();
  auto p = params_[i].detach();
  if (opt_.mix == 0.0) {
    p.copy_(backup_[i]);
  } else {
    p.copy_(p.to(torch::kFloat).mul(opt_.mix).add(backup_[i], 1.0 - opt_.mix));
  }
}

OuterSync::GlobalWeights OuterSync::global_weights() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> local;
  local.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    local.push_back(params_[i].detach().clone());
    params_[i].detach().copy_(backup_[i]);
  }
  return GlobalWeights(params_, std::move(local));
}

OuterSync::GlobalWeights::~GlobalWeights() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].detach().copy_(local_[i]);
}

int64_t OuterSync::state_bytes() const {
  int64_t n = 0;
  const auto add = [&](const torch::Tensor& t) {
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  };
  for (size_t i = 0; i < params_.size(); ++i) add(backup_[i]), add(momentum_[i]), add(pending_[i]);
  for (const auto& f : fragments_) n += f.reducer->error_feedback_bytes() + f.reducer->factor_bytes();
  return n;
}

std::vector<CheckpointPart> OuterSync::checkpoint_parts() {
  const std::string identity =
      fmt::format("inner_steps={} fragments={} sync_delay={} outer={}", opt_.inner_steps, opt_.fragments,
                  opt_.sync_delay, to_yaml_value(opt_.outer));
  return {{"outer_sync", identity, [this](torch::serialize::OutputArchive& a) { save_state(a); },
           [this](torch::serialize::InputArchive& a) { load_state(a); }}};
}

void OuterSync::save_state(torch::serialize::OutputArchive& a) const {
  std::vector<int64_t> started;
  for (const auto& f : fragments_) started.push_back(f.started_at);
  a.write("started_at", torch::tensor(started, torch::kLong));
  for (size_t i = 0; i < params_.size(); ++i) {
    a.write("backup." + names_[i], backup_[i]);
    if (momentum_[i].defined()) a.write("momentum." + names_[i], momentum_[i]);
    if (pending_[i].defined()) a.write("pending." + names_[i], pending_[i]);
  }
  for (size_t f = 0; f < fragments_.size(); ++f) {
    torch::serialize::OutputArchive r;
    fragments_[f].reducer->save(r);
    a.write(fmt::format("reducer.{}", f), r);
  }
}

void OuterSync::load_state(torch::serialize::InputArchive& a) {
  torch::Tensor started;
  a.read("started_at", started);
  if (started.numel() != static_cast<int64_t>(fragments_.size())) {
    throw std::invalid_argument(fmt::format("outer_sync: the checkpoint has {} fragments, this run {} (diloco.fragments)",
                                            started.numel(), fragments_.size()));
  }
  const auto read_like = [&](const std::string& key, const torch::Tensor& like, bool required) {
    torch::Tensor t;
    if (!a.try_read(key, t)) {
      if (required) throw std::invalid_argument("outer_sync: the checkpoint has no " + key);
      return torch::Tensor();
    }
    if (t.sizes() != like.sizes()) {
      throw std::invalid_argument(fmt::format("outer_sync: {} has shape {} in the checkpoint, {} in this run", key,
                                              fmt::join(t.sizes(), "x"), fmt::join(like.sizes(), "x")));
    }
    return t.to(torch::kFloat).contiguous();
  };
  std::vector<torch::Tensor> backup(params_.size()), momentum(params_.size()), pending(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    backup[i] = read_like("backup." + names_[i], params_[i], true);
    momentum[i] = read_like("momentum." + names_[i], params_[i], false);
    pending[i] = read_like("pending." + names_[i], params_[i], false);
  }
  for (size_t f = 0; f < fragments_.size(); ++f) {
    torch::serialize::InputArchive r;
    a.read(fmt::format("reducer.{}", f), r);
    fragments_[f].reducer->load(r);
  }
  for (size_t f = 0; f < fragments_.size(); ++f) {  // a sync in flight needs its fragment's global values
    if (started[f].item<int64_t>() < 0) continue;
    for (size_t i : fragments_[f].params) {
      if (!pending[i].defined()) {
        throw std::invalid_argument(fmt::format("outer_sync: fragment {}'s sync started at step {} is in flight, and "
                                                "the checkpoint has no pending.{}", f, started[f].item<int64_t>(), names_[i]));
      }
    }
  }
  backup_ = std::move(backup), momentum_ = std::move(momentum), pending_ = std::move(pending);
  for (size_t f = 0; f < fragments_.size(); ++f) fragments_[f].started_at = started[f].item<int64_t>();
}

}  // namespace optcc

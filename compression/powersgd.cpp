#include "compression/powersgd.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>

#include "compression/orthogonalize.h"

namespace optcc {
namespace {

template <class T>
T option(const YAML::Node& options, const char* key, T fallback, const char* type) {
  if (!options || options.IsNull() || !options[key]) return fallback;
  try {
    return options[key].as<T>();
  } catch (const YAML::Exception&) {
    throw std::invalid_argument(fmt::format("powersgd: option '{}' must be {}, got '{}'", key, type,
                                            YAML::Dump(options[key])));
  }
}

}  // namespace

PowerSgdOptions PowerSgdOptions::from_yaml(const YAML::Node& o) {
  check_option_keys(o, "powersgd", {"rank", "min_compression_rate", "warmup_steps", "error_feedback",
                                    "ef_residual", "orthogonalize", "warm_start", "seed"});
  PowerSgdOptions p;
  p.rank = option<int64_t>(o, "rank", p.rank, "an integer");
  p.min_compression_rate = option<double>(o, "min_compression_rate", p.min_compression_rate, "a number");
  p.warmup_steps = option<int64_t>(o, "warmup_steps", p.warmup_steps, "an integer");
  p.error_feedback = option<bool>(o, "error_feedback", p.error_feedback, "a bool");
  p.ef_residual = option<std::string>(o, "ef_residual", p.ef_residual, "a string");
  p.orthogonalize = option<std::string>(o, "orthogonalize", p.orthogonalize, "a string");
  p.warm_start = option<bool>(o, "warm_start", p.warm_start, "a bool");
  p.seed = option<int64_t>(o, "seed", p.seed, "an integer");
  if (p.rank < 1) throw std::invalid_argument(fmt::format("powersgd: rank must be >= 1, got {}", p.rank));
  if (p.min_compression_rate < 0 || p.warmup_steps < 0) {
    throw std::invalid_argument(fmt::format("powersgd: min_compression_rate ({}) and warmup_steps ({}) must be >= 0",
                                            p.min_compression_rate, p.warmup_steps));
  }
  if (p.ef_residual != "averaged" && p.ef_residual != "local") {
    throw std::invalid_argument("powersgd: ef_residual must be 'averaged' or 'local', got '" + p.ef_residual + "'");
  }
  if (p.orthogonalize != "mgs" && p.orthogonalize != "qr") {
    throw std::invalid_argument("powersgd: orthogonalize must be 'mgs' or 'qr', got '" + p.orthogonalize + "'");
  }
  return p;
}

struct PowerSgdReducer::Plan {
  std::vector<size_t> raw;                  // tensor indices sent raw
  std::vector<size_t> low;                  // tensor indices compressed
  std::vector<int64_t> rows, cols, r;       // per entry of `low`
  int64_t p_numel = 0, q_numel = 0;         // Σ rows·r, Σ cols·r
};

PowerSgdReducer::PowerSgdReducer(PowerSgdOptions options)
    : opt_(std::move(options)), gen_(at::make_generator<at::CPUGeneratorImpl>(opt_.seed)) {}

std::string PowerSgdReducer::name() const {
  return fmt::format("powersgd(rank={}, min_compression_rate={}, warmup_steps={}, error_feedback={}, "
                     "ef_residual={}, orthogonalize={}, warm_start={}, seed={})",
                     opt_.rank, opt_.min_compression_rate, opt_.warmup_steps, opt_.error_feedback,
                     opt_.ef_residual, opt_.orthogonalize, opt_.warm_start, opt_.seed);
}

PowerSgdReducer::Plan PowerSgdReducer::plan(const std::vector<torch::Tensor>& grads) const {
  Plan p;
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto& g = grads[i];
    const int64_t rows = g.dim() >= 2 ? g.size(0) : 0;
    const int64_t cols = rows > 0 ? g.numel() / rows : 0;
    const int64_t r = std::min({opt_.rank, rows, cols});
    const bool worth = r > 0 && double(rows) * double(cols) / (double(rows + cols) * double(r)) >=
                                    opt_.min_compression_rate;
    if (!worth) {
      p.raw.push_back(i);
      continue;
    }
    p.low.push_back(i), p.rows.push_back(rows), p.cols.push_back(cols), p.r.push_back(r);
    p.p_numel += rows * r, p.q_numel += cols * r;
  }
  return p;
}

void PowerSgdReducer::ensure_state(size_t n) {
  if (ef_.size() < n) ef_.resize(n);
  if (q_.size() < n) q_.resize(n);
}

void PowerSgdReducer::set_q(size_t i, torch::Tensor q) {
  ensure_state(i + 1);
  q_[i] = q.to(torch::kFloat).contiguous().clone();
}

void PowerSgdReducer::orthogonalize(torch::Tensor& m) const {
  if (opt_.orthogonalize == "qr") {
    orthogonalize_qr_(m);
  } else {
    orthogonalize_mgs_(m);
  }
}

torch::Tensor PowerSgdReducer::prepare_q(size_t i, int64_t cols, int64_t r) {
  torch::Tensor q;
  if (q_[i].defined()) {
    TORCH_CHECK(q_[i].size(0) == cols && q_[i].size(1) == r, "powersgd: Q of tensor ", i, " has shape ",
                q_[i].sizes(), ", expected [", cols, ", ", r, "] (did the gradient list change?)");
    q = q_[i].clone();
  } else {
    q = torch::randn({cols, r}, gen_, torch::kFloat);  // randn locks the generator itself
  }
  orthogonalize(q);
  return q;
}

void PowerSgdReducer::reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) {
  torch::NoGradGuard no_grad;
  ensure_state(grads.size());
  if (step < opt_.warmup_steps) {  // 0. warm-up: the baseline, state untouched
    NoneReducer none;
    none.set_tensor_names(names_);
    none.reduce(grads, dp, step);
    records_ = none.records();
    return;
  }
  begin_records(grads);
  if (grads.empty()) return;
  // 1. Non-finite on any rank -> all ranks skip, before anything is modified (BR-01).
  auto bad = torch::zeros({1}, grads[0].options().dtype(torch::kFloat));
  for (const auto& g : grads) bad = torch::maximum(bad, torch::logical_not(torch::isfinite(g)).any().to(torch::kFloat).reshape({1}));
  dp.all_reduce(bad, Traffic::kControl, /*max=*/true);
  if (bad.item<float>() > 0) {
    throw NonFiniteGradients(fmt::format("powersgd: non-finite gradient on some rank of {} (step {}); "
                                         "gradients, error feedback and Q left untouched, skip this step",
                                         dp.name(), step));
  }
  // 2.–4. Classify, compensate, draw/reuse Q, P := M Q.
  const Plan p = plan(grads);
  const auto fopt = grads[0].options().dtype(torch::kFloat);
  auto p_all = torch::empty({p.p_numel}, fopt);  // [Σ rows·r] fp32
  auto q_all = torch::empty({p.q_numel}, fopt);  // [Σ cols·r] fp32
  std::vector<torch::Tensor> ms, ps, qs;         // per compressed tensor: [rows, cols], [rows, r], [cols, r]
  int64_t po = 0, qo = 0;
  for (size_t k = 0; k < p.low.size(); ++k) {
    const size_t i = p.low[k];
    auto m = grads[i].reshape({p.rows[k], p.cols[k]}).to(torch::kFloat, false, /*copy=*/true);
    if (opt_.error_feedback) {
      if (!ef_[i].defined()) ef_[i] = torch::zeros_like(m);
      m.add_(ef_[i]);
    }
    ps.push_back(p_all.narrow(0, po, p.rows[k] * p.r[k]).view({p.rows[k], p.r[k]}));
    qs.push_back(q_all.narrow(0, qo, p.cols[k] * p.r[k]).view({p.cols[k], p.r[k]}));
    po += p.rows[k] * p.r[k], qo += p.cols[k] * p.r[k];
    torch::matmul_out(ps[k], m, prepare_q(i, p.cols[k], p.r[k]).to(m.device()));
    ms.push_back(std::move(m));
  }
  // 5. One all-reduce (sum) for every P.
  if (p.p_numel > 0) dp.all_reduce(p_all, Traffic::kDataParallel);
  // 6. Raw tensors: one flat fp32 all-reduce, ÷ dp.
  if (!p.raw.empty()) {
    std::vector<torch::Tensor> raw;
    for (size_t i : p.raw) raw.push_back(grads[i]);
    auto buf = flatten_fp32(raw);  // [Σ numel] fp32
    dp.all_reduce(buf, Traffic::kDataParallel);
    buf.div_(dp.size());
    unflatten_into(buf, raw);
    for (size_t i : p.raw) records_[i].sent_bytes = grads[i].numel() * 4;
  }
  // 7. P̂ := orth(P); Q := Mᵀ P̂; (local EF); one all-reduce for every Q, ÷ dp; out := P̂ Qᵀ.
  for (size_t k = 0; k < p.low.size(); ++k) {
    orthogonalize(ps[k]);
    torch::matmul_out(qs[k], ms[k].t(), ps[k]);
    if (opt_.error_feedback && opt_.ef_residual == "local") ef_[p.low[k]] = ms[k] - torch::matmul(ps[k], qs[k].t());
  }
  if (p.q_numel > 0) {
    dp.all_reduce(q_all, Traffic::kDataParallel);
    q_all.div_(dp.size());
  }
  for (size_t k = 0; k < p.low.size(); ++k) {
    const size_t i = p.low[k];
    auto out = torch::matmul(ps[k], qs[k].t());  // [rows, cols] fp32 ≈ DP mean
    if (opt_.error_feedback && opt_.ef_residual == "averaged") ef_[i] = ms[k] - out;
    grads[i].copy_(out.view_as(grads[i]));
    q_[i] = opt_.warm_start ? qs[k].clone() : torch::Tensor();
    records_[i].compressed = true;
    records_[i].rank = p.r[k];
    records_[i].sent_bytes = (p.rows[k] + p.cols[k]) * p.r[k] * 4;
  }
}

void PowerSgdReducer::save(torch::serialize::OutputArchive& archive) const {
  archive.write("powersgd.rank", torch::tensor({opt_.rank, static_cast<int64_t>(q_.size())}));
  {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    archive.write("powersgd.generator", gen_.get_state());
  }
  for (size_t i = 0; i < q_.size(); ++i) {
    if (ef_[i].defined()) archive.write("powersgd.ef." + std::to_string(i), ef_[i]);
    if (q_[i].defined()) archive.write("powersgd.q." + std::to_string(i), q_[i]);
  }
}

void PowerSgdReducer::load(torch::serialize::InputArchive& archive) {
  torch::Tensor meta, gen_state;
  archive.read("powersgd.rank", meta);
  if (meta[0].item<int64_t>() != opt_.rank) {
    throw std::invalid_argument(fmt::format("powersgd: checkpoint was written with rank {}, this reducer has rank {}",
                                            meta[0].item<int64_t>(), opt_.rank));
  }
  archive.read("powersgd.generator", gen_state);
  {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(gen_state);
  }
  const auto n = static_cast<size_t>(meta[1].item<int64_t>());
  ef_.assign(n, torch::Tensor());
  q_.assign(n, torch::Tensor());
  for (size_t i = 0; i < n; ++i) {
    torch::Tensor t;
    if (archive.try_read("powersgd.ef." + std::to_string(i), t)) ef_[i] = t.clone();
    if (archive.try_read("powersgd.q." + std::to_string(i), t)) q_[i] = t.clone();
  }
}

}  // namespace optcc

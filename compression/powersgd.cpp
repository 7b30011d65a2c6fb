#include "compression/powersgd.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>

#include "compression/options.h"
#include "compression/orthogonalize.h"
#include "kernels/thin_gemm.h"

namespace optcc {
namespace {

template <class T>
T option(const YAML::Node& options, const char* key, T fallback, const char*) {
  return option_value<T>(options, "powersgd", key, fallback);  // strict: compression/options.h
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

struct PowerSgdReducer::Split {
  std::vector<size_t> raw;                  // tensor indices sent raw
  std::vector<size_t> low;                  // tensor indices compressed
  std::vector<int64_t> rows, cols, r;       // per entry of `low`
  int64_t p_numel = 0, q_numel = 0;         // Σ rows·r, Σ cols·r
};

PowerSgdReducer::PowerSgdReducer(PowerSgdOptions options)
    : opt_(std::move(options)),
      gen_(at::make_generator<at::CPUGeneratorImpl>(opt_.seed)),
      draws_(static_cast<uint64_t>(opt_.seed)) {}

std::string PowerSgdReducer::name() const {
  return fmt::format("powersgd(rank={}, min_compression_rate={}, warmup_steps={}, error_feedback={}, "
                     "ef_residual={}, orthogonalize={}, warm_start={}, seed={})",
                     opt_.rank, opt_.min_compression_rate, opt_.warmup_steps, opt_.error_feedback,
                     opt_.ef_residual, opt_.orthogonalize, opt_.warm_start, opt_.seed);
}

PowerSgdReducer::Split PowerSgdReducer::split(const std::vector<std::vector<int64_t>>& shapes, double min_rate) const {
  Split p;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& s = shapes[i];
    int64_t numel = 1;
    for (auto v : s) numel *= v;
    const int64_t rows = s.size() >= 2 ? s[0] : 0;
    const int64_t cols = rows > 0 ? numel / rows : 0;
    const int64_t r = std::min({opt_.rank, rows, cols});
    const bool worth = r > 0 && double(rows) * double(cols) / (double(rows + cols) * double(r)) >= min_rate;
    if (!worth) {
      p.raw.push_back(i);
      continue;
    }
    p.low.push_back(i), p.rows.push_back(rows), p.cols.push_back(cols), p.r.push_back(r);
    p.p_numel += rows * r, p.q_numel += cols * r;
  }
  return p;
}

ReducerPlan PowerSgdReducer::plan(const std::vector<std::vector<int64_t>>& shapes, const PlanContext& ctx) const {
  if (ctx.step < opt_.warmup_steps) return NoneReducer().plan(shapes, ctx);
  ReducerPlan plan;
  if (shapes.empty()) return plan;
  const Split p = split(shapes, ctx.compress_every_matrix ? 0.0 : opt_.min_compression_rate);
  int64_t raw_numel = 0;
  for (size_t i : p.raw) {
    int64_t n = 1;
    for (auto v : shapes[i]) n *= v;
    raw_numel += n;
  }
  double gemm = 0, orth = 0, low_numel = 0;
  for (size_t k = 0; k < p.low.size(); ++k) {
    const double rows = double(p.rows[k]), cols = double(p.cols[k]), r = double(p.r[k]);
    gemm += 2.0 * rows * cols * r;
    orth += 2.0 * rows * r * r;
    low_numel += rows * cols;
    if (opt_.error_feedback) plan.error_feedback_bytes += p.rows[k] * p.cols[k] * 4;
    if (opt_.warm_start) plan.factor_bytes += p.cols[k] * p.r[k] * 4;
  }
  const double ef = opt_.error_feedback ? 3.0 * 4.0 * low_numel : 0.0;  // read grad and EF, write M
  const int64_t beta = ctx.element_bytes > 0 ? ctx.element_bytes : 4;   // fp32 as reduce() sends them
  auto& st = plan.steps;
  st.push_back(arithmetic_step("powersgd", gemm, ef + 4.0 * low_numel, "M = grad + EF, P = MQ"));
  if (p.p_numel > 0) st.push_back(collective_step(CollectiveKind::kAllReduce, beta * p.p_numel, "P all-reduce"));
  if (!p.raw.empty()) st.push_back(collective_step(CollectiveKind::kAllReduce, beta * raw_numel, "raw all-reduce"));
  st.push_back(arithmetic_step("powersgd", orth + gemm, 4.0 * low_numel, "orthogonalise P, Q = MᵀP"));
  if (p.q_numel > 0) st.push_back(collective_step(CollectiveKind::kAllReduce, beta * p.q_numel, "Q all-reduce"));
  st.push_back(arithmetic_step("powersgd", gemm, ef + 4.0 * low_numel, "out = PQᵀ, EF update"));
  return plan;
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
    q = q_[i].clone();
  } else {
    q = torch::randn({cols, r}, gen_, torch::kFloat);  // randn locks the generator itself
  }
  orthogonalize(q);
  // A zero column (tensor i was zero or of rank < r last time) would never revive: refill it. Q is
  // the same on every DP rank (all-reduced), so every rank draws the same.
  refill_zero_columns_(q, gen_, [this](torch::Tensor& t) { orthogonalize(t); });
  return q;
}

void PowerSgdReducer::check_q_shapes(const Split& p) const {
  for (size_t k = 0; k < p.low.size(); ++k) {
    const size_t i = p.low[k];
    if (!q_[i].defined()) continue;
    TORCH_CHECK(q_[i].size(0) == p.cols[k] && q_[i].size(1) == p.r[k], "powersgd: Q of tensor ", i, " has shape ",
                q_[i].sizes(), ", expected [", p.cols[k], ", ", p.r[k], "] (did the gradient list change?)");
  }
}

// Where the passes over M go (per compressed tensor, fp32 gradient, EF on, averaged residual):
//   EF_i += grad_i                  EF_i now holds M_i (no separate M buffer, nothing allocated)
//   P_i := M_i Q_i                  GEMM into the packed P buffer
//   Q_i := M_iᵀ P̂_i                GEMM into the packed Q buffer
//   grad_i := P̂_i Q_iᵀ             GEMM straight into the gradient
//   EF_i −= grad_i                  EF_i = M_i − out_i
// Local residual: EF_i −= P̂_i Q_i,localᵀ (one GEMM with beta = 1) right after Q_i. EF off: M_i is
// the gradient itself (fp32) or one fp32 copy of it. Non-fp32 gradients go through fp32 copies.
// EF_i holds M_i between the first and the last pass: a collective that throws in between (a dead
// peer, which ends the run) leaves EF_i = M_i, not the old residual.
namespace {

// 1. Non-finite on any rank -> all ranks skip, before anything is modified (BR-01). fp32/fp64:
// one read of each gradient (its min and max are NaN if any entry is NaN, ±inf if any is ±inf);
// 16-bit (no aminmax kernel on CPU): isfinite. No host sync before the all-reduce.
void check_finite(const std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) {
  std::vector<torch::Tensor> finite;  // per non-empty gradient, a 0-d bool
  for (const auto& g : grads) {
    if (g.numel() == 0) continue;
    if (g.scalar_type() == torch::kFloat || g.scalar_type() == torch::kDouble) {
      auto [lo, hi] = at::aminmax(g);
      finite.push_back(torch::logical_and(torch::isfinite(lo), torch::isfinite(hi)));
    } else {
      finite.push_back(torch::isfinite(g).all());
    }
  }
  auto bad = finite.empty() ? torch::zeros({1}, grads[0].options().dtype(torch::kFloat))
                            : torch::logical_not(torch::stack(finite).all()).to(torch::kFloat).reshape({1});
  dp.all_reduce(bad, Traffic::kControl, /*max=*/true);
  if (bad.item<float>() > 0) {
    throw NonFiniteGradients(fmt::format("powersgd: non-finite gradient on some rank of {} (step {}); "
                                         "gradients, error feedback and Q left untouched, skip this step",
                                         dp.name(), step));
  }
}

}  // namespace

struct PowerSgdReducer::Factors {
  torch::Tensor p_all, q_all;             // [Σ rows·r], [Σ cols·r] fp32
  std::vector<torch::Tensor> ms, ps, qs;  // per compressed tensor: [rows, cols], [rows, r], [cols, r]
};

// 2.–4. Compensate (EF), draw/reuse Q, P := M Q into the packed P buffer.
void PowerSgdReducer::compute_p(const Split& p, std::vector<torch::Tensor>& grads, Factors& f) {
  auto& ms = f.ms;
  auto& ps = f.ps;
  auto& qs = f.qs;
  int64_t po = 0, qo = 0;
  for (size_t k = 0; k < p.low.size(); ++k) {
    const size_t i = p.low[k];
    const auto g = grads[i].reshape({p.rows[k], p.cols[k]});
    torch::Tensor m;
    if (opt_.error_feedback) {
      if (!ef_[i].defined()) {
        ef_[i] = g.to(torch::kFloat, false, /*copy=*/true).contiguous();  // M = grad + 0
      } else {
        ef_[i].add_(g);
      }
      m = ef_[i];
    } else {
      m = g.scalar_type() == torch::kFloat && g.is_contiguous() ? g : g.to(torch::kFloat, false, true).contiguous();
    }
    ps.push_back(f.p_all.narrow(0, po, p.rows[k] * p.r[k]).view({p.rows[k], p.r[k]}));
    qs.push_back(f.q_all.narrow(0, qo, p.cols[k] * p.r[k]).view({p.cols[k], p.r[k]}));
    po += p.rows[k] * p.r[k], qo += p.cols[k] * p.r[k];
    thin_mm_f32_out(ps[k], m, prepare_q(i, p.cols[k], p.r[k]).to(m.device()));
    ms.push_back(std::move(m));
  }
}

// 6. Raw tensors: one flat fp32 all-reduce, ÷ dp.
void PowerSgdReducer::reduce_raw(const Split& p, std::vector<torch::Tensor>& grads, Communicator& dp) {
  std::vector<torch::Tensor> raw;
  for (size_t i : p.raw) raw.push_back(grads[i]);
  auto buf = flatten_fp32(raw);  // [Σ numel] fp32
  dp.all_reduce(buf, traffic_class());
  buf.div_(dp.size());
  unflatten_into(buf, raw);
  for (size_t i : p.raw) records_[i].sent_bytes = grads[i].numel() * 4;
}

// 7. P̂ := orth(P); Q := Mᵀ P̂; (local EF); one all-reduce for every Q, ÷ dp; out := P̂ Qᵀ.
void PowerSgdReducer::finish_low_rank(const Split& p, std::vector<torch::Tensor>& grads, Communicator& dp, Factors& f) {
  const auto fopt = grads[0].options().dtype(torch::kFloat);
  auto& ms = f.ms;
  auto& ps = f.ps;
  auto& qs = f.qs;
  auto& q_all = f.q_all;
  for (size_t k = 0; k < p.low.size(); ++k) {
    orthogonalize(ps[k]);
    thin_mm_f32_out(qs[k], ms[k].t(), ps[k]);
    if (opt_.error_feedback && opt_.ef_residual == "local") {
      thin_mm_f32_out(ef_[p.low[k]], ps[k], qs[k].t(), -1.0f, 1.0f);  // EF = M − P̂ Q_localᵀ, in place
    }
  }
  if (p.q_numel > 0) {
    dp.all_reduce(q_all, traffic_class());
    q_all.div_(dp.size());
  }
  for (size_t k = 0; k < p.low.size(); ++k) {
    const size_t i = p.low[k];
    const bool direct = grads[i].scalar_type() == torch::kFloat && grads[i].is_contiguous();
    auto out = direct ? grads[i].view({p.rows[k], p.cols[k]})   // written in place
                      : torch::empty({p.rows[k], p.cols[k]}, fopt);  // [rows, cols] fp32 ≈ DP mean
    thin_mm_f32_out(out, ps[k], qs[k].t());
    if (opt_.error_feedback && opt_.ef_residual == "averaged") ef_[i].sub_(out);  // EF = M − out
    if (!direct) grads[i].copy_(out.view_as(grads[i]));
    q_[i] = opt_.warm_start ? qs[k].clone() : torch::Tensor();
    records_[i].compressed = true;
    records_[i].rank = p.r[k];
    records_[i].sent_bytes = (p.rows[k] + p.cols[k]) * p.r[k] * 4;
  }
}

// --- the batched path (non-CPU devices; see powersgd.h) ---------------------------------------------

struct PowerSgdReducer::Group {
  std::vector<size_t> ks;  // entries of Split::low, in order
  int64_t rows = 0, cols = 0, r = 0;
};

std::vector<PowerSgdReducer::Group> PowerSgdReducer::groups(const Split& p) const {
  std::vector<Group> out;
  for (size_t k = 0; k < p.low.size(); ++k) {
    auto it = std::find_if(out.begin(), out.end(), [&](const Group& g) { return g.rows == p.rows[k] && g.cols == p.cols[k]; });
    if (it == out.end()) {
      out.push_back(Group{{}, p.rows[k], p.cols[k], p.r[k]});
      it = std::prev(out.end());
    }
    it->ks.push_back(k);
  }
  return out;
}

// M of a group as one tensor [B, rows, cols] fp32. EF on: the group's residual buffer, which M
// = grad + EF is added into in place (the residuals ef_[i] are its slices); rebuilt, with one copy,
// when it does not exist yet or its slices are not the residuals any more (first call, a load, a
// move to another device). EF off: a stacked fp32 copy of the gradients.
torch::Tensor PowerSgdReducer::batch_m(const Split& p, const Group& g, std::vector<torch::Tensor>& grads) {
  const auto grad = [&](size_t b) { return grads[p.low[g.ks[b]]].reshape({g.rows, g.cols}); };
  const size_t n = g.ks.size();
  std::vector<torch::Tensor> ms;
  if (!opt_.error_feedback) {
    for (size_t b = 0; b < n; ++b) ms.push_back(grad(b).to(torch::kFloat));
    return torch::stack(ms);
  }
  const auto& first = ef_[p.low[g.ks[0]]];
  torch::Tensor base;
  if (first.defined() && first.is_view()) base = torch::Tensor(first._base());
  bool slices = base.defined() && base.dim() == 3 && base.size(0) == static_cast<int64_t>(n) &&
                base.size(1) == g.rows && base.size(2) == g.cols && base.scalar_type() == torch::kFloat;
  for (size_t b = 0; slices && b < n; ++b) {
    const auto& e = ef_[p.low[g.ks[b]]];
    slices = e.defined() && e.is_view() && e._base().is_same(base) &&
             e.data_ptr<float>() == base.data_ptr<float>() + static_cast<int64_t>(b) * g.rows * g.cols;
  }
  if (slices) {
    for (size_t b = 0; b < n; ++b) ef_[p.low[g.ks[b]]].add_(grad(b));
    return base;
  }
  for (size_t b = 0; b < n; ++b) {
    const auto& e = ef_[p.low[g.ks[b]]];
    ms.push_back(e.defined() ? e.view({g.rows, g.cols}) + grad(b) : grad(b).to(torch::kFloat));
  }
  base = torch::stack(ms);  // [B, rows, cols]
  for (size_t b = 0; b < n; ++b) ef_[p.low[g.ks[b]]] = base.select(0, static_cast<int64_t>(b));
  return base;
}

// Steps 3-8 with one batched operation per group and step (powersgd.h). P and Q are packed group
// after group (each group's factors one [B, rows, r] and one [B, cols, r] block).
void PowerSgdReducer::reduce_batched(const Split& p, std::vector<torch::Tensor>& grads, Communicator& dp) {
  const auto fopt = grads[0].options().dtype(torch::kFloat);
  const auto gs = groups(p);
  auto p_all = torch::empty({p.p_numel}, fopt);  // [Σ rows·r] fp32
  auto q_all = torch::empty({p.q_numel}, fopt);  // [Σ cols·r] fp32
  std::vector<torch::Tensor> ms, ps, qs;         // per group: [B, rows, cols], [B, rows, r], [B, cols, r]
  int64_t po = 0, qo = 0;
  for (const auto& g : gs) {
    const int64_t n = static_cast<int64_t>(g.ks.size());
    ps.push_back(p_all.narrow(0, po, n * g.rows * g.r).view({n, g.rows, g.r}));
    qs.push_back(q_all.narrow(0, qo, n * g.cols * g.r).view({n, g.cols, g.r}));
    po += n * g.rows * g.r, qo += n * g.cols * g.r;
    ms.push_back(batch_m(p, g, grads));
    std::vector<torch::Tensor> q0;  // warm start; a tensor without one starts from zeros, drawn below
    for (size_t k : g.ks) {
      const auto& q = q_[p.low[k]];
      q0.push_back(q.defined() ? q : torch::zeros({g.cols, g.r}, fopt));
    }
    auto q = torch::stack(q0);  // [B, cols, r]
    prepare_q_batched_(q, draws_);
    lowrank_encode_p(ms.back(), q, ps.back());
  }
  if (p.p_numel > 0) dp.all_reduce(p_all, traffic_class());
  if (!p.raw.empty()) reduce_raw(p, grads, dp);
  for (size_t j = 0; j < gs.size(); ++j) {
    lowrank_encode_q(ms[j], ps[j], qs[j]);
    if (opt_.error_feedback && opt_.ef_residual == "local") {
      ms[j].baddbmm_(ps[j], qs[j].transpose(1, 2), 1.0, -1.0);  // EF = M − P̂ Q_localᵀ, in place
    }
  }
  if (p.q_numel > 0) {
    dp.all_reduce(q_all, traffic_class());
    q_all.div_(dp.size());
  }
  for (size_t j = 0; j < gs.size(); ++j) {
    const auto& g = gs[j];
    const auto out = torch::bmm(ps[j], qs[j].transpose(1, 2));  // [B, rows, cols] ≈ DP mean
    if (opt_.error_feedback && opt_.ef_residual == "averaged") ms[j].sub_(out);  // EF = M − out
    for (size_t b = 0; b < g.ks.size(); ++b) {
      const size_t i = p.low[g.ks[b]];
      grads[i].copy_(out.select(0, static_cast<int64_t>(b)).view_as(grads[i]));
      q_[i] = opt_.warm_start ? qs[j].select(0, static_cast<int64_t>(b)).clone() : torch::Tensor();
      records_[i].compressed = true;
      records_[i].rank = g.r;
      records_[i].sent_bytes = (g.rows + g.cols) * g.r * 4;
    }
  }
}

void PowerSgdReducer::reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) {
  torch::NoGradGuard no_grad;
  bind_tensors(grads);  // the same list as the state's, before anything changes
  ensure_state(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {  // state read from a checkpoint is on the host (checkpoint.h)
    if (ef_[i].defined() && ef_[i].device() != grads[i].device()) ef_[i] = ef_[i].to(grads[i].device());
    if (q_[i].defined() && q_[i].device() != grads[i].device()) q_[i] = q_[i].to(grads[i].device());
  }
  if (step < opt_.warmup_steps) {  // 0. warm-up: the baseline, state untouched
    NoneReducer none;
    none.set_tensor_names(names_);
    none.reduce(grads, dp, step);
    records_ = none.records();
    return;
  }
  begin_records(grads);
  if (grads.empty()) return;
  check_finite(grads, dp, step);
  // 2.–4. Classify, compensate, draw/reuse Q, P := M Q.
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& g : grads) shapes.push_back(g.sizes().vec());
  const Split p = split(shapes, opt_.min_compression_rate);
  check_q_shapes(p);  // before any state changes
  if (!grads[0].is_cpu() || batched_on_cpu_) {
    reduce_batched(p, grads, dp);
    return;
  }
  const auto fopt = grads[0].options().dtype(torch::kFloat);
  Factors f;
  f.p_all = torch::empty({p.p_numel}, fopt);  // [Σ rows·r] fp32
  f.q_all = torch::empty({p.q_numel}, fopt);  // [Σ cols·r] fp32
  compute_p(p, grads, f);
  // 5. One all-reduce (sum) for every P.
  if (p.p_numel > 0) dp.all_reduce(f.p_all, traffic_class());
  if (!p.raw.empty()) reduce_raw(p, grads, dp);
  finish_low_rank(p, grads, dp, f);
}

void PowerSgdReducer::save(torch::serialize::OutputArchive& archive) const {
  archive.write("powersgd.rank", torch::tensor({opt_.rank, static_cast<int64_t>(q_.size())}));
  {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    archive.write("powersgd.generator", gen_.get_state());
  }
  draws_.save(archive, "powersgd.draws");
  save_tensors(archive, "powersgd.tensors");
  for (size_t i = 0; i < q_.size(); ++i) {
    // A slice of the batched path's group buffer is written alone (a view would carry the buffer).
    if (ef_[i].defined()) archive.write("powersgd.ef." + std::to_string(i), ef_[i].is_view() ? ef_[i].clone() : ef_[i]);
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
  const auto n = static_cast<size_t>(meta[1].item<int64_t>());
  load_tensors(archive, "powersgd.tensors", /*has_state=*/n > 0);  // before any state changes
  archive.read("powersgd.generator", gen_state);
  {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(gen_state);
  }
  if (!draws_.load(archive, "powersgd.draws")) draws_ = CounterNormal(static_cast<uint64_t>(opt_.seed));
  ef_.assign(n, torch::Tensor());
  q_.assign(n, torch::Tensor());
  for (size_t i = 0; i < n; ++i) {
    torch::Tensor t;
    if (archive.try_read("powersgd.ef." + std::to_string(i), t)) ef_[i] = t.clone();
    if (archive.try_read("powersgd.q." + std::to_string(i), t)) q_[i] = t.clone();
  }
}

}  // namespace optcc

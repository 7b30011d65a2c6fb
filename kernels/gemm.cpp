#include "kernels/gemm.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <cstring>
#include <stdexcept>
#include <utility>

#ifdef OPTCC_HAVE_DNNL
#include <dnnl.h>
#endif

namespace optcc {
namespace {

bool forced_aten() {
  static const bool forced = [] {
    const char* env = std::getenv("OPTCC_GEMM");
    return env != nullptr && std::strcmp(env, "aten") == 0;
  }();
  return forced;
}

/// Row-major description of a 2-D operand [r, c]: 'N' with ld = stride(0), or 'T' (it is the
/// transpose of a row-major [c, r]) with ld = stride(1); 0 when neither fits.
char layout(const torch::Tensor& t, int64_t& ld) {
  const int64_t r = t.size(0), c = t.size(1);
  if (t.stride(1) == 1 && t.stride(0) >= std::max<int64_t>(1, c)) {
    ld = t.stride(0);
    return 'N';
  }
  if (t.stride(0) == 1 && t.stride(1) >= std::max<int64_t>(1, r)) {
    ld = t.stride(1);
    return 'T';
  }
  return 0;
}

void aten_mm(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, float alpha, float beta) {
  if (alpha == 1.0f && beta == 0.0f) {
    at::mm_out(out, a, b);
  } else {
    out.addmm_(a, b, beta, alpha);
  }
}

#ifdef OPTCC_HAVE_DNNL
constexpr int64_t kThin = 64;  // columns of b up to which a transposed a is computed as Cᵀ = bᵀ·aᵀ

// oneDNN's row-major sgemm on CPU operands (any layout; copies what has no unit stride). False when
// oneDNN refused the call (then nothing was written).
bool dnnl_mm(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, float alpha, float beta) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  int64_t lda = 0, ldb = 0, ldc = 0;
  const torch::Tensor ac = layout(a, lda) ? a : a.contiguous();
  const torch::Tensor bc = layout(b, ldb) ? b : b.contiguous();
  const char ta = layout(ac, lda), tb = layout(bc, ldb);
  if (ta == 'T' && n <= kThin && beta == 0.0f) {
    // A transposed a times a thin b (Q = Mᵀ·P̂ of the low-rank compressors): oneDNN streams the
    // row-major M 1.5-3x faster as Cᵀ = bᵀ·aᵀ (M untransposed) than as 'T'·'N'. Cᵀ [n, m] is
    // small and is copied back transposed.
    auto ct = torch::empty({n, m}, out.options());
    const dnnl_status_t status = dnnl_sgemm(tb == 'N' ? 'T' : 'N', 'N', n, m, k, alpha, bc.data_ptr<float>(), ldb,
                                            ac.data_ptr<float>(), lda, 0.0f, ct.data_ptr<float>(), m);
    if (status != dnnl_success) return false;
    out.copy_(ct.t());
    return true;
  }
  const bool direct = layout(out, ldc) == 'N';
  torch::Tensor c = direct ? out : (beta == 0.0f ? torch::empty({m, n}, out.options()) : out.contiguous());
  if (!direct) ldc = n;
  const dnnl_status_t status = dnnl_sgemm(ta, tb, m, n, k, alpha, ac.data_ptr<float>(), lda, bc.data_ptr<float>(),
                                          ldb, beta, c.data_ptr<float>(), ldc);
  if (status != dnnl_success) return false;
  if (!direct) out.copy_(c);
  return true;
}
#endif

// The store of this thread's WeightGradDeferral, or null.
thread_local DeferredWeightGrads* deferral_store = nullptr;

bool fp32_cpu(const torch::Tensor& t) { return t.is_cpu() && t.scalar_type() == torch::kFloat; }

// out = a·b through mm_f32_out for fp32 CPU operands, else ATen (other dtypes, GPUs).
torch::Tensor mm_any(const torch::Tensor& a, const torch::Tensor& b, const torch::TensorOptions& options) {
  if (!(fp32_cpu(a) && fp32_cpu(b))) return a.mm(b);
  auto out = torch::empty({a.size(0), b.size(1)}, options);
  mm_f32_out(out, a, b);
  return out;
}

// y = x·wᵀ (+ b) and its gradients through mm_f32_out (fp32 CPU; ATen otherwise, which only a
// deferring forward sends here); x2 [rows, in] is x flattened. Without a bias, b is an empty
// placeholder (LibTorch 1.13's Function::apply cannot take undefined inputs). A forward made under a
// WeightGradDeferral keeps its store, and its backward records the weight and bias gradients there.
struct GemmLinear : torch::autograd::Function<GemmLinear> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x2, const torch::Tensor& w,
                               const torch::Tensor& b) {
    ctx->save_for_backward({x2, w, b});
    const bool has_bias = b.numel() > 0;
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["deferral"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(deferral_store));
    if (!(fp32_cpu(x2) && fp32_cpu(w))) return has_bias ? torch::addmm(b, x2, w.t()) : x2.mm(w.t());
    auto y = torch::empty({x2.size(0), w.size(0)}, x2.options());  // [rows, out]
    if (has_bias) y.copy_(b.unsqueeze(0).expand_as(y));
    mm_f32_out(y, x2, w.t(), 1.0f, has_bias ? 1.0f : 0.0f);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x2 = saved[0];
    const auto& w = saved[1];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const torch::Tensor g = grads[0].contiguous();  // [rows, out]
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = mm_any(g, w, x2.options());  // [rows, out] x [out, in]
    auto* store = reinterpret_cast<DeferredWeightGrads*>(static_cast<intptr_t>(ctx->saved_data["deferral"].toInt()));
    if (store != nullptr && (ctx->needs_input_grad(1) || (has_bias && ctx->needs_input_grad(2)))) {
      store->record({x2, g, w, has_bias ? saved[2] : torch::Tensor()});  // W computes them later
      return {dx, dw, db};
    }
    if (ctx->needs_input_grad(1)) dw = mm_any(g.t(), x2, w.options());  // [out, rows] x [rows, in]
    if (has_bias && ctx->needs_input_grad(2)) db = g.sum(0);
    return {dx, dw, db};
  }
};

// Adds `grad` to t's gradient: into .grad of a leaf, through autograd otherwise (a cast of the leaf).
void accumulate_into(const torch::Tensor& t, const torch::Tensor& grad) {
  if (!t.requires_grad()) return;
  if (t.is_leaf()) {
    torch::Tensor& g = t.mutable_grad();
    g = g.defined() ? g + grad : grad;
    return;
  }
  torch::autograd::backward({t}, {grad});
}

#ifdef OPTCC_HAVE_DNNL
// layout() of the last two dimensions of an N-D tensor.
char layout_last2(const torch::Tensor& t, int64_t& ld) {
  const int64_t r = t.size(-2), c = t.size(-1), sr = t.stride(-2), sc = t.stride(-1);
  if (sc == 1 && sr >= std::max<int64_t>(1, c)) {
    ld = sr;
    return 'N';
  }
  if (sr == 1 && sc >= std::max<int64_t>(1, r)) {
    ld = sc;
    return 'T';
  }
  return 0;
}

// batched_mm straight on the data pointers, one dnnl_sgemm per matrix: no tensor per matrix (the
// select() views cost more than the attention's small GEMMs). False when a layout does not fit
// (nothing written) or oneDNN refused a matrix (earlier ones written; the caller recomputes all).
bool dnnl_batched_mm(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b) {
  if (!gemm_uses_onednn() || !a.is_cpu() || !b.is_cpu() || !out.is_cpu()) return false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  const char ta = layout_last2(a, lda), tb = layout_last2(b, ldb);
  if (ta == 0 || tb == 0 || layout_last2(out, ldc) != 'N') return false;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1), dims = a.dim() - 2;
  int64_t count = 1;
  for (int64_t d = 0; d < dims; ++d) count *= a.size(d);
  const float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  float* pc = out.data_ptr<float>();
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, oa = 0, ob = 0, oc = 0;
    for (int64_t d = dims - 1; d >= 0; --d) {
      const int64_t idx = rest % a.size(d);
      rest /= a.size(d);
      oa += idx * a.stride(d), ob += idx * b.stride(d), oc += idx * out.stride(d);
    }
    if (dnnl_sgemm(ta, tb, m, n, k, 1.0f, pa + oa, lda, pb + ob, ldb, 0.0f, pc + oc, ldc) != dnnl_success) return false;
  }
  return true;
}
#endif

// out[i] = a[i]·b[i] for every matrix i of the leading dimensions (one GEMM each: on the data
// pointers through oneDNN, else on select() views through mm_f32_out).
void batched_mm(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b) {
#ifdef OPTCC_HAVE_DNNL
  if (a.numel() > 0 && b.numel() > 0 && out.numel() > 0 && dnnl_batched_mm(out, a, b)) return;
#endif
  const int64_t batch_dims = a.dim() - 2;
  int64_t n = 1;
  for (int64_t d = 0; d < batch_dims; ++d) n *= a.size(d);
  std::vector<int64_t> idx(static_cast<size_t>(batch_dims), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i;
    for (int64_t d = batch_dims - 1; d >= 0; --d) idx[d] = rest % a.size(d), rest /= a.size(d);
    torch::Tensor ai = a, bi = b, oi = out;
    for (int64_t d = 0; d < batch_dims; ++d) ai = ai.select(0, idx[d]), bi = bi.select(0, idx[d]), oi = oi.select(0, idx[d]);
    mm_f32_out(oi, ai, bi);
  }
}

// c = a·b over batch dimensions and its gradients (da = g·bᵀ, db = aᵀ·g) through batched_mm.
struct GemmBmm : torch::autograd::Function<GemmBmm> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b) {
    ctx->save_for_backward({a, b});
    std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end());
    shape.back() = b.size(-1);
    auto c = torch::empty(shape, a.options());
    batched_mm(c, a, b);
    return c;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& a = saved[0];
    const auto& b = saved[1];
    const torch::Tensor& g = grads[0];
    torch::Tensor da, db;
    if (ctx->needs_input_grad(0)) {
      da = torch::empty(a.sizes(), a.options());
      batched_mm(da, g, b.transpose(-2, -1));
    }
    if (ctx->needs_input_grad(1)) {
      db = torch::empty(b.sizes(), b.options());
      batched_mm(db, a.transpose(-2, -1), g);
    }
    return {da, db};
  }
};

}  // namespace

static void check_mm(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && a.size(1) == b.size(0) &&
                  out.size(0) == a.size(0) && out.size(1) == b.size(1),
              "mm_f32_out: shapes ", a.sizes(), " x ", b.sizes(), " -> ", out.sizes());
  TORCH_CHECK(a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat &&
                  out.scalar_type() == torch::kFloat,
              "mm_f32_out: needs fp32 tensors");
}

std::string gemm_library_name(GemmLibrary lib) {
#ifdef OPTCC_HAVE_DNNL
  if (lib == GemmLibrary::kOneDnn) {
    const dnnl_version_t* v = dnnl_version();
    return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
  }
#endif
  return lib == GemmLibrary::kOneDnn ? "oneDNN (not in this build)" : "ATen at::mm (LibTorch's BLAS)";
}

std::vector<GemmLibrary> gemm_libraries() {
#ifdef OPTCC_HAVE_DNNL
  return {GemmLibrary::kAten, GemmLibrary::kOneDnn};
#else
  return {GemmLibrary::kAten};
#endif
}

void mm_f32_out_with(GemmLibrary lib, torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, float alpha,
                     float beta) {
  check_mm(out, a, b);
  torch::NoGradGuard no_grad;
  if (lib == GemmLibrary::kAten) return aten_mm(out, a, b, alpha, beta);
#ifdef OPTCC_HAVE_DNNL
  if (a.is_cpu() && b.is_cpu() && out.is_cpu() && dnnl_mm(out, a, b, alpha, beta)) return;
#endif
  throw std::invalid_argument("mm_f32_out_with: " + gemm_library_name(lib) + " cannot run this GEMM");
}

bool gemm_uses_onednn() {
#ifdef OPTCC_HAVE_DNNL
  return !forced_aten();
#else
  return false;
#endif
}

std::string cpu_bf16_instructions() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    bool avx512 = false, amx = false;
    for (std::string w; words >> w;) avx512 |= w == "avx512_bf16", amx |= w == "amx_bf16";
    if (!avx512 && !amx) return "none";
    return amx ? (avx512 ? "AVX512-BF16 + AMX-BF16" : "AMX-BF16") : "AVX512-BF16";
  }
  return "none";
}

std::string compute_gemm_library(c10::ScalarType compute) {
  if (compute == c10::ScalarType::Float) return gemm_library();
  if (compute != c10::ScalarType::BFloat16 || !at::hasMKLDNN()) return "ATen";
  const std::string isa = cpu_bf16_instructions();
  return fmt::format("ATen (LibTorch's oneDNN bf16 matmul, {})",
                     isa == "none" ? "no bf16 instructions: computed in fp32 inside" : isa);
}

std::string gemm_library() {
  if (gemm_uses_onednn()) return gemm_library_name(GemmLibrary::kOneDnn);
  return gemm_library_name(GemmLibrary::kAten) + (forced_aten() ? " (OPTCC_GEMM=aten)" : "");
}

void mm_f32_out(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, float alpha, float beta) {
  check_mm(out, a, b);
  torch::NoGradGuard no_grad;
#ifdef OPTCC_HAVE_DNNL
  const bool cpu = a.is_cpu() && b.is_cpu() && out.is_cpu();
  if (cpu && gemm_uses_onednn() && a.numel() > 0 && b.numel() > 0 && out.numel() > 0 &&
      dnnl_mm(out, a, b, alpha, beta)) {
    return;
  }
#endif
  aten_mm(out, a, b, alpha, beta);
}

void DeferredWeightGrads::record(Item item) {
  std::lock_guard<std::mutex> lock(mu_);
  items_.push_back(std::move(item));
}

std::vector<DeferredWeightGrads::Item> DeferredWeightGrads::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(items_, {});
}

int64_t DeferredWeightGrads::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const Item& i : items_) n += i.x.nbytes() + i.dy.nbytes();
  return n;
}

void DeferredWeightGrads::run(const std::vector<Item>& items) {
  for (const Item& i : items) {
    torch::Tensor dw, db;
    {
      torch::NoGradGuard no_grad;
      dw = mm_any(i.dy.t(), i.x, i.w.options());  // [out, rows] x [rows, in]
      if (i.b.defined()) db = i.dy.sum(0);
    }
    accumulate_into(i.w, dw);
    if (i.b.defined()) accumulate_into(i.b, db);
  }
}

WeightGradDeferral::WeightGradDeferral(DeferredWeightGrads& store) {
  TORCH_CHECK(deferral_store == nullptr, "WeightGradDeferral: one is already alive on this thread");
  deferral_store = &store;
}

WeightGradDeferral::~WeightGradDeferral() { deferral_store = nullptr; }

WeightGradDeferralPause::WeightGradDeferralPause() : paused_(std::exchange(deferral_store, nullptr)) {}

WeightGradDeferralPause::~WeightGradDeferralPause() { deferral_store = paused_; }

torch::Tensor gemm_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const bool fast = gemm_uses_onednn() && x.is_cpu() && w.is_cpu() && x.scalar_type() == torch::kFloat &&
                    w.scalar_type() == torch::kFloat && (!b.defined() || b.scalar_type() == torch::kFloat) &&
                    x.dim() >= 1 && w.dim() == 2 && x.numel() > 0;
  const bool deferring = deferral_store != nullptr && x.dim() >= 1 && w.dim() == 2 && x.numel() > 0 &&
                         torch::GradMode::is_enabled();
  if (!fast && !deferring) return torch::nn::functional::linear(x, w, b);
  TORCH_CHECK(x.size(-1) == w.size(1), "gemm_linear: x [.., ", x.size(-1), "] does not match w ", w.sizes());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  const torch::Tensor bias = b.defined() ? b : torch::empty({0}, w.options());
  return GemmLinear::apply(x.reshape({-1, x.size(-1)}), w, bias).view(shape);
}

}  // namespace optcc

namespace optcc {

torch::Tensor gemm_bmm(const torch::Tensor& a, const torch::Tensor& b) {
  const bool fast = gemm_uses_onednn() && a.is_cpu() && b.is_cpu() && a.scalar_type() == torch::kFloat &&
                    b.scalar_type() == torch::kFloat && a.dim() >= 3 && a.dim() == b.dim() &&
                    a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2) && a.numel() > 0 &&
                    b.numel() > 0;
  if (!fast) return torch::matmul(a, b);
  TORCH_CHECK(a.size(-1) == b.size(-2), "gemm_bmm: a ", a.sizes(), " x b ", b.sizes());
  return GemmBmm::apply(a, b);
}

}  // namespace optcc

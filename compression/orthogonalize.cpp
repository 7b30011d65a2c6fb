#include "compression/orthogonalize.h"


#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

namespace optcc {
namespace {

// The hot loops below are compiled once per x86-64 level and picked at load time (ifunc), since
// the library itself is built for the baseline ISA. Dot products accumulate exact products in
// double (no rounding depends on the clone); the fp32 update y −= c·x is one FMA on v3 and v4, so
// results agree bit for bit on x86-64-v3 and newer (the baseline clone rounds the product first).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define OPTCC_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OPTCC_SIMD_CLONES
#endif

constexpr int kLanes = 16;

/// Σ a[i]·b[i] over n floats, in double, as kLanes interleaved partial sums added in a fixed order.
/// (Fixed-size inner loops: GCC -O2 vectorises those, not loops with a run-time trip count.)
OPTCC_SIMD_CLONES double dot_f64(const float* __restrict a, const float* __restrict b, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += static_cast<double>(a[i + l]) * static_cast<double>(b[i + l]);
  }
  for (int l = 0; i < n; ++i, ++l) acc[l] += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  for (int w = kLanes / 2; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0];
}

/// y[i] −= c·x[i] in fp32 (one FMA on x86-64-v3 and newer).
OPTCC_SIMD_CLONES void sub_scaled(float* __restrict y, const float* __restrict x, float c, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) y[i + l] -= c * x[i + l];
  }
  for (; i < n; ++i) y[i] -= c * x[i];
}

OPTCC_SIMD_CLONES void divide(float* __restrict y, float d, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) y[i + l] /= d;
  }
  for (; i < n; ++i) y[i] /= d;
}

// Column j keeps its own direction only if enough of it is left once the finished columns are
// projected out (see orthogonalize.h). n0 = its norm before any projection, n1 after MGS's pass.
constexpr double kReorthogonalize = 0.70710678118654752;  // n1 ≤ n0/√2: project out again (DGKS)
constexpr double kCollapsed = kDependentColumnFraction;  // ≤ this·n0 left after both passes: dependent

/// Second pass of column j against the finished columns k < j (unit or zero): returns its norm.
double reorthogonalize(float* w, int64_t rows, int64_t ld, int64_t j, const std::vector<char>& skip) {
  float* col = w + j * ld;
  for (int64_t k = 0; k < j; ++k) {
    if (skip[k]) continue;
    const float* done = w + k * ld;
    sub_scaled(col, done, static_cast<float>(dot_f64(done, col, rows)), rows);
  }
  return std::sqrt(dot_f64(col, col, rows));
}

/// MGS on w: `cols` columns of `rows` floats, column k at w + k·ld (column-major). The first pass
/// is the reference's right-looking MGS; `removed` collects Σc² of the coefficients projected out
/// of each later column, so n0² = n1² + removed (Pythagoras) needs no extra pass over the data.
void mgs_colmajor(float* w, int64_t rows, int64_t cols, int64_t ld, float eps) {
  thread_local std::vector<double> removed;
  thread_local std::vector<char> skip;  // zero (or NaN) columns: nothing to project out
  removed.assign(static_cast<size_t>(cols), 0.0);
  skip.assign(static_cast<size_t>(cols), 0);
  for (int64_t j = 0; j < cols; ++j) {
    float* col = w + j * ld;
    double n = std::sqrt(dot_f64(col, col, rows));
    if (!(n > 0)) {  // zero (or NaN) norm: column left as is, nothing projected out
      skip[j] = 1;
      continue;
    }
    const double n0 = std::sqrt(n * n + removed[j]);
    if (n <= kReorthogonalize * n0 && n > kCollapsed * n0) {
      const double n1 = n;
      n = reorthogonalize(w, rows, ld, j, skip);
      if (n <= kReorthogonalize * n1) n = 0;  // lost as much again: in the span (Kahan–Parlett)
    }
    if (n <= kCollapsed * n0) {
      std::fill(col, col + rows, 0.0f);
      skip[j] = 1;
      continue;
    }
    const float norm = static_cast<float>(n);
    divide(col, norm + eps, rows);
    for (int64_t k = j + 1; k < cols; ++k) {
      float* other = w + k * ld;
      const double c = dot_f64(col, other, rows);
      removed[k] += c * c;
      sub_scaled(other, col, static_cast<float>(c), rows);
    }
  }
}

void mgs_cpu(torch::Tensor& m, double eps) {
  auto c = m.contiguous();  // [rows, cols] row-major
  const int64_t rows = c.size(0), cols = c.size(1);
  if (rows == 0 || cols == 0) return;
  // Column-major copy. The column stride is padded off multiples of 4 KiB: with rows·4 bytes a
  // multiple of 4 KiB, the columns of one row would all fall into the same L1 set.
  const int64_t ld = (rows + kLanes - 1) / kLanes * kLanes + kLanes;
  thread_local std::vector<float> work;
  work.resize(static_cast<size_t>(ld * cols));
  float* w = work.data();
  float* p = c.data_ptr<float>();
  for (int64_t i0 = 0; i0 < rows; i0 += kLanes) {  // blocks of kLanes rows
    const int64_t n = std::min<int64_t>(kLanes, rows - i0);
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t i = i0; i < i0 + n; ++i) w[j * ld + i] = p[i * cols + j];
    }
  }
  mgs_colmajor(w, rows, cols, ld, static_cast<float>(eps));
  for (int64_t i0 = 0; i0 < rows; i0 += kLanes) {
    const int64_t n = std::min<int64_t>(kLanes, rows - i0);
    for (int64_t i = i0; i < i0 + n; ++i) {
      for (int64_t j = 0; j < cols; ++j) p[i * cols + j] = w[j * ld + i];
    }
  }
  if (!c.is_same(m)) m.copy_(c);
}

void mgs_tensor_ops(torch::Tensor& m, double eps) {
  const int64_t cols = m.size(1);
  auto removed = torch::zeros({cols}, m.options());  // Σc² projected out of each column (pass 1)
  for (int64_t j = 0; j < cols; ++j) {
    auto col = m.select(1, j);  // [rows] view
    auto n = col.norm();        // 0-d, no host sync (every decision below is a torch::where)
    const auto n0 = (n.square() + removed[j]).sqrt();
    auto dependent = torch::zeros_like(n, torch::kBool);
    if (j > 0) {  // second pass against the finished columns (unit or zero), used where n ≤ n0/√2
      const auto done = m.narrow(1, 0, j);                       // [rows, j]
      const auto again = col - done.mv(done.t().mv(col));       // [rows]
      const auto redo = torch::logical_and(n <= kReorthogonalize * n0, n > kCollapsed * n0);
      const auto n2 = again.norm();
      dependent = torch::logical_and(redo, n2 <= kReorthogonalize * n);
      col.copy_(torch::where(redo, again, col));
      n = torch::where(redo, n2, n);
    }
    const auto keep = torch::logical_and(n > kCollapsed * n0, torch::logical_not(dependent));
    // Kept: divided by (n + eps). Dropped or zero: divided by 1, then times 0 (NaN stays NaN).
    col.div_(torch::where(keep, n + eps, torch::ones_like(n)));
    col.mul_(torch::logical_or(keep, torch::isnan(n)).to(col.scalar_type()));
    if (j + 1 < cols) {
      auto rest = m.narrow(1, j + 1, cols - j - 1);  // [rows, cols-j-1]
      const auto c = torch::matmul(col, rest);       // [cols-j-1] projections on col
      removed.narrow(0, j + 1, cols - j - 1).add_(c.square());
      rest.sub_(col.unsqueeze(1) * c.unsqueeze(0));  // remove projection on col
    }
  }
}

}  // namespace

void orthogonalize_mgs_(torch::Tensor& m, double eps) {
  TORCH_CHECK(m.dim() == 2 && m.scalar_type() == torch::kFloat, "orthogonalize_mgs_: needs a 2-D fp32 tensor");
  torch::NoGradGuard no_grad;
  if (m.is_cpu()) {
    mgs_cpu(m, eps);
  } else {
    mgs_tensor_ops(m, eps);
  }
}

void orthogonalize_mgs_tensor_ops_(torch::Tensor& m, double eps) {
  TORCH_CHECK(m.dim() == 2 && m.scalar_type() == torch::kFloat, "orthogonalize_mgs_: needs a 2-D fp32 tensor");
  torch::NoGradGuard no_grad;
  mgs_tensor_ops(m, eps);
}

void orthogonalize_qr_(torch::Tensor& m) {
  TORCH_CHECK(m.dim() == 2 && m.scalar_type() == torch::kFloat, "orthogonalize_qr_: needs a 2-D fp32 tensor");
  torch::NoGradGuard no_grad;
  auto [q, r] = torch::linalg_qr(m, "reduced");  // q [rows, k], r [k, cols], k = min(rows, cols)
  auto out = torch::zeros_like(m);
  const int64_t k = q.size(1);
  // |R_jj| is the norm of column j once columns < j are projected out: drop it where it is at most
  // kCollapsed of the column's own norm, as MGS does (numerically dependent; 0 when exactly so).
  const auto col_norms = m.narrow(1, 0, k).norm(2, {0});  // [k]
  auto keep = (r.diagonal().abs() > kCollapsed * col_norms).to(torch::kFloat);  // [k]
  out.narrow(1, 0, k).copy_(q * keep.unsqueeze(0));
  m.copy_(out);
}

int64_t refill_zero_columns_(torch::Tensor& q, at::Generator& gen, const std::function<void(torch::Tensor&)>& orth) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == torch::kFloat, "refill_zero_columns_: needs a 2-D fp32 tensor");
  torch::NoGradGuard no_grad;
  torch::Tensor idx;  // [z] int64, the zero columns
  if (q.is_cpu() && q.is_contiguous()) {  // a scan that usually stops after the first row
    const int64_t rows = q.size(0), cols = q.size(1);
    const float* p = q.data_ptr<float>();
    thread_local std::vector<char> nonzero;
    nonzero.assign(static_cast<size_t>(cols), 0);
    int64_t left = cols;  // columns without a non-zero entry so far
    for (int64_t i = 0; i < rows && left > 0; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        if (!nonzero[j] && p[i * cols + j] != 0.0f) nonzero[j] = 1, --left;
      }
    }
    if (left == 0) return 0;
    std::vector<int64_t> zero;
    for (int64_t j = 0; j < cols; ++j) {
      if (!nonzero[j]) zero.push_back(j);
    }
    if (zero.empty()) return 0;
    idx = torch::tensor(zero, torch::kLong);
  } else {
    idx = (q.abs().amax(0) == 0).cpu().nonzero().view({-1});  // the one host sync
  }
  const int64_t z = idx.numel();
  if (z == 0) return 0;
  const auto fresh = torch::randn({q.size(0), z}, gen, torch::kFloat).to(q.device());  // [rows, z]
  q.index_copy_(1, idx.to(q.device()), fresh);
  orth(q);
  return z;
}

}  // namespace optcc

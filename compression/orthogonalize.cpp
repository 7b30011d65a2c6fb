#include "compression/orthogonalize.h"

namespace optcc {

void orthogonalize_mgs_(torch::Tensor& m, double eps) {
  TORCH_CHECK(m.dim() == 2 && m.scalar_type() == torch::kFloat, "orthogonalize_mgs_: needs a 2-D fp32 tensor");
  torch::NoGradGuard no_grad;
  const int64_t cols = m.size(1);
  for (int64_t j = 0; j < cols; ++j) {
    auto col = m.select(1, j);  // [rows] view
    auto norm = col.norm();  // 0-d, no host sync
    // A zero column is divided by 1 and stays exactly zero (no 0/0 even with eps = 0).
    col.div_(torch::where(norm > 0, norm + eps, torch::ones_like(norm)));
    if (j + 1 < cols) {
      auto rest = m.narrow(1, j + 1, cols - j - 1);                  // [rows, cols-j-1]
      rest.sub_(col.unsqueeze(1) * torch::matmul(col, rest).unsqueeze(0));  // remove projection on col
    }
  }
}

void orthogonalize_qr_(torch::Tensor& m) {
  TORCH_CHECK(m.dim() == 2 && m.scalar_type() == torch::kFloat, "orthogonalize_qr_: needs a 2-D fp32 tensor");
  torch::NoGradGuard no_grad;
  auto [q, r] = torch::linalg_qr(m, "reduced");  // q [rows, k], r [k, cols], k = min(rows, cols)
  auto out = torch::zeros_like(m);
  const int64_t k = q.size(1);
  auto keep = (r.diagonal().abs() > 0).to(torch::kFloat);  // [k] zero-norm directions -> 0
  out.narrow(1, 0, k).copy_(q * keep.unsqueeze(0));
  m.copy_(out);
}

}  // namespace optcc

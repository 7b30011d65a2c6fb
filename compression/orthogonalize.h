// Column orthonormalisation of the PowerSGD factors (spec §6.2, §7 "MGS with the 1e-8 guard").
#pragma once

#include <torch/torch.h>

namespace optcc {

/// Modified Gram–Schmidt, in place, column by column, on m [rows, cols] fp32 (rows ≥ cols not
/// required). Column j is divided by (‖m_j‖ + eps) after the projections onto columns < j are
/// removed. A column of norm 0 stays exactly 0 (it is left alone, so no NaN even with eps = 0),
/// and later columns then project onto it trivially. Like the reference, a column that depends
/// on earlier ones (rank(m) < cols) is normalised from its rounding residue and is then not
/// orthogonal to them (loss of orthogonality); use QR when that matters.
void orthogonalize_mgs_(torch::Tensor& m, double eps = 1e-8);

/// Householder QR: returns Q [rows, cols] (reduced). Columns whose R diagonal is 0 (to 0 exactly)
/// are zeroed, so rank-deficient inputs keep zero columns like MGS. Same shape contract as MGS.
void orthogonalize_qr_(torch::Tensor& m);

}  // namespace optcc

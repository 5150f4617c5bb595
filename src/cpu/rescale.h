// Norms of rows whose sum of squares overflows fp32: the in-kernel L2 norm of q and k
// (stages/loader.h), the output norm (norm_leaf.h) and the bench's recurrent baseline share it.
//
// A row's sum of squares overflows once its largest magnitude passes about 1.8e19 / sqrt(n), and
// 1 / sqrt(sum + eps) then normalises the row to 0. Such a row is first multiplied by the power of
// two s that brings its largest magnitude into [0.5, 4), exactly (powers of two scale without
// rounding), and x s / sqrt(sum (x s)^2 + eps s^2) is the same normalised row, with
// 1 / sqrt(sum x^2 + eps) = s / sqrt(...). eps s^2 may underflow: it is then 40 orders of
// magnitude below the sum. Rows that do not overflow keep the plain form, with no extra pass;
// squares below fp32's range lose nothing, eps > 0 outweighing them by 30 orders of magnitude. A
// row with an infinity is left to the plain form, which makes it NaN.
//
// Internal linkage and builtins only: each target's unit compiles its own copy with its flags.
#pragma once

#include <cfloat>

namespace flat::cpu {
namespace {

// With sum = sum_of_squares(x, n) already taken: when it overflowed, scales x in place, retakes
// sum, scales eps by s^2 and returns s; otherwise returns 1 and changes nothing.
template <class SumOfSquares>
float rescale_overflowed_row(float* x, int n, float& sum, float& eps, SumOfSquares&& sum_of_squares) {
  if (!(sum > FLT_MAX)) return 1.0f;
  float largest = 0.0f;
  for (int c = 0; c < n; ++c) largest = __builtin_fmaxf(largest, __builtin_fabsf(x[c]));
  if (!(largest <= FLT_MAX)) return 1.0f;
  int e;
  __builtin_frexpf(largest, &e);
  const float s = __builtin_ldexpf(1.0f, -(e < 126 ? e : 126));  // 2^-127 is subnormal: 0 to denormals-are-zero
  for (int c = 0; c < n; ++c) x[c] *= s;
  sum = sum_of_squares(x, n);
  eps = eps * s * s;
  return s;
}

}  // namespace
}  // namespace flat::cpu

// The chunk stages' small vector primitives in portable C++: transpose, exp, dot. Contracts:
//   transpose_f32__generic(rows, cols, src, lds, dst, ldd)  dst[c, r] = src[r, c]
//   exp_f32__generic(x, n)                                   x[i] = exp(x[i]) within an ulp (the
//                                                            portable exp_f32 of vector_math__generic.h,
//                                                            vectorised): 0 below -87.34 (never
//                                                            subnormal), +inf above 88.72, NaN stays NaN
//   dot_f32__generic(a, b, n)                                sum_c a[c] b[c]
#pragma once

#include <cstddef>

#include "cpu/kernels/vector_math__generic.h"

namespace flat::cpu {
namespace {

inline void transpose_f32__generic(int rows, int cols, const float* src, int lds, float* dst, int ldd) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[size_t(c) * ldd + r] = src[size_t(r) * lds + c];
}

inline void exp_f32__generic(float* x, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) x[i] = exp_f32(x[i]);
}

inline float dot_f32__generic(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

}  // namespace
}  // namespace flat::cpu

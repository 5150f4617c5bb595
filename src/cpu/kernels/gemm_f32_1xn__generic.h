// C[m, n] (+)= A[m, k] B[k, n] in portable C++, one row of C at a time: the inner loop runs along
// contiguous rows of B and C, which the compiler vectorises for the baseline target.
// A by rows or columns (d.a); B row-major with leading dimension ldb. Zero regions of A per
// d.triangle are skipped; for c_lower only C(i, j <= i) is written.
#pragma once

#include <cstddef>
#include <cstring>

#include "cpu/kernels/product.h"

namespace flat::cpu {
namespace {

inline void gemm_f32_1xn__generic(const GemmDesc& d, int m, int n, int k, const float* a, int lda, const float* b,
                                  int ldb, float* c, int ldc) {
  const auto [a_rs, a_cs] = a_strides(d, lda);
  const Triangle tri = d.triangle;
  for (int i = 0; i < m; ++i) {
    float* ci = c + size_t(i) * ldc;
    const int n_end = tri == Triangle::c_lower ? (i + 1 < n ? i + 1 : n) : n;
    const int p_begin = tri == Triangle::a_upper ? (i < k ? i : k) : 0;
    const int p_end = tri == Triangle::a_lower ? (i + 1 < k ? i + 1 : k) : k;
    if (!d.accumulate) std::memset(ci, 0, sizeof(float) * size_t(n_end));
    for (int p = p_begin; p < p_end; ++p) {
      const float ap = a[size_t(i) * a_rs + size_t(p) * a_cs];
      const float* bp = b + size_t(p) * ldb;
      for (int j = 0; j < n_end; ++j) ci[j] += ap * bp[j];
    }
  }
}

}  // namespace
}  // namespace flat::cpu

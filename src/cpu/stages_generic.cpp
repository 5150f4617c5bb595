// The chunk stages for any CPU: portable C++ that the compiler vectorises for the baseline target.
#include <math.h>

#include <cstring>

#include "cpu/rows.h"
#include "cpu/stages.h"

#define FLAT_ISA generic

namespace flat::cpu::generic {
namespace {

// C[m, n] (+)= A B with A(i, p) = a[i*a_rs + p*a_cs] and B row-major [k, n]: one row of C at a
// time, the inner loop along contiguous rows of B and C. Zero regions of A per `tri` are skipped.
void matmul(int m, int n, int k, const float* a, int a_rs, int a_cs, const float* b, int ldb, float* c, int ldc,
            bool accumulate, Triangle tri) {
  for (int i = 0; i < m; ++i) {
    float* ci = c + size_t(i) * ldc;
    const int n_end = tri == Triangle::c_lower ? (i + 1 < n ? i + 1 : n) : n;
    const int p_begin = tri == Triangle::a_upper ? (i < k ? i : k) : 0;
    const int p_end = tri == Triangle::a_lower ? (i + 1 < k ? i + 1 : k) : k;
    if (!accumulate) std::memset(ci, 0, sizeof(float) * size_t(n_end));
    for (int p = p_begin; p < p_end; ++p) {
      const float ap = a[size_t(i) * a_rs + size_t(p) * a_cs];
      const float* bp = b + size_t(p) * ldb;
      for (int j = 0; j < n_end; ++j) ci[j] += ap * bp[j];
    }
  }
}

void exp_inplace(float* x, int n) {
  for (int i = 0; i < n; ++i) x[i] = expf(x[i]);
}

}  // namespace
}  // namespace flat::cpu::generic

#include "cpu/stages.inc"

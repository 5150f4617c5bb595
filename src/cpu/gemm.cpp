#include "cpu/gemm.h"

#include <cstring>
#include <vector>

namespace flat::cpu {
namespace {

// Leaf: one row of C from a strided column of A and the rows of B. The inner loop runs along the
// contiguous row of B and C so the compiler vectorises it at whatever width the target has.
// a_step is the distance between consecutive A elements along k.
void gemm_f32_1xN__generic(int n, int k, const float* a, int a_step, const float* b, int ldb,
                           float* c) {
  for (int p = 0; p < k; ++p) {
    const float ap = a[p * a_step];
    const float* bp = b + p * ldb;
    for (int j = 0; j < n; ++j) c[j] += ap * bp[j];
  }
}

void clear_rows(int m, int n, float* c, int ldc) {
  for (int i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(float) * size_t(n));
}

}  // namespace

void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate) {
  if (!accumulate) clear_rows(m, n, c, ldc);
  for (int i = 0; i < m; ++i) gemm_f32_1xN__generic(n, k, a + i * lda, 1, b, ldb, c + i * ldc);
}

void gemm_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate) {
  if (!accumulate) clear_rows(m, n, c, ldc);
  for (int i = 0; i < m; ++i) gemm_f32_1xN__generic(n, k, a + i, lda, b, ldb, c + i * ldc);
}

void gemm_nt(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate) {
  // Pack B^T once as [k, n] so the leaf streams contiguous rows.
  thread_local std::vector<float> packed;
  packed.resize(size_t(k) * size_t(n));
  for (int j = 0; j < n; ++j)
    for (int p = 0; p < k; ++p) packed[size_t(p) * n + j] = b[j * ldb + p];
  gemm_nn(m, n, k, a, lda, packed.data(), n, c, ldc, accumulate);
}

}  // namespace flat::cpu

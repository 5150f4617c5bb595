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

// A product whose operands are all bf16 values. On CPUs with bf16 dot-product units that is a
// product they compute exactly (to fp32 accumulation); here the same as any other.
constexpr auto& matmul_bf16_values = matmul;

// dst[c, r] = src[r, c] for r < rows, c < cols.
void transpose(int rows, int cols, const float* src, int lds, float* dst, int ldd) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[size_t(c) * ldd + r] = src[size_t(r) * lds + c];
}

void exp_inplace(float* x, int n) {
  for (int i = 0; i < n; ++i) x[i] = expf(x[i]);
}

float dot(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// A diagonal block of n tokens with per-channel decays a [n, K] (rows of q, k, a with stride K):
//   A[i, j] = sum_c q[i, c] k[j, c] F_ij[c],  F_ij = prod_{j<s<=i} a[s]   for j <= i < n,
// the pairwise factors formed exactly as running products. f: [K] scratch.
void diagonal_scores(int n, int K, const float* q, const float* k, const float* a, float* A, int lda, float* f) {
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < K; ++c) f[c] = 1.0f;
    for (int j = i; j >= 0; --j) {
      float s = 0.f;
      for (int c = 0; c < K; ++c) {
        s += q[size_t(i) * K + c] * f[c] * k[size_t(j) * K + c];
        f[c] *= a[size_t(j) * K + c];
      }
      A[size_t(i) * lda + j] = s;
    }
  }
}

// The adjoint of diagonal_scores off the diagonal: for j < i < n,
//   dq[i] += dA[i, j] F_ij * k[j],   dk[j] += dA[i, j] F_ij * q[i].
void diagonal_gradients(int n, int K, const float* q, const float* k, const float* a, const float* dA, int lda,
                        float* dq, float* dk, float* f) {
  for (int i = 1; i < n; ++i) {
    for (int c = 0; c < K; ++c) f[c] = 1.0f;
    for (int j = i - 1; j >= 0; --j) {
      const float w = dA[size_t(i) * lda + j];
      for (int c = 0; c < K; ++c) {
        f[c] *= a[size_t(j + 1) * K + c];
        const float wf = w * f[c];
        dq[size_t(i) * K + c] += wf * k[size_t(j) * K + c];
        dk[size_t(j) * K + c] += wf * q[size_t(i) * K + c];
      }
    }
  }
}

}  // namespace
}  // namespace flat::cpu::generic

#include "cpu/stages.inc"

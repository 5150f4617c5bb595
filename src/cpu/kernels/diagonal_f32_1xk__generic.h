// The exact pairwise factors of a diagonal block under per-channel decay, in portable C++, one
// query and one key at a time.
//
// A block of n tokens (n <= 16) with decays a [n, K] (rows of q, k, a with stride K):
//   diagonal_scores:    A[i, j] = sum_c q[i, c] k[j, c] F_ij[c],  F_ij = prod_{j<s<=i} a[s],  j <= i < n
//   diagonal_gradients: for j < i < n, dq[i] += dA[i, j] F_ij * k[j], dk[j] += dA[i, j] F_ij * q[i]
// with the factors formed exactly, as running products (the scores' as q_i * F_ij). f: [K] scratch.
#pragma once

#include <cstddef>

namespace flat::cpu {
namespace {

inline void diagonal_scores_f32_1xk__generic(int n, int K, const float* q, const float* k, const float* a, float* A,
                                              int lda, float* f) {
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < K; ++c) f[c] = q[size_t(i) * K + c];  // q_i * F_ij, from j = i down
    for (int j = i; j >= 0; --j) {
      float s = 0.f;
      for (int c = 0; c < K; ++c) {
        s += f[c] * k[size_t(j) * K + c];
        f[c] *= a[size_t(j) * K + c];
      }
      A[size_t(i) * lda + j] = s;
    }
  }
}

inline void diagonal_gradients_f32_1xk__generic(int n, int K, const float* q, const float* k, const float* a,
                                                 const float* dA, int lda, float* dq, float* dk, float* f) {
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
}  // namespace flat::cpu

// The exact pairwise factors of a diagonal block under per-channel decay on AVX-512 (contracts in
// diagonal_f32_1xk__generic.h).
#pragma once

#include <immintrin.h>

#include <cstddef>

#include "cpu/kernels/lanes__avx512.h"

namespace flat::cpu {
namespace {

// Channels run 16 to a vector. For a query i,
// g = q_i * F_ij walks down the keys j in registers (NV vectors: K <= 16 * NV): one FMA into the
// score and one multiply by a_j per vector and key, no loads but k_j's and a_j's. The scores stay
// unreduced, one vector per key, for a group of kKeys keys (as many as the registers left beside
// g hold), and are summed together by sum_lanes into one row segment.
template <int NV>
void diagonal_scores_in_registers(int n, int K, const float* q, const float* k, const float* a, float* A, int lda) {
  constexpr int kKeys = NV <= 8 ? 16 : 8;
  const Lanes lanes(K);
  for (int i = 0; i < n; ++i) {
    __m512 g[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) g[v] = _mm512_maskz_loadu_ps(lanes.mask(v), q + size_t(i) * K + 16 * v);
    for (int base = i / kKeys * kKeys; base >= 0; base -= kKeys) {
      __m512 score[kKeys];
#pragma GCC unroll 16
      for (int t = kKeys - 1; t >= 0; --t) {
        score[t] = _mm512_setzero_ps();
        const int j = base + t;
        if (j > i) continue;
        const float *kj = k + size_t(j) * K, *aj = a + size_t(j) * K;
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) {
          score[t] = _mm512_fmadd_ps(g[v], _mm512_maskz_loadu_ps(lanes.mask(v), kj + 16 * v), score[t]);
          g[v] = _mm512_mul_ps(g[v], _mm512_maskz_loadu_ps(lanes.mask(v), aj + 16 * v));
        }
      }
      const int count = i - base + 1 < kKeys ? i - base + 1 : kKeys;
      _mm512_mask_storeu_ps(A + size_t(i) * lda + base, first_lanes(count), sum_lanes<kKeys>(score));
    }
  }
}

inline void diagonal_scores_f32_16xk__avx512(int n, int K, const float* q, const float* k, const float* a, float* A,
                                              int lda, float*) {
  using Kernel = void (*)(int, int, const float*, const float*, const float*, float*, int);
  static constexpr Kernel kByVectors[16] = {
      diagonal_scores_in_registers<1>,  diagonal_scores_in_registers<2>,  diagonal_scores_in_registers<3>,
      diagonal_scores_in_registers<4>,  diagonal_scores_in_registers<5>,  diagonal_scores_in_registers<6>,
      diagonal_scores_in_registers<7>,  diagonal_scores_in_registers<8>,  diagonal_scores_in_registers<9>,
      diagonal_scores_in_registers<10>, diagonal_scores_in_registers<11>, diagonal_scores_in_registers<12>,
      diagonal_scores_in_registers<13>, diagonal_scores_in_registers<14>, diagonal_scores_in_registers<15>,
      diagonal_scores_in_registers<16>};
  kByVectors[Lanes(K).vectors - 1](n, K, q, k, a, A, lda);
}

inline void diagonal_gradients_f32_16xk__avx512(int n, int K, const float* q, const float* k, const float* a,
                                                 const float* dA, int lda, float* dq, float* dk, float* f) {
  const Lanes lanes(K);
  for (int i = 1; i < n; ++i) {
    for (int v = 0; v < lanes.vectors; ++v) _mm512_storeu_ps(f + 16 * v, _mm512_set1_ps(1.0f));
    const float* qi = q + size_t(i) * K;
    float* dqi = dq + size_t(i) * K;
    for (int j = i - 1; j >= 0; --j) {
      const __m512 w = _mm512_set1_ps(dA[size_t(i) * lda + j]);
      const float *kj = k + size_t(j) * K, *a_next = a + size_t(j + 1) * K;
      float* dkj = dk + size_t(j) * K;
      for (int v = 0; v < lanes.vectors; ++v) {
        const __mmask16 m = lanes.mask(v);
        const __m512 fv = _mm512_mul_ps(_mm512_loadu_ps(f + 16 * v), _mm512_maskz_loadu_ps(m, a_next + 16 * v));
        _mm512_storeu_ps(f + 16 * v, fv);
        const __m512 wf = _mm512_mul_ps(w, fv);
        _mm512_mask_storeu_ps(dqi + 16 * v, m,
                              _mm512_fmadd_ps(wf, _mm512_maskz_loadu_ps(m, kj + 16 * v), _mm512_maskz_loadu_ps(m, dqi + 16 * v)));
        _mm512_mask_storeu_ps(dkj + 16 * v, m,
                              _mm512_fmadd_ps(wf, _mm512_maskz_loadu_ps(m, qi + 16 * v), _mm512_maskz_loadu_ps(m, dkj + 16 * v)));
      }
    }
  }
}


}  // namespace
}  // namespace flat::cpu

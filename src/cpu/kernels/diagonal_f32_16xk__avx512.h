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

// Query i's gradients against keys j = i - 1 .. 0 over the row's vectors [v0, v0 + NV): the slice of
// q_i, its factors F_ij and dq_i's in registers (3 NV of the 32 zmm), dk_j's slice loaded and stored
// per key: per vector and pair 3 loads and a store, where keeping F and dq_i in memory took 5 and 2.
// The same operations in the same order as through memory, so the same bits.
template <int NV>
inline void diagonal_gradients_slice__avx512(int i, int K, int v0, const Lanes& lanes, const float* q, const float* k,
                                             const float* a, const float* dA, int lda, float* dq, float* dk) {
  const int c0 = 16 * v0;
  __m512 qi[NV], f[NV], dqi[NV];
  __mmask16 m[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    m[v] = lanes.mask(v0 + v);
    qi[v] = _mm512_maskz_loadu_ps(m[v], q + size_t(i) * K + c0 + 16 * v);
    dqi[v] = _mm512_maskz_loadu_ps(m[v], dq + size_t(i) * K + c0 + 16 * v);
    f[v] = _mm512_set1_ps(1.0f);
  }
  for (int j = i - 1; j >= 0; --j) {
    const __m512 w = _mm512_set1_ps(dA[size_t(i) * lda + j]);
    const float *kj = k + size_t(j) * K + c0, *a_next = a + size_t(j + 1) * K + c0;
    float* dkj = dk + size_t(j) * K + c0;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      f[v] = _mm512_mul_ps(f[v], _mm512_maskz_loadu_ps(m[v], a_next + 16 * v));
      const __m512 wf = _mm512_mul_ps(w, f[v]);
      dqi[v] = _mm512_fmadd_ps(wf, _mm512_maskz_loadu_ps(m[v], kj + 16 * v), dqi[v]);
      _mm512_mask_storeu_ps(dkj + 16 * v, m[v],
                            _mm512_fmadd_ps(wf, qi[v], _mm512_maskz_loadu_ps(m[v], dkj + 16 * v)));
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(dq + size_t(i) * K + c0 + 16 * v, m[v], dqi[v]);
}

// Slices of up to 8 vectors (K = 128 in one walk down the keys; 24 registers held, the rest for
// the loads, w and w F).
constexpr int kGradientSliceVectors__avx512 = 8;

inline void diagonal_gradients_f32_16xk__avx512(int n, int K, const float* q, const float* k, const float* a,
                                                 const float* dA, int lda, float* dq, float* dk, float*) {
  const Lanes lanes(K);
  for (int i = 1; i < n; ++i)
    for (int v0 = 0; v0 < lanes.vectors; v0 += kGradientSliceVectors__avx512) {
      switch (lanes.vectors - v0 < kGradientSliceVectors__avx512 ? lanes.vectors - v0 : kGradientSliceVectors__avx512) {
        case 1: diagonal_gradients_slice__avx512<1>(i, K, v0, lanes, q, k, a, dA, lda, dq, dk); break;
        case 2: diagonal_gradients_slice__avx512<2>(i, K, v0, lanes, q, k, a, dA, lda, dq, dk); break;
        case 3: diagonal_gradients_slice__avx512<3>(i, K, v0, lanes, q, k, a, dA, lda, dq, dk); break;
        case 4: diagonal_gradients_slice__avx512<4>(i, K, v0, lanes, q, k, a, dA, lda, dq, dk); break;
        case 5: diagonal_gradients_slice__avx512<5>(i, K, v0, lanes, q, k, a, dA, lda, dq, dk); break;
        case 6: diagonal_gradients_slice__avx512<6>(i, K, v0, lanes, q, k, a, dA, lda, dq, dk); break;
        case 7: diagonal_gradients_slice__avx512<7>(i, K, v0, lanes, q, k, a, dA, lda, dq, dk); break;
        default: diagonal_gradients_slice__avx512<8>(i, K, v0, lanes, q, k, a, dA, lda, dq, dk); break;
      }
    }
}

}  // namespace
}  // namespace flat::cpu

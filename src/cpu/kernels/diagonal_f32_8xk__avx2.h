// The exact pairwise factors of a diagonal block under per-channel decay on AVX2 with FMA
// (contracts in diagonal_f32_1xk__generic.h). The generic loops, compiled with the AVX2 flags,
// stay scalar: the scores sum in channel order (no reassociation without -ffast-math), a chain of
// dependent scalar additions; the gradients' loop writes through three pointers the compiler
// cannot tell apart. Measured 4 to 13 times slower on the scores and 7 on the gradients (16
// tokens, K = 128, on a shared AVX2 EPYC).
#pragma once

#include <immintrin.h>

#include <cstddef>

#include "cpu/kernels/lanes__avx2.h"

namespace flat::cpu {
namespace {

// Channels run 8 to a vector; per query i the factors F_ij walk down the keys j in f (K floats,
// rounded up to 8), and each score is one vector of 8 partial sums, added across at the end.
inline void diagonal_scores_f32_8xk__avx2(int n, int K, const float* q, const float* k, const float* a, float* A,
                                          int lda, float* f) {
  const int full = K / 8 * 8;
  const __m256i tail = first_lanes_avx2(K - full);
  for (int i = 0; i < n; ++i) {
    const float* qi = q + size_t(i) * K;
    for (int c = 0; c < K; c += 8) _mm256_storeu_ps(f + c, _mm256_set1_ps(1.0f));
    for (int j = i; j >= 0; --j) {
      const float *kj = k + size_t(j) * K, *aj = a + size_t(j) * K;
      __m256 score = _mm256_setzero_ps();
      int c = 0;
      for (; c < full; c += 8) {
        const __m256 fc = _mm256_loadu_ps(f + c);
        score = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(qi + c), fc), _mm256_loadu_ps(kj + c), score);
        _mm256_storeu_ps(f + c, _mm256_mul_ps(fc, _mm256_loadu_ps(aj + c)));
      }
      if (c < K) {
        const __m256 fc = _mm256_loadu_ps(f + c);
        score = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_maskload_ps(qi + c, tail), fc), _mm256_maskload_ps(kj + c, tail),
                                score);
        _mm256_storeu_ps(f + c, _mm256_mul_ps(fc, _mm256_maskload_ps(aj + c, tail)));
      }
      A[size_t(i) * lda + j] = sum_lanes(score);
    }
  }
}

// Per query i the factors walk down the keys j in f, as above; dq[i] and dk[j] updated 8 channels
// at a time.
inline void diagonal_gradients_f32_8xk__avx2(int n, int K, const float* q, const float* k, const float* a,
                                             const float* dA, int lda, float* dq, float* dk, float* f) {
  const int full = K / 8 * 8;
  const __m256i tail = first_lanes_avx2(K - full);
  for (int i = 1; i < n; ++i) {
    for (int c = 0; c < K; c += 8) _mm256_storeu_ps(f + c, _mm256_set1_ps(1.0f));
    const float* qi = q + size_t(i) * K;
    float* dqi = dq + size_t(i) * K;
    for (int j = i - 1; j >= 0; --j) {
      const __m256 w = _mm256_set1_ps(dA[size_t(i) * lda + j]);
      const float *kj = k + size_t(j) * K, *a_next = a + size_t(j + 1) * K;
      float* dkj = dk + size_t(j) * K;
      const auto step = [&](int c, auto load, auto store) {
        const __m256 fc = _mm256_mul_ps(_mm256_loadu_ps(f + c), load(a_next + c));
        _mm256_storeu_ps(f + c, fc);
        const __m256 wf = _mm256_mul_ps(w, fc);
        store(dqi + c, _mm256_fmadd_ps(wf, load(kj + c), load(dqi + c)));
        store(dkj + c, _mm256_fmadd_ps(wf, load(qi + c), load(dkj + c)));
      };
      int c = 0;
      for (; c < full; c += 8)
        step(c, [](const float* p) { return _mm256_loadu_ps(p); }, [](float* p, __m256 x) { _mm256_storeu_ps(p, x); });
      if (c < K)
        step(c, [&](const float* p) { return _mm256_maskload_ps(p, tail); },
             [&](float* p, __m256 x) { _mm256_maskstore_ps(p, tail, x); });
    }
  }
}

}  // namespace
}  // namespace flat::cpu

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

// Channels run 8 to a vector, in slices held in registers while the keys j walk down from query i.
// The scores keep g = q_i * F_ij (as avx512's kernel does): per vector and pair 2 loads (k_j's and
// a_j's slice), an FMA into the score and a multiply by a_j, where carrying F and q apart took a
// third arithmetic operation; a slice of kScoreSliceVectors vectors (8 of the 16 ymm registers,
// the rest for the loads and the score) covers K = 64 in one walk down the keys. A scores slice is
// one call, through a table by its vector count and whether its last vector is cut by the row's
// tail: only that vector is a masked access (vmaskmovps, slower than a load, which the slice's FMAs
// and multiplies take as their memory operand), where a choice per vector at run time made every
// access a masked one. Per 16-token block at K = 128 on an idle EPYC Zen 3: 1.34-1.38 us before,
// 1.16-1.18 after. The gradients keep q_i's slice, its factors F_ij and dq_i's in registers
// (kGradientSliceVectors, 12 registers; 3 loads and a store per vector and pair), their slices
// inlined through a switch with the choice per vector at run time: through the table (a call per
// query and slice) they took 1.67 us per block against 1.42-1.57.
constexpr int kScoreSliceVectors = 8;
constexpr int kGradientSliceVectors = 4;

// The 8 floats at p, or the first lanes of `tail` where the row ends within them (the gradients'
// choice per vector at run time).
inline __m256 load_lanes(const float* p, bool whole, __m256i tail) {
  return whole ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail);
}

// Vector v of a slice of NV vectors at p: the first lanes of `tail` for the last one where Tail.
template <int NV, bool Tail>
inline __m256 load_slice(const float* p, int v, __m256i tail) {
  return Tail && v == NV - 1 ? _mm256_maskload_ps(p + 8 * v, tail) : _mm256_loadu_ps(p + 8 * v);
}
// Query i's scores against keys j = i .. 0 over channels [c0, c0 + 8 NV): per key, 8 lanes of partial
// sums added to sums[j].
template <int NV, bool Tail>
void diagonal_scores_slice__avx2(int i, int K, int c0, const float* q, const float* k, const float* a, __m256* sums,
                                 __m256i tail) {
  __m256 g[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) g[v] = load_slice<NV, Tail>(q + size_t(i) * K + c0, v, tail);
  for (int j = i; j >= 0; --j) {
    const float *kj = k + size_t(j) * K + c0, *aj = a + size_t(j) * K + c0;
    __m256 score = sums[j];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      score = _mm256_fmadd_ps(g[v], load_slice<NV, Tail>(kj, v, tail), score);
      g[v] = _mm256_mul_ps(g[v], load_slice<NV, Tail>(aj, v, tail));
    }
    sums[j] = score;
  }
}

using ScoreSlice = void (*)(int, int, int, const float*, const float*, const float*, __m256*, __m256i);
constexpr ScoreSlice kScoreSlices[2][kScoreSliceVectors + 1] = {
    {nullptr, diagonal_scores_slice__avx2<1, false>, diagonal_scores_slice__avx2<2, false>,
     diagonal_scores_slice__avx2<3, false>, diagonal_scores_slice__avx2<4, false>,
     diagonal_scores_slice__avx2<5, false>, diagonal_scores_slice__avx2<6, false>,
     diagonal_scores_slice__avx2<7, false>, diagonal_scores_slice__avx2<8, false>},
    {nullptr, diagonal_scores_slice__avx2<1, true>, diagonal_scores_slice__avx2<2, true>,
     diagonal_scores_slice__avx2<3, true>, diagonal_scores_slice__avx2<4, true>, diagonal_scores_slice__avx2<5, true>,
     diagonal_scores_slice__avx2<6, true>, diagonal_scores_slice__avx2<7, true>,
     diagonal_scores_slice__avx2<8, true>}};

inline void diagonal_scores_f32_8xk__avx2(int n, int K, const float* q, const float* k, const float* a, float* A,
                                          int lda, float*) {
  const __m256i tail = first_lanes_avx2(K % 8);
  const int vectors = (K + 7) / 8;
  __m256 sums[16];  // n <= 16 keys
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) sums[j] = _mm256_setzero_ps();
    for (int v0 = 0; v0 < vectors; v0 += kScoreSliceVectors) {
      const int width = vectors - v0 < kScoreSliceVectors ? vectors - v0 : kScoreSliceVectors;
      const bool cut = v0 + width == vectors && K % 8 != 0;  // the row's tail in its last vector
      kScoreSlices[cut][width](i, K, 8 * v0, q, k, a, sums, tail);
    }
    for (int j = 0; j <= i; ++j) A[size_t(i) * lda + j] = sum_lanes(sums[j]);
  }
}

// Query i's gradients against keys j = i - 1 .. 0 over channels [c0, c0 + 8 NV): the slice of dq_i and
// the factors in registers, dk_j's slice loaded and stored per key.
template <int NV>
inline void diagonal_gradients_slice__avx2(int i, int K, int c0, const float* q, const float* k, const float* a,
                                           const float* dA, int lda, float* dq, float* dk, __m256i tail) {
  __m256 qi[NV], f[NV], dqi[NV];
  bool whole[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    whole[v] = c0 + 8 * v + 8 <= K;
    qi[v] = load_lanes(q + size_t(i) * K + c0 + 8 * v, whole[v], tail);
    dqi[v] = load_lanes(dq + size_t(i) * K + c0 + 8 * v, whole[v], tail);
    f[v] = _mm256_set1_ps(1.0f);
  }
  for (int j = i - 1; j >= 0; --j) {
    const __m256 w = _mm256_set1_ps(dA[size_t(i) * lda + j]);
    const float *kj = k + size_t(j) * K + c0, *a_next = a + size_t(j + 1) * K + c0;
    float* dkj = dk + size_t(j) * K + c0;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      f[v] = _mm256_mul_ps(f[v], load_lanes(a_next + 8 * v, whole[v], tail));
      const __m256 wf = _mm256_mul_ps(w, f[v]);
      dqi[v] = _mm256_fmadd_ps(wf, load_lanes(kj + 8 * v, whole[v], tail), dqi[v]);
      const __m256 dkv = _mm256_fmadd_ps(wf, qi[v], load_lanes(dkj + 8 * v, whole[v], tail));
      if (whole[v]) _mm256_storeu_ps(dkj + 8 * v, dkv);
      else _mm256_maskstore_ps(dkj + 8 * v, tail, dkv);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    if (whole[v]) _mm256_storeu_ps(dq + size_t(i) * K + c0 + 8 * v, dqi[v]);
    else _mm256_maskstore_ps(dq + size_t(i) * K + c0 + 8 * v, tail, dqi[v]);
  }
}

inline void diagonal_gradients_f32_8xk__avx2(int n, int K, const float* q, const float* k, const float* a,
                                             const float* dA, int lda, float* dq, float* dk, float*) {
  const __m256i tail = first_lanes_avx2(K % 8);
  const int vectors = (K + 7) / 8;
  for (int i = 1; i < n; ++i)
    for (int v0 = 0; v0 < vectors; v0 += kGradientSliceVectors) {
      const int c0 = 8 * v0;
      switch (vectors - v0 < kGradientSliceVectors ? vectors - v0 : kGradientSliceVectors) {
        case 1: diagonal_gradients_slice__avx2<1>(i, K, c0, q, k, a, dA, lda, dq, dk, tail); break;
        case 2: diagonal_gradients_slice__avx2<2>(i, K, c0, q, k, a, dA, lda, dq, dk, tail); break;
        case 3: diagonal_gradients_slice__avx2<3>(i, K, c0, q, k, a, dA, lda, dq, dk, tail); break;
        default: diagonal_gradients_slice__avx2<4>(i, K, c0, q, k, a, dA, lda, dq, dk, tail); break;
      }
    }
}

}  // namespace
}  // namespace flat::cpu

// Helpers of the AVX2 microkernels: lane masks for row tails (vmaskmovps), the sum of a vector's
// lanes and an in-register 8 x 8 transpose. Include only in translation units compiled with -mavx2 -mfma (their target's
// flags); internal linkage, a copy per unit.
#pragma once

#include <immintrin.h>

namespace flat::cpu {
namespace {

// The first `count` of 8 lanes, as vmaskmovps' mask (sign bit set).
inline __m256i first_lanes_avx2(int count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The sum of the 8 lanes of x.
inline float sum_lanes(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// x[j][i] = x[i][j]: pairs interleaved (32-bit, then 64-bit), then the 128-bit halves exchanged.
inline void transpose8(__m256* x) {
  __m256 t[8], s[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_ps(x[2 * p], x[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_ps(x[2 * p], x[2 * p + 1]);
  }
  for (int h = 0; h < 2; ++h)  // rows 4h..4h+3: s[4h + m] holds element m (and m + 4) of each
    for (int u = 0; u < 2; ++u) {
      s[4 * h + 2 * u] = _mm256_shuffle_ps(t[4 * h + u], t[4 * h + 2 + u], 0x44);
      s[4 * h + 2 * u + 1] = _mm256_shuffle_ps(t[4 * h + u], t[4 * h + 2 + u], 0xee);
    }
  for (int m = 0; m < 4; ++m) {
    x[m] = _mm256_permute2f128_ps(s[m], s[4 + m], 0x20);
    x[4 + m] = _mm256_permute2f128_ps(s[m], s[4 + m], 0x31);
  }
}

}  // namespace
}  // namespace flat::cpu

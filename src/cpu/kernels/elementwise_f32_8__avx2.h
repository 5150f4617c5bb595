// The chunk stages' small vector primitives on AVX2 with FMA, 8 lanes at a time (contracts in
// elementwise_f32__generic.h): transpose in 8 x 8 blocks, exp, dot.
#pragma once

#include <immintrin.h>

#include "cpu/kernels/lanes__avx2.h"
#include "cpu/kernels/vector_math__avx2.h"

namespace flat::cpu {
namespace {

// dst[c, r] = src[r, c] for r < rows, c < cols, in 8 x 8 blocks in registers (masked at the
// edges). The generic loop, compiled with the AVX2 flags, stores one float at a time down a
// column of dst: 6 to 11 times slower, measured at 8-12 against 1.1-1.3 us for 64 x 128 (a
// fifth to a third of the 64 x 64 x 128 product it packs for, against 3-4%).
inline void transpose_f32_8x8__avx2(int rows, int cols, const float* src, int lds, float* dst, int ldd) {
  for (int r0 = 0; r0 < rows; r0 += 8) {
    const int nr = rows - r0 < 8 ? rows - r0 : 8;
    for (int c0 = 0; c0 < cols; c0 += 8) {
      const int nc = cols - c0 < 8 ? cols - c0 : 8;
      __m256 x[8];
      if (nr == 8 && nc == 8) {
        for (int i = 0; i < 8; ++i) x[i] = _mm256_loadu_ps(src + size_t(r0 + i) * lds + c0);
        transpose8(x);
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + size_t(c0 + j) * ldd + r0, x[j]);
        continue;
      }
      const __m256i load = first_lanes_avx2(nc), store = first_lanes_avx2(nr);
      for (int i = 0; i < 8; ++i)
        x[i] = i < nr ? _mm256_maskload_ps(src + size_t(r0 + i) * lds + c0, load) : _mm256_setzero_ps();
      transpose8(x);
      for (int j = 0; j < nc; ++j) _mm256_maskstore_ps(dst + size_t(c0 + j) * ldd + r0, store, x[j]);
    }
  }
}

inline void exp_f32_8__avx2(float* x, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp_ps(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = first_lanes_avx2(n - i);
    _mm256_maskstore_ps(x + i, m, exp_ps(_mm256_maskload_ps(x + i, m)));
  }
}

inline float dot_f32_8__avx2(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  if (i < n) {
    const __m256i m = first_lanes_avx2(n - i);
    acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc);
  }
  return sum_lanes(acc);
}

}  // namespace
}  // namespace flat::cpu

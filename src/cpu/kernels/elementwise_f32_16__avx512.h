// The chunk stages' small vector primitives on AVX-512, 16 lanes at a time (contracts in
// elementwise_f32__generic.h): transpose in 16 x 16 blocks, exp, dot.
#pragma once

#include <immintrin.h>

#include <cstddef>

#include "cpu/kernels/lanes__avx512.h"
#include "cpu/kernels/vector_math__avx512.h"

namespace flat::cpu {
namespace {

// dst[c, r] = src[r, c] for r < rows, c < cols, in 16 x 16 blocks (masked at the edges).
inline void transpose_f32_16x16__avx512(int rows, int cols, const float* src, int lds, float* dst, int ldd) {
  for (int r0 = 0; r0 < rows; r0 += 16) {
    const int nr = rows - r0 < 16 ? rows - r0 : 16;
    for (int c0 = 0; c0 < cols; c0 += 16) {
      const int nc = cols - c0 < 16 ? cols - c0 : 16;
      __m512 x[16];
      for (int i = 0; i < 16; ++i)
        x[i] = i < nr ? _mm512_maskz_loadu_ps(first_lanes(nc), src + size_t(r0 + i) * lds + c0) : _mm512_setzero_ps();
      transpose16(x);
      for (int j = 0; j < nc; ++j) _mm512_mask_storeu_ps(dst + size_t(c0 + j) * ldd + r0, first_lanes(nr), x[j]);
    }
  }
}

inline void exp_f32_16__avx512(float* x, int n) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(n - i);
    _mm512_mask_storeu_ps(x + i, m, exp_ps(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

inline float dot_f32_16__avx512(const float* a, const float* b, int n) {
  const Lanes lanes(n);
  __m512 acc = _mm512_setzero_ps();
  for (int v = 0; v < lanes.vectors; ++v)
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes.mask(v), a + 16 * v), _mm512_maskz_loadu_ps(lanes.mask(v), b + 16 * v), acc);
  return _mm512_reduce_add_ps(acc);
}


}  // namespace
}  // namespace flat::cpu

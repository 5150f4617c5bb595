// Vector math on AVX-512, shared by the translation units compiled with AVX-512 target flags
// (src/cpu/stages_avx512.cpp, src/conv/conv_avx512*.cpp). Include it only there.
// Internal linkage: each translation unit keeps its own copy, built with its own flags.
#pragma once

#include <immintrin.h>

namespace flat::cpu::avx512 {
namespace {

// exp(x) = 2^n exp(r) with n = round(x log2 e) and r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split
// in two so n ln 2 is exact), exp(r) by its degree-6 minimax polynomial (Cephes' expf, within
// 2 ulp), and 2^n applied by vscalefps, which flushes gracefully to 0 for very negative n.
// Gates are clamped to [-150, 88]: exp is already 0 (or the largest float) beyond.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-150.f)), _mm512_set1_ps(88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

// 2^t for t <= 125 (NaN for NaN, 0 below the fp32 range): t = floor(t) + f with f in [0, 1)
// by vreduceps, 2^f by a degree-5 polynomial (Chebyshev interpolant, within 1.2e-7), and
// 2^floor(t) applied by vscalefps. 9 instructions, 1 uop each.
inline __m512 exp2_ps(__m512 t) {
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(1.893754001e-03f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.949590847e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.586033687e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.401418239e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931545138e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999998808e-01f));
  return _mm512_scalef_ps(p, t);
}

// 1 / d for d in [1, 2^126): vrcp14ps and one Newton step, within about 1 ulp.
inline __m512 reciprocal_ps(__m512 d) {
  const __m512 r = _mm512_rcp14_ps(d);
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}

}  // namespace
}  // namespace flat::cpu::avx512

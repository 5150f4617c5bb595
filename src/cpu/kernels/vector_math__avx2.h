// Vector math on AVX2 with FMA (exp), for the microkernels of the targets compiled with those
// flags. Internal linkage: each translation unit keeps its own copy, built with its own flags.
#pragma once

#include <immintrin.h>

namespace flat::cpu {
namespace {

// exp of 8 lanes, bitwise the AVX-512 one (vector_math__avx512.h, exp_ps: the same reduction,
// polynomial and single rounding of 1 + (r + r^2 p(r)), within an ulp). AVX2 has no vscalefps:
// 2^n is applied as two exact powers of two 2^(n >> 1) and 2^(n - (n >> 1)), each a normal float
// built in the exponent field for every n of the clamped range ([-217, 127]); the first product
// is exact (the result stays normal), the second rounds once, so results below fp32's normal
// range come out as vscalefps gives them (gradually to 0, which x = -150 reaches).
// A NaN stays NaN (vmaxps and vminps return their second operand when either is NaN; the
// polynomial carries it through whatever exponent the conversion makes).
inline __m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.f), _mm256_max_ps(_mm256_set1_ps(-150.f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(_mm256_mul_ps(y, r), r, r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const auto power = [](__m256i e) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  };
  return _mm256_mul_ps(_mm256_mul_ps(y, power(n1)), power(n2));
}

}  // namespace
}  // namespace flat::cpu

// Vector math on AVX-512 (exp, 2^x, reciprocals), for the microkernels of the targets compiled
// with AVX-512 flags. Internal linkage: each translation unit keeps its own copy, built with its
// own flags.
#pragma once

#include <immintrin.h>

namespace flat::cpu {
namespace {

// exp(x) = 2^n exp(r) with n = round(x log2 e) and r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split
// in two so n ln 2 is exact), exp(r) = 1 + (r + r^2 p(r)) with p Cephes' degree-5 minimax
// polynomial, and 2^n applied by vscalefps, which flushes gracefully to 0 for very negative n.
// The small part r + r^2 p(r) is summed first and 1 added last, so the result is rounded once:
// within an ulp, and correctly rounded for the gates near 0 whose factors compound over long
// sequences (adding r to 1 first, then r^2 p(r), rounded twice: 1.16 ulp off at
// x = log(1 - 2^-12), the same way at every token).
// Arguments are clamped to [-150, 88]: below, exp is already 0; above, the result stays exp(88)
// = 1.65e38 instead of growing to inf at 88.72 (the portable exp_f32 of vector_math__generic.h
// gives inf there; the kernels take exp of arguments <= 0, and the norm's exp(-g) tolerates
// either, norm_leaf.h). A NaN stays NaN (vmaxps and vminps return their second operand when
// either is NaN).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.f), _mm512_max_ps(_mm512_set1_ps(-150.f), x));
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
  y = _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, r);
  return _mm512_scalef_ps(_mm512_add_ps(y, _mm512_set1_ps(1.0f)), n);
}

// 2^t for N vectors t <= 125 (NaN for NaN, 0 below the fp32 range): t = floor(t) + f with f in
// [0, 1) by vreduceps, 2^f by a polynomial (Chebyshev interpolants: degree 5 within 1.2e-7,
// degree 4 within 3.5e-6), and 2^floor(t) applied by vscalefps; Degree + 2 instructions of one
// uop each. Stage by stage across the N vectors: one vector is a chain of dependent instructions
// (about 40 cycles), N of them interleaved keep both vector ports busy.
template <int N, int Degree = 5>
inline void exp2_ps(const __m512* t, __m512* out) {
  static_assert(Degree == 4 || Degree == 5, "degree 4 or 5");
  static constexpr float kPoly5[6] = {1.893754001e-03f, 8.949590847e-03f, 5.586033687e-02f,
                                      2.401418239e-01f, 6.931545138e-01f, 9.999998808e-01f};
  static constexpr float kPoly4[5] = {1.367030945e-02f, 5.174499750e-02f, 2.416043580e-01f, 6.929728985e-01f,
                                      1.000003457e+00f};
  const float* poly = Degree == 5 ? kPoly5 : kPoly4;
  __m512 f[N];
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) f[i] = _mm512_reduce_ps(t[i], _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) out[i] = _mm512_fmadd_ps(_mm512_set1_ps(poly[0]), f[i], _mm512_set1_ps(poly[1]));
#pragma GCC unroll 8
  for (int k = 2; k <= Degree; ++k)
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i) out[i] = _mm512_fmadd_ps(out[i], f[i], _mm512_set1_ps(poly[k]));
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) out[i] = _mm512_scalef_ps(out[i], t[i]);
}

// 1 / d for N vectors d in [1, 2^126): vrcp14ps (within 2^-14), and with Newton one Newton step
// (within about 1 ulp).
template <int N, bool Newton = true>
inline void reciprocal_ps(const __m512* d, __m512* out) {
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) out[i] = _mm512_rcp14_ps(d[i]);
  if (!Newton) return;
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) out[i] = _mm512_mul_ps(out[i], _mm512_fnmadd_ps(d[i], out[i], _mm512_set1_ps(2.0f)));
}

}  // namespace
}  // namespace flat::cpu

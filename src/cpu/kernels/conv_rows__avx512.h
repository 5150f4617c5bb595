// The short convolution's row primitives on AVX-512 (F, BW, DQ, VL) with FMA, 16 channels to a
// vector (contracts in conv_rows__generic.h), as ConvRowsAvx512<Native> for the leaves of
// src/cpu/conv_leaf.h: fp32 rounds to bf16 in integer arithmetic, or with vcvtne2ps2bf16 when
// Native (AVX512-BF16). Include only in translation units compiled with those flags.
//
// The kernels stream their inputs and outputs once; what bounds them is the work per element on
// the core: instructions on the two 512-bit ports, loads and stores. So:
// - positions go in groups of R: for each vector of 16 channels the W taps and the bias are loaded
//   once per group, the last W-1 inputs (and, backward, the last W-1 rows of dz) come from a small
//   ring, and the window slides through registers: per element one load of x (and dy), one store
//   of y (dx) and the arithmetic;
// - taps, rings and partial sums are packed by groups of 16 channels (packed_index), so a vector
//   reaches them from one pointer;
// - bf16 widens with one vpermw (zeros in the low halves), and rounds two vectors at a time with
//   vcvtne2ps2bf16;
// - the SiLU is short: sigmoid(z) = 1 / (1 + 2^t) with t = -z log2(e), 2^t by vreduceps, a degree-5
//   polynomial and vscalefps, the reciprocal by vrcp14ps and one Newton step.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernels/conv_packing.h"
#include "cpu/kernels/lanes__avx512.h"
#include "cpu/kernels/vector_math__avx512.h"
#include "flat/flat.h"

namespace flat::cpu::conv_avx512 {
namespace {


#define FLAT_INLINE [[gnu::always_inline]] inline

// bf16 -> fp32: 16-bit lane 2i+1 takes element i, lane 2i is zero.
FLAT_INLINE __m512 widen_bf16(__m256i h) {
  const __m512i index = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4, 0,
                                         3, 0, 2, 0, 1, 0, 0, 0);
  return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xaaaaaaaau, index, _mm512_castsi256_si512(h)));
}

// Round to nearest even on the bit pattern; a NaN stays a (quiet) NaN, as f32_to_bf16 (src/bf16.h).
FLAT_INLINE __m256i narrow_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  rounded = _mm512_mask_or_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), bits, _mm512_set1_epi32(0x400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

// 16 elements at element c of a row of fp32 or bf16, as fp32 (Masked: the first lanes of `m`,
// the others zero).
template <bool Bf16, bool Masked>
FLAT_INLINE __m512 load16(const char* row, int c, __mmask16 m) {
  if (Bf16) {
    const auto* h = reinterpret_cast<const uint16_t*>(row) + c;
    return widen_bf16(Masked ? _mm256_maskz_loadu_epi16(m, h)
                             : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
  }
  const float* f = reinterpret_cast<const float*>(row) + c;
  return Masked ? _mm512_maskz_loadu_ps(m, f) : _mm512_loadu_ps(f);
}

template <bool Masked>
FLAT_INLINE void store_half(char* row, int c, __m256i h, __mmask16 m) {
  auto* out = reinterpret_cast<uint16_t*>(row) + c;
  if (Masked) _mm256_mask_storeu_epi16(out, m, h);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), h);
}

// v0 to row0 and v1 to row1 at element c, fp32 or bf16.
template <bool Native, bool Bf16, bool Masked>
FLAT_INLINE void store_pair(char* row0, char* row1, int c, __m512 v0, __m512 v1, __mmask16 m) {
  if (Bf16) {
    if constexpr (Native) {
      const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v1, v0));  // v0 low, v1 high
      store_half<Masked>(row0, c, _mm512_castsi512_si256(both), m);
      store_half<Masked>(row1, c, _mm512_extracti64x4_epi64(both, 1), m);
    } else {
      store_half<Masked>(row0, c, narrow_bf16(v0), m);
      store_half<Masked>(row1, c, narrow_bf16(v1), m);
    }
  } else {
    float* f0 = reinterpret_cast<float*>(row0) + c;
    float* f1 = reinterpret_cast<float*>(row1) + c;
    if (Masked) {
      _mm512_mask_storeu_ps(f0, m, v0);
      _mm512_mask_storeu_ps(f1, m, v1);
    } else {
      _mm512_storeu_ps(f0, v0);
      _mm512_storeu_ps(f1, v1);
    }
  }
}

template <bool Native, bool Bf16, bool Masked>
FLAT_INLINE void store16(char* row, int c, __m512 v, __mmask16 m) {
  if (Bf16) {
    if constexpr (Native) store_half<Masked>(row, c, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)), m);
    else store_half<Masked>(row, c, narrow_bf16(v), m);
  } else {
    float* f = reinterpret_cast<float*>(row) + c;
    if (Masked) _mm512_mask_storeu_ps(f, m, v);
    else _mm512_storeu_ps(f, v);
  }
}

// Rows r of a group, stored two at a time.
template <bool Native, int R, bool Bf16, bool Masked>
FLAT_INLINE void store_rows(char* row, int64_t stride, int c, const __m512* v, __mmask16 m) {
#pragma GCC unroll 8
  for (int r = 0; r + 1 < R; r += 2)
    store_pair<Native, Bf16, Masked>(row + stride * r, row + stride * (r + 1), c, v[r], v[r + 1], m);
  if (R % 2 == 1) store16<Native, Bf16, Masked>(row + stride * (R - 1), c, v[R - 1], m);
}

// The SiLU and its gradient on N rows at once (N = 2 in the groups), stage by stage across the
// rows so that one row's chain of dependent instructions does not leave the ports idle; more rows
// at once would run out of registers.
//   sigmoid(z) = 1 / (1 + e), e = exp(-z) = 2^t, t = -z log2(e) clamped to [-125, 125]: beyond,
//   sigmoid is 1 or below 2.4e-38 to fp32 precision, and every intermediate stays a normal
//   number (a denormal result would cost a microcode assist, ~200 cycles a vector).
// Precision: Fine, 2^t within 1.2e-7 and the reciprocal refined by a Newton step (the SiLU within
// 2e-6 relative, mostly from rounding t); coarse, for the all-bf16 calls, 2^t within 3.5e-6 and the bare vrcp14ps
// (within 6.1e-5, 30 times below bf16's rounding of 2^-9): 3 instructions fewer.
template <int N, bool Fine>
FLAT_INLINE void sigmoid_rows(const __m512* z, __m512* e, __m512* s) {
  __m512 t[N], d[N];
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r)
    t[r] = _mm512_min_ps(
        _mm512_max_ps(_mm512_mul_ps(z[r], _mm512_set1_ps(-1.44269504088896341f)), _mm512_set1_ps(-125.0f)),
        _mm512_set1_ps(125.0f));
  exp2_ps<N, Fine ? 5 : 4>(t, e);
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) d[r] = _mm512_add_ps(e[r], _mm512_set1_ps(1.0f));
  reciprocal_ps<N, Fine>(d, s);
}

// z <- z sigmoid(z).
template <int N, bool Fine>
FLAT_INLINE void silu_rows(__m512* z) {
  __m512 e[N], s[N];
  sigmoid_rows<N, Fine>(z, e, s);
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) z[r] = _mm512_mul_ps(z[r], s[r]);
}

// g <- g SiLU'(z) = g s (1 + z (1 - s)), with 1 - s = e s formed first: it is at most 1, where
// z e alone would overflow for z far below 0.
template <int N, bool Fine>
FLAT_INLINE void silu_gradient_rows(const __m512* z, __m512* g) {
  __m512 e[N], s[N];
  sigmoid_rows<N, Fine>(z, e, s);
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) e[r] = _mm512_mul_ps(e[r], s[r]);
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) g[r] = _mm512_mul_ps(g[r], s[r]);
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) g[r] = _mm512_mul_ps(g[r], _mm512_fmadd_ps(z[r], e[r], _mm512_set1_ps(1.0f)));
}

// Rows per SiLU batch in a group of R.
constexpr int silu_batch(int R) { return R % 2 == 0 ? 2 : 1; }

// z[r] = bias + sum_w tap[w] win[r + w] for P rows, the taps from the oldest input: the forward
// and the backward's recomputation sum alike.
template <int W, int P>
FLAT_INLINE void pre_activations(__m512 bias, const __m512* tap, const __m512* win, __m512* z) {
#pragma GCC unroll 8
  for (int r = 0; r < P; ++r) z[r] = bias;
#pragma GCC unroll 8
  for (int w = 0; w < W; ++w)
#pragma GCC unroll 8
    for (int r = 0; r < P; ++r) z[r] = _mm512_fmadd_ps(tap[w], win[r + w], z[r]);
}


// ---- Forward ----------------------------------------------------------------------------------

template <bool Native, int W, int R, bool Silu, bool XBf16, bool YBf16, bool Masked>
FLAT_INLINE void forward_vector(int c, __mmask16 m, const char* x, int64_t xs, float* ring, const float* taps, char* y,
                                int64_t ys) {
  __m512 tap[W];
#pragma GCC unroll 8
  for (int w = 0; w < W; ++w) tap[w] = _mm512_load_ps(taps + 16 * w);
  const __m512 bias = _mm512_load_ps(taps + 16 * W);
  __m512 win[W - 1 + R];  // x_{t-W+1} .. x_{t+R-1}
#pragma GCC unroll 8
  for (int w = 0; w < W - 1; ++w) win[w] = _mm512_load_ps(ring + 16 * w);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) win[W - 1 + r] = load16<XBf16, Masked>(x + xs * r, c, m);
  // A batch of rows at a time through the SiLU and out.
  constexpr int P = silu_batch(R);
#pragma GCC unroll 8
  for (int r0 = 0; r0 < R; r0 += P) {
    __m512 z[P];
    pre_activations<W, P>(bias, tap, win + r0, z);
    if (Silu) silu_rows<P, !(XBf16 && YBf16)>(z);
    store_rows<Native, P, YBf16, Masked>(y + ys * r0, ys, c, z, m);
  }
#pragma GCC unroll 8
  for (int w = 0; w < W - 1; ++w) _mm512_store_ps(ring + 16 * w, win[R + w]);
}


// ---- Backward ---------------------------------------------------------------------------------

template <bool Native, int W, int R, bool Silu, bool XBf16, bool DyBf16, bool Masked>
FLAT_INLINE void backward_vector(int c, __mmask16 m, const char* x, int64_t xs, const char* dy, int64_t dys,
                                 float* xring, float* dzring, const float* taps, float* partial, char* dx,
                                 int64_t dxs) {
  __m512 tap[W];
#pragma GCC unroll 8
  for (int w = 0; w < W; ++w) tap[w] = _mm512_load_ps(taps + 16 * w);
  __m512 xw[W - 1 + R], dz[W - 1 + R];  // x and dz at t-W+1 .. t+R-1
#pragma GCC unroll 8
  for (int w = 0; w < W - 1; ++w) {
    xw[w] = _mm512_load_ps(xring + 16 * w);
    dz[w] = _mm512_load_ps(dzring + 16 * w);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) xw[W - 1 + r] = load16<XBf16, Masked>(x + xs * r, c, m);
  __m512* g = dz + W - 1;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) g[r] = load16<DyBf16, Masked>(dy + dys * r, c, m);
  if (Silu) {
    const __m512 bias = _mm512_load_ps(taps + 16 * W);
    constexpr int P = silu_batch(R);
#pragma GCC unroll 8
    for (int r0 = 0; r0 < R; r0 += P) {
      __m512 z[P];
      pre_activations<W, P>(bias, tap, xw + r0, z);
      silu_gradient_rows<P, !(XBf16 && DyBf16)>(z, g + r0);
    }
  }
  // The partial sums of dweight and dbias over the group's positions.
#pragma GCC unroll 8
  for (int w = 0; w < W; ++w) {
    __m512 acc = _mm512_load_ps(partial + 16 * w);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc = _mm512_fmadd_ps(dz[W - 1 + r], xw[r + w], acc);
    _mm512_store_ps(partial + 16 * w, acc);
  }
  __m512 bias_acc = _mm512_load_ps(partial + 16 * W);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) bias_acc = _mm512_add_ps(bias_acc, dz[W - 1 + r]);
  _mm512_store_ps(partial + 16 * W, bias_acc);
  // dx_q for q = t-W+1+r: sum_w taps[w] dz_{q+W-1-w}.
  __m512 out[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    __m512 s = _mm512_mul_ps(tap[0], dz[r + W - 1]);
#pragma GCC unroll 8
    for (int w = 1; w < W; ++w) s = _mm512_fmadd_ps(tap[w], dz[r + W - 1 - w], s);
    out[r] = s;
  }
  store_rows<Native, R, XBf16, Masked>(dx, dxs, c, out, m);
#pragma GCC unroll 8
  for (int w = 0; w < W - 1; ++w) {
    _mm512_store_ps(xring + 16 * w, xw[R + w]);
    _mm512_store_ps(dzring + 16 * w, dz[R + w]);
  }
}



#undef FLAT_INLINE

// The row primitives of the AVX-512 leaves (contracts in conv_rows__generic.h; load_row and
// store_row serve the output norm's leaves too), 16 channels to a vector: fp32 rounds to bf16
// with vcvtne2ps2bf16 when Native (AVX512-BF16), in integer arithmetic otherwise.
template <bool Native>
struct ConvRowsAvx512 {
  static void load_row(const char* src, DType dtype, int n, float* dst) {
    int c = 0;
    if (dtype == DType::bf16) {
      for (; c + 16 <= n; c += 16) _mm512_storeu_ps(dst + c, load16<true, false>(src, c, 0));
      if (c < n) _mm512_storeu_ps(dst + c, load16<true, true>(src, c, first_lanes(n - c)));
    } else {
      for (; c + 16 <= n; c += 16) _mm512_storeu_ps(dst + c, load16<false, false>(src, c, 0));
      if (c < n) _mm512_storeu_ps(dst + c, load16<false, true>(src, c, first_lanes(n - c)));
    }
  }

  static void store_row(char* dst, DType dtype, int n, const float* src) {
    int c = 0;
    if (dtype == DType::bf16) {
      for (; c + 16 <= n; c += 16) store16<Native, true, false>(dst, c, _mm512_loadu_ps(src + c), 0);
      if (c < n) store16<Native, true, true>(dst, c, _mm512_loadu_ps(src + c), first_lanes(n - c));
    } else {
      for (; c + 16 <= n; c += 16) store16<Native, false, false>(dst, c, _mm512_loadu_ps(src + c), 0);
      if (c < n) store16<Native, false, true>(dst, c, _mm512_loadu_ps(src + c), first_lanes(n - c));
    }
  }

  template <int W, int R, bool Silu, bool XBf16, bool YBf16>
  static void forward_rows(int n, const char* x, int64_t xs, float* ring, const float* taps, char* y, int64_t ys) {
    int c = 0;
    for (; c + 16 <= n; c += 16, ring += 16 * (W - 1), taps += 16 * (W + 1))
      forward_vector<Native, W, R, Silu, XBf16, YBf16, false>(c, 0, x, xs, ring, taps, y, ys);
    if (c < n) forward_vector<Native, W, R, Silu, XBf16, YBf16, true>(c, first_lanes(n - c), x, xs, ring, taps, y, ys);
  }

  template <int W, int R, bool Silu, bool XBf16, bool DyBf16>
  static void backward_rows(int n, const char* x, int64_t xs, const char* dy, int64_t dys, float* xring,
                            float* dzring, const float* taps, float* partial, char* dx, int64_t dxs) {
    int c = 0;
    for (; c + 16 <= n;
         c += 16, xring += 16 * (W - 1), dzring += 16 * (W - 1), taps += 16 * (W + 1), partial += 16 * (W + 1))
      backward_vector<Native, W, R, Silu, XBf16, DyBf16, false>(c, 0, x, xs, dy, dys, xring, dzring, taps, partial,
                                                                dx, dxs);
    if (c < n)
      backward_vector<Native, W, R, Silu, XBf16, DyBf16, true>(c, first_lanes(n - c), x, xs, dy, dys, xring, dzring,
                                                               taps, partial, dx, dxs);
  }

  template <int W, bool Silu, bool Fine>
  static void backward_one(int n, const float* xt, const float* dyt, bool valid, bool own, float* xring,
                           float* dzring, const float* taps, float* partial, float* dx) {
    for (int c = 0; c < n;
         c += 16, xring += 16 * (W - 1), dzring += 16 * (W - 1), taps += 16 * (W + 1), partial += 16 * (W + 1)) {
      __m512 xw[W], dz[W];
  #pragma GCC unroll 8
      for (int w = 0; w < W - 1; ++w) {
        xw[w] = _mm512_load_ps(xring + 16 * w);
        dz[w] = _mm512_load_ps(dzring + 16 * w);
      }
      xw[W - 1] = valid ? _mm512_loadu_ps(xt + c) : _mm512_setzero_ps();
      __m512 g = _mm512_setzero_ps();
      if (valid) {
        g = _mm512_loadu_ps(dyt + c);
        if (Silu) {
          __m512 z = _mm512_load_ps(taps + 16 * W);
  #pragma GCC unroll 8
          for (int w = 0; w < W; ++w) z = _mm512_fmadd_ps(_mm512_load_ps(taps + 16 * w), xw[w], z);
          silu_gradient_rows<1, Fine>(&z, &g);
        }
      }
      dz[W - 1] = g;
      if (own) {
  #pragma GCC unroll 8
        for (int w = 0; w < W; ++w)
          _mm512_store_ps(partial + 16 * w, _mm512_fmadd_ps(g, xw[w], _mm512_load_ps(partial + 16 * w)));
        _mm512_store_ps(partial + 16 * W, _mm512_add_ps(g, _mm512_load_ps(partial + 16 * W)));
      }
      __m512 s = _mm512_mul_ps(_mm512_load_ps(taps), dz[W - 1]);
  #pragma GCC unroll 8
      for (int w = 1; w < W; ++w) s = _mm512_fmadd_ps(_mm512_load_ps(taps + 16 * w), dz[W - 1 - w], s);
      _mm512_storeu_ps(dx + c, s);
  #pragma GCC unroll 8
      for (int w = 0; w < W - 1; ++w) {
        _mm512_store_ps(xring + 16 * w, xw[w + 1]);
        _mm512_store_ps(dzring + 16 * w, dz[w + 1]);
      }
    }
  }
};

}  // namespace
}  // namespace flat::cpu::conv_avx512

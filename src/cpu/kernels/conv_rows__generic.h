// The short convolution's row primitives in portable C++, as ConvRowsGeneric for the leaves of
// src/cpu/conv_leaf.h, with the contracts every target's rows keep (conv_rows__avx512.h).
// Internal linkage: a copy per translation unit that includes it (the generic target, SSE2, and
// the avx2 target, AVX2 with FMA, each with its own flags).
//
// Written for the compiler to vectorise across channels: the channels go by the groups of 16 in
// which taps, rings and partial sums are packed (packed_index), each group's rows copied into a
// small window of 16-lane rows (ring first, then the group's R rows of x and dy), and every loop
// over a group's 16 lanes is an `omp simd` loop of selects and arithmetic, the SiLU's exp being
// vector_math__generic.h's exp_f32 (no libm call, no branch). The last group of a block may be
// partial: its lanes past n are zero in the window and are neither read from nor written to the
// rows.
#pragma once

#include <cstdint>
#include <cstring>

#include "bf16.h"
#include "cpu/kernels/conv_packing.h"
#include "cpu/kernels/vector_math__generic.h"
#include "flat/flat.h"

namespace flat::cpu::conv_generic {
namespace {

#define FLAT_GENERIC_INLINE [[gnu::always_inline]] inline

template <bool Bf16>
FLAT_GENERIC_INLINE float load1(const char* row, int c) {
  if (Bf16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
  return reinterpret_cast<const float*>(row)[c];
}

template <bool Bf16>
FLAT_GENERIC_INLINE void store1(char* row, int c, float v) {
  if (Bf16) reinterpret_cast<uint16_t*>(row)[c] = f32_to_bf16(v);
  else reinterpret_cast<float*>(row)[c] = v;
}

// sigmoid(z) and 1 - sigmoid(z) = sigmoid(-z) from e = exp(-|z|) in [0, 1]: neither overflows,
// and neither is formed as a difference of nearly equal numbers. r = 1 / (1 + e) is one of them,
// e r the other, chosen by the sign of z with select_f32 (vector_math__generic.h: a plain `?:`
// on floats would become a branch, and the loop would not be vectorised).
FLAT_GENERIC_INLINE void sigmoid_pair(float z, float& s, float& one_minus_s) {
  const bool nonnegative = z >= 0.0f;
  const float e = exp_f32(minus_abs_f32(z));
  const float r = 1.0f / (1.0f + e), q = e * r;
  s = select_f32(nonnegative, r, q);
  one_minus_s = select_f32(nonnegative, q, r);
}

FLAT_GENERIC_INLINE float silu(float z) {
  float s, one_minus_s;
  sigmoid_pair(z, s, one_minus_s);
  return z * s;
}

// dy * SiLU'(z) = dy s (1 + z (1 - s)).
FLAT_GENERIC_INLINE float silu_gradient(float z, float dy) {
  float s, one_minus_s;
  sigmoid_pair(z, s, one_minus_s);
  return dy * s * (1.0f + z * one_minus_s);
}

// z = bias + sum_w taps[w] x_{t-W+1+w}, the taps from the oldest input (every path sums in this
// order, so the backward recomputes the forward's z). tap: a group's taps (value k of lane l at
// tap[16 k + l]), win: the group's window rows from x_{t-W+1}, 16 lanes each.
template <int W>
FLAT_GENERIC_INLINE float pre_activation(const float* win, const float* tap, int l) {
  float z = tap[16 * W + l];
#pragma GCC unroll 8
  for (int w = 0; w < W; ++w) z += tap[16 * w + l] * win[16 * w + l];
  return z;
}

// Rows k of a group's window from a ring (packed, K values per channel; ring at the group).
template <int K>
FLAT_GENERIC_INLINE void from_ring(const float* ring, float* win) {
#pragma omp simd
  for (int i = 0; i < 16 * K; ++i) win[i] = ring[i];
}

// Row r of x (or dy) at channels [c, c + lanes) into a 16-lane window row, zero past lanes.
template <bool Bf16>
FLAT_GENERIC_INLINE void load_lanes(const char* row, int c, int lanes, float* out) {
  if (lanes < 16)
    for (int l = 0; l < 16; ++l) out[l] = 0.0f;
#pragma omp simd
  for (int l = 0; l < lanes; ++l) out[l] = load1<Bf16>(row, c + l);
}

template <bool Bf16>
FLAT_GENERIC_INLINE void store_lanes(char* row, int c, int lanes, const float* v) {
#pragma omp simd
  for (int l = 0; l < lanes; ++l) store1<Bf16>(row, c + l, v[l]);
}

// The row primitives of the portable leaves (load_row and store_row serve the output norm's
// leaves too, src/cpu/norm_leaf.h).
struct ConvRowsGeneric {
  // dst[0, n) = the n elements at src as fp32; dst[n, round16(n)) = 0.
  static void load_row(const char* src, DType dtype, int n, float* dst) {
    if (dtype == DType::f32) {
      std::memcpy(dst, src, sizeof(float) * size_t(n));
    } else {
#pragma omp simd
      for (int c = 0; c < n; ++c) dst[c] = load1<true>(src, c);
    }
    for (int c = n; c < ((n + 15) & ~15); ++c) dst[c] = 0.0f;
  }

  // The n fp32 values at src as the row's dtype at dst (bf16: rounded to nearest even).
  static void store_row(char* dst, DType dtype, int n, const float* src) {
    if (dtype == DType::f32) {
      std::memcpy(dst, src, sizeof(float) * size_t(n));
    } else {
#pragma omp simd
      for (int c = 0; c < n; ++c) store1<true>(dst, c, src[c]);
    }
  }

  // Forward of R consecutive positions t .. t+R-1, channels [0, n) of a block. Row r of x is at
  // x + xs*r (bytes), of y at y + ys*r. taps: the block's taps and bias (ConvTaps layout). ring
  // (packed, W-1 values per channel) holds x_{t-W+1+w} on entry and x_{t+R-W+1+w} on exit.
  //   y_{t+r} = act(bias + sum_w taps[w] x_{t+r-W+1+w})     act: SiLU or identity
  template <int W, int R, bool Silu, bool XBf16, bool YBf16>
  static void forward_rows(int n, const char* x, int64_t xs, float* ring, const float* taps, char* y, int64_t ys) {
    int c = 0;
    for (; c + 16 <= n; c += 16) forward_group<W, R, Silu, XBf16, YBf16>(c, 16, x, xs, ring, taps, y, ys);
    if (c < n) forward_group<W, R, Silu, XBf16, YBf16>(c, n - c, x, xs, ring, taps, y, ys);
  }

  // Backward of R consecutive positions t .. t+R-1, all before S and owned by the block, channels
  // [0, n). x, dy rows as in forward_rows; xring and dzring (packed, W-1 values per channel) hold x
  // and dz at t-W+1+w on entry and at t+R-W+1+w on exit. partial: the block's sums (ConvKernels).
  //   dz_{t+r} = dy_{t+r} act'(z_{t+r})                      SiLU' = s (1 + z (1 - s))
  //   partial[w] += sum_r dz_{t+r} x_{t+r-W+1+w},   partial[W] += sum_r dz_{t+r}
  //   dx row r (at dx + dxs*r, x's dtype) = dx_q for q = t-W+1+r = sum_w taps[w] dz_{q+W-1-w}
  template <int W, int R, bool Silu, bool XBf16, bool DyBf16>
  static void backward_rows(int n, const char* x, int64_t xs, const char* dy, int64_t dys, float* xring,
                            float* dzring, const float* taps, float* partial, char* dx, int64_t dxs) {
    int c = 0;
    for (; c + 16 <= n; c += 16)
      backward_group<W, R, Silu, XBf16, DyBf16>(c, 16, x, xs, dy, dys, xring, dzring, taps, partial, dx, dxs);
    if (c < n) backward_group<W, R, Silu, XBf16, DyBf16>(c, n - c, x, xs, dy, dys, xring, dzring, taps, partial, dx, dxs);
  }

  // One position t, any case, channels [0, round16(n)): with `valid`, dz_t = dy_t act'(z_t) from
  // the fp32 rows xt and dyt, else dz_t = 0 (t is past the sequence); with `own`, the partial sums
  // take dz_t as in backward_rows. dx (an fp32 row) = dx_{t-W+1}. Both rings shift by one.
  // Fine selects the SiLU's precision in the vector kernels (conv_rows__avx512.h); here it is always
  // exp_f32 and a division.
  template <int W, bool Silu, bool Fine>
  static void backward_one(int n, const float* xt, const float* dyt, bool valid, bool own, float* xring,
                           float* dzring, const float* taps, float* partial, float* dx) {
    constexpr int K = W - 1;
    for (int c = 0; c < ((n + 15) & ~15); c += 16) {
      float* xr = xring + packed_index(c, 0, K);
      float* dzr = dzring + packed_index(c, 0, K);
      const float* tap = taps + packed_index(c, 0, W + 1);
      float* part = partial + packed_index(c, 0, W + 1);
      alignas(64) float xw[16 * W], dz[16 * W];
      from_ring<K>(xr, xw);
      from_ring<K>(dzr, dz);
      if (valid) {
#pragma omp simd
        for (int l = 0; l < 16; ++l) xw[16 * K + l] = xt[c + l];
#pragma omp simd
        for (int l = 0; l < 16; ++l)
          dz[16 * K + l] = Silu ? silu_gradient(pre_activation<W>(xw, tap, l), dyt[c + l]) : dyt[c + l];
      } else {
#pragma omp simd
        for (int l = 0; l < 16; ++l) xw[16 * K + l] = dz[16 * K + l] = 0.0f;
      }
      if (own) {
#pragma GCC unroll 8
        for (int w = 0; w < W; ++w)
#pragma omp simd
          for (int l = 0; l < 16; ++l) part[16 * w + l] += dz[16 * K + l] * xw[16 * w + l];
#pragma omp simd
        for (int l = 0; l < 16; ++l) part[16 * W + l] += dz[16 * K + l];
      }
#pragma omp simd
      for (int l = 0; l < 16; ++l) {
        float s = tap[l] * dz[16 * K + l];
#pragma GCC unroll 8
        for (int w = 1; w < W; ++w) s += tap[16 * w + l] * dz[16 * (K - w) + l];
        dx[c + l] = s;
      }
      from_ring<K>(xw + 16, xr);
      from_ring<K>(dz + 16, dzr);
    }
  }

 private:
  // forward_rows on the group of channels [c, c + lanes), lanes <= 16.
  template <int W, int R, bool Silu, bool XBf16, bool YBf16>
  FLAT_GENERIC_INLINE static void forward_group(int c, int lanes, const char* x, int64_t xs, float* ring,
                                                const float* taps, char* y, int64_t ys) {
    constexpr int K = W - 1;
    float* rg = ring + packed_index(c, 0, K);
    const float* tap = taps + packed_index(c, 0, W + 1);
    alignas(64) float win[16 * (K + R)];  // x_{t-W+1} .. x_{t+R-1}, 16 lanes each
    from_ring<K>(rg, win);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) load_lanes<XBf16>(x + xs * r, c, lanes, win + 16 * (K + r));
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      alignas(64) float out[16];
#pragma omp simd
      for (int l = 0; l < 16; ++l) {
        const float z = pre_activation<W>(win + 16 * r, tap, l);
        out[l] = Silu ? silu(z) : z;
      }
      store_lanes<YBf16>(y + ys * r, c, lanes, out);
    }
    from_ring<K>(win + 16 * R, rg);
  }

  // backward_rows on the group of channels [c, c + lanes), lanes <= 16.
  template <int W, int R, bool Silu, bool XBf16, bool DyBf16>
  FLAT_GENERIC_INLINE static void backward_group(int c, int lanes, const char* x, int64_t xs, const char* dy,
                                                 int64_t dys, float* xring, float* dzring, const float* taps,
                                                 float* partial, char* dx, int64_t dxs) {
    constexpr int K = W - 1;
    float* xr = xring + packed_index(c, 0, K);
    float* dzr = dzring + packed_index(c, 0, K);
    const float* tap = taps + packed_index(c, 0, W + 1);
    float* part = partial + packed_index(c, 0, W + 1);
    alignas(64) float xw[16 * (K + R)], dz[16 * (K + R)], g[16 * R];
    from_ring<K>(xr, xw);
    from_ring<K>(dzr, dz);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      load_lanes<XBf16>(x + xs * r, c, lanes, xw + 16 * (K + r));
      load_lanes<DyBf16>(dy + dys * r, c, lanes, g + 16 * r);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma omp simd
      for (int l = 0; l < 16; ++l)
        dz[16 * (K + r) + l] = Silu ? silu_gradient(pre_activation<W>(xw + 16 * r, tap, l), g[16 * r + l]) : g[16 * r + l];
#pragma GCC unroll 16
    for (int w = 0; w <= W; ++w)
#pragma omp simd
      for (int l = 0; l < 16; ++l) {
        float acc = part[16 * w + l];
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc += w < W ? dz[16 * (K + r) + l] * xw[16 * (r + w) + l] : dz[16 * (K + r) + l];
        part[16 * w + l] = acc;
      }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      alignas(64) float out[16];
#pragma omp simd
      for (int l = 0; l < 16; ++l) {
        float s = tap[l] * dz[16 * (r + K) + l];
#pragma GCC unroll 8
        for (int w = 1; w < W; ++w) s += tap[16 * w + l] * dz[16 * (r + K - w) + l];
        out[l] = s;
      }
      store_lanes<XBf16>(dx + dxs * r, c, lanes, out);
    }
    from_ring<K>(xw + 16 * R, xr);
    from_ring<K>(dz + 16 * R, dzr);
  }
};

#undef FLAT_GENERIC_INLINE

}  // namespace
}  // namespace flat::cpu::conv_generic

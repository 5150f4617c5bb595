// The short convolution's row primitives in portable C++ (the SiLU calls expf), as
// ConvRowsGeneric for the leaves of src/conv/conv_leaf.h, with the contracts every target's rows
// keep (conv_rows__avx512.h). Internal linkage: a copy per translation unit that includes it.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#include "conv/conv_kernels.h"
#include "cpu/bf16.h"

namespace flat::cpu::conv_generic {
namespace {

template <bool Bf16>
inline float load1(const char* row, int c) {
  if (Bf16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
  return reinterpret_cast<const float*>(row)[c];
}

template <bool Bf16>
inline void store1(char* row, int c, float v) {
  if (Bf16) reinterpret_cast<uint16_t*>(row)[c] = f32_to_bf16(v);
  else reinterpret_cast<float*>(row)[c] = v;
}

// sigmoid(z) and 1 - sigmoid(z) = sigmoid(-z) from e = exp(-|z|) in (0, 1]: neither overflows,
// and neither is formed as a difference of nearly equal numbers.
inline void sigmoid_pair(float z, float& s, float& one_minus_s) {
  const float e = expf(-fabsf(z));
  const float r = 1.0f / (1.0f + e), q = e * r;
  s = z >= 0.0f ? r : q;
  one_minus_s = z >= 0.0f ? q : r;
}

inline float silu(float z) {
  float s, one_minus_s;
  sigmoid_pair(z, s, one_minus_s);
  return z * s;
}

// dy * SiLU'(z) = dy s (1 + z (1 - s)).
inline float silu_gradient(float z, float dy) {
  float s, one_minus_s;
  sigmoid_pair(z, s, one_minus_s);
  return dy * s * (1.0f + z * one_minus_s);
}

// Tables packed by groups of 16 channels (packed_index): value k of channel c, K per channel.
inline size_t at(int c, int k, int K) { return packed_index(c, k, K); }

// z = bias + sum_w taps[w] x_{t-W+1+w}, the taps from the oldest input (every path sums in this
// order, so the backward recomputes the forward's z).
template <int W>
inline float pre_activation(const float* win, const float* taps, int c) {
  float z = taps[at(c, W, W + 1)];
  for (int w = 0; w < W; ++w) z += taps[at(c, w, W + 1)] * win[w];
  return z;
}

// The row primitives of the portable leaves (load_row and store_row serve the output norm's
// leaves too, src/norm/norm_leaf.h).
struct ConvRowsGeneric {
  // dst[0, n) = the n elements at src as fp32; dst[n, round16(n)) = 0.
  static void load_row(const char* src, DType dtype, int n, float* dst) {
    if (dtype == DType::f32) {
      std::memcpy(dst, src, sizeof(float) * size_t(n));
    } else {
      for (int c = 0; c < n; ++c) dst[c] = load1<true>(src, c);
    }
    for (int c = n; c < ((n + 15) & ~15); ++c) dst[c] = 0.0f;
  }

  // The n fp32 values at src as the row's dtype at dst (bf16: rounded to nearest even).
  static void store_row(char* dst, DType dtype, int n, const float* src) {
    if (dtype == DType::f32) {
      std::memcpy(dst, src, sizeof(float) * size_t(n));
    } else {
      for (int c = 0; c < n; ++c) store1<true>(dst, c, src[c]);
    }
  }

  // Forward of R consecutive positions t .. t+R-1, channels [0, n) of a block. Row r of x is at
  // x + xs*r (bytes), of y at y + ys*r. taps: the block's taps and bias (ConvTaps layout). ring
  // (packed, W-1 values per channel) holds x_{t-W+1+w} on entry and x_{t+R-W+1+w} on exit.
  //   y_{t+r} = act(bias + sum_w taps[w] x_{t+r-W+1+w})     act: SiLU or identity
  template <int W, int R, bool Silu, bool XBf16, bool YBf16>
  static void forward_rows(int n, const char* x, int64_t xs, float* ring, const float* taps, char* y, int64_t ys) {
    for (int c = 0; c < n; ++c) {
      float win[W - 1 + R];
      for (int w = 0; w < W - 1; ++w) win[w] = ring[at(c, w, W - 1)];
      for (int r = 0; r < R; ++r) win[W - 1 + r] = load1<XBf16>(x + xs * r, c);
      for (int r = 0; r < R; ++r) {
        const float z = pre_activation<W>(win + r, taps, c);
        store1<YBf16>(y + ys * r, c, Silu ? silu(z) : z);
      }
      for (int w = 0; w < W - 1; ++w) ring[at(c, w, W - 1)] = win[R + w];
    }
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
    for (int c = 0; c < n; ++c) {
      float xw[W - 1 + R], dz[W - 1 + R];
      for (int w = 0; w < W - 1; ++w) {
        xw[w] = xring[at(c, w, W - 1)];
        dz[w] = dzring[at(c, w, W - 1)];
      }
      for (int r = 0; r < R; ++r) xw[W - 1 + r] = load1<XBf16>(x + xs * r, c);
      for (int r = 0; r < R; ++r) {
        const float g = load1<DyBf16>(dy + dys * r, c);
        dz[W - 1 + r] = Silu ? silu_gradient(pre_activation<W>(xw + r, taps, c), g) : g;
      }
      for (int w = 0; w <= W; ++w) {
        float acc = partial[at(c, w, W + 1)];
        for (int r = 0; r < R; ++r) acc += w < W ? dz[W - 1 + r] * xw[r + w] : dz[W - 1 + r];
        partial[at(c, w, W + 1)] = acc;
      }
      for (int r = 0; r < R; ++r) {
        float s = taps[at(c, 0, W + 1)] * dz[r + W - 1];
        for (int w = 1; w < W; ++w) s += taps[at(c, w, W + 1)] * dz[r + W - 1 - w];
        store1<XBf16>(dx + dxs * r, c, s);
      }
      for (int w = 0; w < W - 1; ++w) {
        xring[at(c, w, W - 1)] = xw[R + w];
        dzring[at(c, w, W - 1)] = dz[R + w];
      }
    }
  }

  // One position t, any case, channels [0, round16(n)): with `valid`, dz_t = dy_t act'(z_t) from
  // the fp32 rows xt and dyt, else dz_t = 0 (t is past the sequence); with `own`, the partial sums
  // take dz_t as in backward_rows. dx (an fp32 row) = dx_{t-W+1}. Both rings shift by one.
  // Fine selects the SiLU's precision in the vector kernels (conv_rows__avx512.h); here it is always
  // expf and a division.
  template <int W, bool Silu, bool Fine>
  static void backward_one(int n, const float* xt, const float* dyt, bool valid, bool own, float* xring,
                           float* dzring, const float* taps, float* partial, float* dx) {
    for (int c = 0; c < ((n + 15) & ~15); ++c) {
      float xw[W], dz[W];
      for (int w = 0; w < W - 1; ++w) {
        xw[w] = xring[at(c, w, W - 1)];
        dz[w] = dzring[at(c, w, W - 1)];
      }
      xw[W - 1] = valid ? xt[c] : 0.0f;
      float g = 0.0f;
      if (valid) g = Silu ? silu_gradient(pre_activation<W>(xw, taps, c), dyt[c]) : dyt[c];
      dz[W - 1] = g;
      if (own) {
        for (int w = 0; w < W; ++w) partial[at(c, w, W + 1)] += g * xw[w];
        partial[at(c, W, W + 1)] += g;
      }
      float s = taps[at(c, 0, W + 1)] * dz[W - 1];
      for (int w = 1; w < W; ++w) s += taps[at(c, w, W + 1)] * dz[W - 1 - w];
      dx[c] = s;
      for (int w = 0; w < W - 1; ++w) {
        xring[at(c, w, W - 1)] = xw[w + 1];
        dzring[at(c, w, W - 1)] = dz[w + 1];
      }
    }
  }
};

}  // namespace
}  // namespace flat::cpu::conv_generic

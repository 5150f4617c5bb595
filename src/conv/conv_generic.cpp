// The short convolution's row primitives for any CPU: portable C++ (the SiLU calls expf). The
// block loops are in conv_leaf.inc. The AVX-512 versions (conv_avx512.inc) keep these
// contracts.
#include <math.h>

#include <cstring>

#include "conv/conv_kernels.h"
#include "cpu/bf16.h"

#define FLAT_CONV_ISA generic
#define FLAT_CONV_NAME "generic"

namespace flat::cpu::generic {
namespace {

template <bool Bf16>
inline float load1(const void* row, int c) {
  if (Bf16) return bf16_to_f32(static_cast<const uint16_t*>(row)[c]);
  return static_cast<const float*>(row)[c];
}

template <bool Bf16>
inline void store1(void* row, int c, float v) {
  if (Bf16) static_cast<uint16_t*>(row)[c] = f32_to_bf16(v);
  else static_cast<float*>(row)[c] = v;
}

// dst[0, n) = the n elements at src as fp32; dst[n, round16(n)) = 0.
void load_row(const char* src, DType dtype, int n, float* dst) {
  if (dtype == DType::f32) {
    std::memcpy(dst, src, sizeof(float) * size_t(n));
  } else {
    for (int c = 0; c < n; ++c) dst[c] = load1<true>(src, c);
  }
  for (int c = n; c < ((n + 15) & ~15); ++c) dst[c] = 0.0f;
}

// sigmoid(z) and 1 - sigmoid(z) = sigmoid(-z) from e = exp(-|z|) in (0, 1]: neither overflows,
// and neither is formed as a difference of nearly equal numbers.
inline void sigmoid_pair(float z, float& s, float& one_minus_s) {
  const float e = expf(-fabsf(z));
  const float r = 1.0f / (1.0f + e), q = e * r;
  s = z >= 0.0f ? r : q;
  one_minus_s = z >= 0.0f ? q : r;
}

// One position t of a block, channels [0, n): x_t is read from `x` (bf16 or fp32 per XBf16)
// into ring[W-1] as fp32 (zero-padded to a multiple of 16); ring[w] holds x_{t-W+1+w}. Then
//   z = bias + sum_w taps[w * ld + c] * x_{t-W+1+w}[c]     (w in order)
//   y[c] = z * sigmoid(z) (Silu) or z, stored in y's dtype.
template <int W, bool Silu, bool XBf16, bool YBf16>
void forward_row(int n, const void* x, float* const* ring, const float* taps, int ld, const float* bias, void* y) {
  float* xt = ring[W - 1];
  for (int c = 0; c < n; ++c) xt[c] = load1<XBf16>(x, c);
  for (int c = n; c < ((n + 15) & ~15); ++c) xt[c] = 0.0f;
  for (int c = 0; c < n; ++c) {
    float z = bias[c];
    for (int w = 0; w < W; ++w) z += taps[size_t(w) * ld + c] * ring[w][c];
    if (Silu) {
      float s, one_minus_s;
      sigmoid_pair(z, s, one_minus_s);
      z *= s;
    }
    store1<YBf16>(y, c, z);
  }
}

// One position t: x_t into ring[W-1] as in forward_row, z recomputed the same way, then
//   dz[c] = dy[c] * act'(z)          SiLU' = s (1 + z (1 - s)), s = sigmoid(z)
//   partial[w * ldp + c] += dz * x_{t-W+1+w}[c],  partial[W * ldp + c] += dz.
// dz is written for c < round16(n) (zeros in the padding).
template <int W, bool Silu, bool XBf16, bool DyBf16>
void backward_row(int n, const void* x, float* const* ring, const void* dy, const float* taps, int ld,
                  const float* bias, float* dz, float* partial, int ldp) {
  float* xt = ring[W - 1];
  for (int c = 0; c < n; ++c) xt[c] = load1<XBf16>(x, c);
  for (int c = n; c < ((n + 15) & ~15); ++c) xt[c] = dz[c] = 0.0f;
  for (int c = 0; c < n; ++c) {
    float g = load1<DyBf16>(dy, c);
    if (Silu) {
      float z = bias[c];
      for (int w = 0; w < W; ++w) z += taps[size_t(w) * ld + c] * ring[w][c];
      float s, one_minus_s;
      sigmoid_pair(z, s, one_minus_s);
      g *= s * (1.0f + z * one_minus_s);
    }
    dz[c] = g;
    for (int w = 0; w < W; ++w) partial[size_t(w) * ldp + c] += g * ring[w][c];
    partial[size_t(W) * ldp + c] += g;
  }
}

// dx_q[c] = sum_w taps[w * ld + c] * dz_{q+W-1-w}[c] for c < n, where dzw[w] is the row of
// dz_{q+w}: the anti-causal correlation. Stored in dx's dtype.
template <int W, bool DxBf16>
void dx_row(int n, const float* const* dzw, const float* taps, int ld, void* dx) {
  for (int c = 0; c < n; ++c) {
    float s = taps[c] * dzw[W - 1][c];
    for (int w = 1; w < W; ++w) s += taps[size_t(w) * ld + c] * dzw[W - 1 - w][c];
    store1<DxBf16>(dx, c, s);
  }
}

}  // namespace
}  // namespace flat::cpu::generic

#include "conv/conv_leaf.inc"

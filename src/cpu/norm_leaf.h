// The leaves of the output norm and gate (norm_kernels.h) over a target's microkernels M and row
// primitives Rows (the convolution's: Rows::load_row widens a row to fp32, Rows::store_row
// rounds it back, 16 channels to a vector on AVX-512), one row at a time: the row's x (and g)
// widened into the workspace, then a few passes over it in L1. Rows are D channels of one head,
// a few hundred bytes to a few KB, so the passes cost little beside the row's trip from memory;
// the loops are plain `omp simd` loops, vectorised with the target's flags, and the exponentials
// of the gate go to M.exp (the target's vector exp).
//
// Per row, u = x (norm first) or x * act(g) (gate first), r = 1 / sqrt(mean(u^2) + eps),
// uhat = u r:
//   forward    y = uhat * weight (* act(g) when the norm comes first)
//   backward   with t the gradient reaching uhat (dy * weight, times act(g) when the norm comes
//              first): du = r (t - uhat mean(t uhat)); dx = du (norm first) or du * act(g);
//              dg = dy * weight * uhat * act'(g) (norm first) or du * x * act'(g);
//              dweight += dy * uhat (* act(g) when the norm comes first)
//
// Everything here has internal linkage: each target's translation unit compiles its own copy
// with its own flags.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#include "cpu/targets.h"
#include "cpu/norm_kernels.h"
#include "cpu/rescale.h"

namespace flat::cpu::norm_leaf {
namespace {

inline int round16(int n) { return (n + 15) & ~15; }

struct RowIndex {
  int64_t b, s, n;
};

inline RowIndex row_index(const NormGateParams& p, int64_t r) {
  const int64_t bs = r / p.N;
  return {bs / p.S, bs % p.S, r % p.N};
}

template <class Rows>
void load(const RowView& view, const RowIndex& i, int D, float* dst) {
  Rows::load_row(view.row(i.b, i.s, i.n), view.dtype, D, dst);
}

template <class Rows>
void store(const RowView& view, const RowIndex& i, int D, const float* src) {
  Rows::store_row(view.row(i.b, i.s, i.n), view.dtype, D, src);
}

// a = act(g) and, when slope is given, slope = act'(g), for D channels. sigmoid(g) = 1 / (1 + e)
// with e = exp(-g) from the target's exp: for g below -88.72, e is +inf and sigmoid 0 (portable
// exp), or e is exp(88) = 1.65e38 (the AVX targets' exp clamps there) and sigmoid 6e-39, a
// subnormal that the kernels' flush-to-zero makes 0; either is sigmoid(g) within fp32's range.
template <const MicroKernels& M>
void activate(Activation activation, const float* g, float* a, float* slope, int D) {
  if (activation == Activation::none) {
    std::memcpy(a, g, sizeof(float) * size_t(D));
    if (slope)
      for (int i = 0; i < D; ++i) slope[i] = 1.0f;
    return;
  }
#pragma omp simd
  for (int i = 0; i < D; ++i) a[i] = -g[i];
  M.exp(a, D);
#pragma omp simd
  for (int i = 0; i < D; ++i) a[i] = 1.0f / (1.0f + a[i]);  // sigmoid(g)
  if (activation == Activation::sigmoid) {
    if (slope)
#pragma omp simd
      for (int i = 0; i < D; ++i) slope[i] = a[i] * (1.0f - a[i]);
    return;
  }
  if (slope)  // silu'(g) = s (1 + g (1 - s))
#pragma omp simd
    for (int i = 0; i < D; ++i) slope[i] = a[i] * (1.0f + g[i] * (1.0f - a[i]));
#pragma omp simd
  for (int i = 0; i < D; ++i) a[i] *= g[i];
}

inline float sum_of_squares(const float* u, int D) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < D; ++i) s += u[i] * u[i];
  return s;
}

// u's norm, as uhat = u scale r: r = 1 / sqrt(mean((u scale)^2) + eps scale^2), and r scale =
// 1 / sqrt(mean(u^2) + eps), u's own inverse rms. u is scaled in place by a power of two where its
// sum of squares overflows (cpu/rescale.h), else scale is 1.
struct InverseRms {
  float r, scale;
};

inline InverseRms inverse_rms(const NormGateParams& p, float* u) {
  float sum = sum_of_squares(u, p.D), eps = p.eps;
  const float scale = rescale_overflowed_row(u, p.D, sum, eps, sum_of_squares);
  return {1.0f / sqrtf(sum / float(p.D) + eps), scale};
}

size_t workspace_floats(int D) { return size_t(6) * size_t(round16(D)); }

// Workspace rows: x, act(g), act'(g), dy, u (then uhat), t (then du).
template <const MicroKernels& M, class Rows>
void forward(const NormGateParams& p, int64_t begin, int64_t end, float* workspace) {
  const int D = p.D, Dp = round16(D);
  float *x = workspace, *a = x + Dp, *out = a + Dp;
  const bool gate = p.g.present(), gate_first = gate && !p.norm_before_gate;
  for (int64_t r = begin; r < end; ++r) {
    const RowIndex i = row_index(p, r);
    const float* weight = p.weight_of(i.n);
    load<Rows>(p.x, i, D, x);
    if (gate) {
      load<Rows>(p.g, i, D, out);
      activate<M>(p.activation, out, a, nullptr, D);
    }
    if (gate_first)
#pragma omp simd
      for (int d = 0; d < D; ++d) x[d] *= a[d];
    const float rs = inverse_rms(p, x).r;  // of x as scaled in place
    if (gate && !gate_first) {
#pragma omp simd
      for (int d = 0; d < D; ++d) out[d] = x[d] * rs * weight[d] * a[d];
    } else {
#pragma omp simd
      for (int d = 0; d < D; ++d) out[d] = x[d] * rs * weight[d];
    }
    store<Rows>(p.y, i, D, out);
  }
}

template <const MicroKernels& M, class Rows>
void backward(const NormGateParams& p, int64_t begin, int64_t end, float* workspace, float* partial_all) {
  const int D = p.D, Dp = round16(D);
  float *x = workspace, *a = x + Dp, *slope = a + Dp, *dy = slope + Dp, *u = dy + Dp, *t = u + Dp;
  const bool gate = p.g.present(), gate_first = gate && !p.norm_before_gate;
  std::memset(partial_all, 0, sizeof(float) * size_t(p.weight_rows) * size_t(D));
  for (int64_t r = begin; r < end; ++r) {
    const RowIndex i = row_index(p, r);
    const float* weight = p.weight_of(i.n);
    float* partial = partial_all + (i.n % p.weight_rows) * D;
    load<Rows>(p.x, i, D, x);
    load<Rows>(p.dy, i, D, dy);
    if (gate) {
      load<Rows>(p.g, i, D, t);
      activate<M>(p.activation, t, a, slope, D);
    }
    if (gate_first) {
#pragma omp simd
      for (int d = 0; d < D; ++d) u[d] = x[d] * a[d];
    } else {
      std::memcpy(u, x, sizeof(float) * size_t(D));
    }
    const InverseRms inv = inverse_rms(p, u);  // u scaled in place
    const float rs = inv.r, r_of_u = inv.r * inv.scale;
    float tu = 0.0f;  // sum_d t_d uhat_d
    if (gate && !gate_first) {
#pragma omp simd reduction(+ : tu)
      for (int d = 0; d < D; ++d) {
        const float uhat = u[d] * rs, dyw = dy[d] * weight[d];
        partial[d] += dy[d] * uhat * a[d];
        slope[d] *= dyw * uhat;  // dg
        t[d] = dyw * a[d];
        u[d] = uhat;
        tu += t[d] * uhat;
      }
    } else {
#pragma omp simd reduction(+ : tu)
      for (int d = 0; d < D; ++d) {
        const float uhat = u[d] * rs;
        partial[d] += dy[d] * uhat;
        t[d] = dy[d] * weight[d];
        u[d] = uhat;
        tu += t[d] * uhat;
      }
    }
    const float mean = tu / float(D);
#pragma omp simd
    for (int d = 0; d < D; ++d) t[d] = r_of_u * (t[d] - u[d] * mean);  // du
    if (gate_first) {
#pragma omp simd
      for (int d = 0; d < D; ++d) {
        slope[d] *= t[d] * x[d];  // dg
        t[d] *= a[d];             // dx
      }
    }
    store<Rows>(p.dx, i, D, t);
    if (gate) store<Rows>(p.dg, i, D, slope);
  }
}

}  // namespace
}  // namespace flat::cpu::norm_leaf

namespace flat::cpu {
namespace {

template <const MicroKernels& M, class Rows>
constexpr NormGateKernels make_norm_gate_kernels() {
  return {.workspace_floats = norm_leaf::workspace_floats,
          .forward = norm_leaf::forward<M, Rows>,
          .backward = norm_leaf::backward<M, Rows>};
}

}  // namespace
}  // namespace flat::cpu

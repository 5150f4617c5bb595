// The leaves of the short convolution (conv_kernels.h) over a target's row primitives Rows
// (contracts in conv_rows__generic.h), instantiated by each target (src/cpu/target_<name>.cpp):
//   Rows::load_row(src, dtype, n, dst)                 n elements to fp32, zero-padded to round16(n)
//   Rows::forward_rows<W, R, Silu, XBf16, YBf16>       R positions of y
//   Rows::backward_rows<W, R, Silu, XBf16, DyBf16>     R positions of dz, their dweight / dbias
//                                                      partial sums, and R rows of dx
//   Rows::backward_one<W, Silu, Fine>                  one position in any case (past the sequence,
//                                                      the halo, rows with dstate or to dstate0)
// Taps, rings and partial sums are packed by groups of 16 channels (packed_index), rows of fp32
// scratch are rounded up to 16 channels; the padding is zero, so the padding lanes compute zeros.
//
// A block walks its positions in order, R at a time, each group in one pass over the block's
// channels (rows are contiguous in memory, so reads and writes stream). The last W-1 inputs, in
// fp32, wait in a ring of W-1 rows for the next group; the backward keeps a second ring of the
// last W-1 rows of dz.
//
// The carry across blocks, both directions (seed paper, "Depthwise Causal Short Convolution"):
// - forward: a block starting at t0 > 0 reads the W-1 inputs before t0 from x itself (t0 = 0:
//   from state0, or zeros), so blocks are independent;
// - backward: dx_q = sum_w taps[w] dz_{q+W-1-w} reads W-1 steps into the future of dz, so a
//   block recomputes dz (from x and dy) at the W-1 positions after its end, the halo, instead of
//   waiting for the next block. Positions at or after S have dz = 0. dx_q is emitted once dz_q ..
//   dz_{q+W-1} are known, so the first W-1 positions of a block emit nothing, except in the block
//   at 0, where they emit q = -(W-1) .. -1: dstate0.
// The gradient with respect to the final state, dstate[b, c, j] for position S-(W-1)+j, adds to
// dx (or to dstate0 for positions before 0) as each row is emitted.
//
// Everything here has internal linkage: each target's translation unit compiles its own copy with
// its own flags, and it uses no standard-library templates, so no out-of-line copy built for one
// target can be picked by the linker for another.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/conv_kernels.h"
#include "bf16.h"

namespace flat::cpu::conv_leaf {
namespace {


inline int round16(int n) { return (n + 15) & ~15; }

// Positions per group: the taps, the window of inputs and (backward) of dz stay in registers for
// R rows; more rows spread the loads of taps and rings over more positions (8 measured best
// for W <= 4 in both passes, though the backward spills a few registers).
constexpr int forward_group(int W) { return W <= 4 ? 8 : 4; }
constexpr int backward_group(int W) { return W <= 4 ? 8 : 2; }

void zero_row(float* x, size_t n) { std::memset(x, 0, sizeof(float) * n); }

using ForwardRows = void (*)(int, const char*, int64_t, float*, const float*, char*, int64_t);
using BackwardRows = void (*)(int, const char*, int64_t, const char*, int64_t, float*, float*, const float*, float*,
                              char*, int64_t);
using BackwardOne = void (*)(int, const float*, const float*, bool, bool, float*, float*, const float*, float*, float*);

// f.template operator()<W>() for the call's W, 1 to 8: the taps are a template parameter of the
// row kernels.
template <class F>
auto by_taps(int W, F&& f) {
  switch (W) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    case 4: return f.template operator()<4>();
    case 5: return f.template operator()<5>();
    case 6: return f.template operator()<6>();
    case 7: return f.template operator()<7>();
    default: return f.template operator()<8>();
  }
}

// The row kernel for a call's taps, activation and dtypes (group: R = forward_group(W) positions
// at a time, else one).
template <class Rows>
ForwardRows pick_forward_rows(const ConvParams& p, bool group) {
  const bool silu = p.activation == Activation::silu, xb = p.x.dtype == DType::bf16, yb = p.y.dtype == DType::bf16;
  return by_taps(p.W, [&]<int W>() -> ForwardRows {
    const auto with = [&]<int R>() -> ForwardRows {
      if (silu) return xb ? (yb ? Rows::template forward_rows<W, R, true, true, true> : Rows::template forward_rows<W, R, true, true, false>)
                          : (yb ? Rows::template forward_rows<W, R, true, false, true> : Rows::template forward_rows<W, R, true, false, false>);
      return xb ? (yb ? Rows::template forward_rows<W, R, false, true, true> : Rows::template forward_rows<W, R, false, true, false>)
                : (yb ? Rows::template forward_rows<W, R, false, false, true> : Rows::template forward_rows<W, R, false, false, false>);
    };
    return group ? with.template operator()<forward_group(W)>() : with.template operator()<1>();
  });
}

template <class Rows>
BackwardRows pick_backward_rows(const ConvParams& p) {
  const bool silu = p.activation == Activation::silu, xb = p.x.dtype == DType::bf16, dyb = p.dy.dtype == DType::bf16;
  return by_taps(p.W, [&]<int W>() -> BackwardRows {
    constexpr int R = backward_group(W);
    if (silu) return xb ? (dyb ? Rows::template backward_rows<W, R, true, true, true> : Rows::template backward_rows<W, R, true, true, false>)
                        : (dyb ? Rows::template backward_rows<W, R, true, false, true> : Rows::template backward_rows<W, R, true, false, false>);
    return xb ? (dyb ? Rows::template backward_rows<W, R, false, true, true> : Rows::template backward_rows<W, R, false, true, false>)
              : (dyb ? Rows::template backward_rows<W, R, false, false, true> : Rows::template backward_rows<W, R, false, false, false>);
  });
}

// Fine: the SiLU's precision of the group kernels for the same call (coarse when x and dy are
// both bf16), so every position's dz is computed alike.
template <class Rows>
BackwardOne pick_backward_one(const ConvParams& p) {
  const bool silu = p.activation == Activation::silu, fine = !(p.x.dtype == DType::bf16 && p.dy.dtype == DType::bf16);
  return by_taps(p.W, [&]<int W>() -> BackwardOne {
    if (silu) return fine ? Rows::template backward_one<W, true, true> : Rows::template backward_one<W, true, false>;
    return Rows::template backward_one<W, false, true>;
  });
}

int group_size(int W, bool backward) { return backward ? backward_group(W) : forward_group(W); }

// The ring of the W-1 inputs before the block's first position t0, value w of channel c at
// packed_index(c, w, W-1), channels past the block's zero: x at t0-(W-1) .. t0-1 (read in rows
// through `row`, round16(n) floats), or at the sequence's start (t0 = 0; blocks are
// kConvSeqBlock >= W-1 positions long) the initial state, state0[b, c, w] being value w, read in
// one pass over its rows (zeros without one). A decode step (one position) is mostly this.
template <class Rows>
void window_ring(const ConvParams& p, const ConvBlock& blk, float* ring, float* row) {
  const int K = p.W - 1, n = blk.c1 - blk.c0;
  if (blk.t0 > 0) {
    for (int w = 0; w < K; ++w) {
      Rows::load_row(p.x.row(blk.b, blk.t0 - K + w, blk.c0), p.x.dtype, n, row);
      for (int c = 0; c < round16(n); ++c) ring[packed_index(c, w, K)] = row[c];
    }
    return;
  }
  if (!p.state0.present()) {
    zero_row(ring, packed_size(n, K));
    return;
  }
  for (int w = 0; w < K; ++w)  // the last group's lanes past n
    for (int c = n; c < round16(n); ++c) ring[packed_index(c, w, K)] = 0.0f;
  const float* state = reinterpret_cast<const float*>(p.state0.row(blk.b, blk.c0, 0));
  const int64_t stride = p.state0.stride1;
  for (int g = 0; g < n; g += 16) {  // a group of 16 channels: K rows of 16 lanes in the ring
    const int lanes = n - g < 16 ? n - g : 16;
    for (int w = 0; w < K; ++w) {
      float* out = ring + packed_index(g, w, K);
      const float* in = state + g * stride + w;
      for (int l = 0; l < lanes; ++l) out[l] = in[l * stride];
    }
  }
}

// The rings (W-1 values per channel each, packed) and three rows: x_t, dy_t and dx_q for the
// positions that go one at a time (and the prologue).
size_t workspace_floats(int W, int channels) {
  return 2 * packed_size(channels, W - 1) + 3 * size_t(round16(channels));
}

template <class Rows>
void forward(const ConvParams& p, const ConvTaps& taps, const ConvBlock& blk, float* workspace) {
  const int W = p.W, n = blk.c1 - blk.c0;
  float* ring = workspace;
  float* row = workspace + 2 * packed_size(n, W - 1);
  window_ring<Rows>(p, blk, ring, row);
  const int R = group_size(W, false);
  const ForwardRows group = pick_forward_rows<Rows>(p, true), one = pick_forward_rows<Rows>(p, false);
  const float* tap = taps.packed + packed_index(blk.c0, 0, W + 1);
  const int64_t xs = p.x.stride1 * p.x.element_bytes(), ys = p.y.stride1 * p.y.element_bytes();
  int t = blk.t0;
  for (; t + R <= blk.t1; t += R) group(n, p.x.row(blk.b, t, blk.c0), xs, ring, tap, p.y.row(blk.b, t, blk.c0), ys);
  for (; t < blk.t1; ++t) one(n, p.x.row(blk.b, t, blk.c0), xs, ring, tap, p.y.row(blk.b, t, blk.c0), ys);
}

template <class Rows>
void backward(const ConvParams& p, const ConvTaps& taps, const ConvBlock& blk, float* workspace, float* partial) {
  const int W = p.W, n = blk.c1 - blk.c0, b = blk.b;
  const size_t ring_floats = packed_size(n, W - 1);
  float* xring = workspace;
  float* dzring = workspace + ring_floats;
  float* xt = dzring + ring_floats;
  float* dyt = xt + round16(n);
  float* dx = dyt + round16(n);
  zero_row(dzring, ring_floats);  // dz before 0 is zero; after t0 > 0 it is never read
  window_ring<Rows>(p, blk, xring, xt);
  zero_row(partial, packed_size(n, W + 1));

  const int R = group_size(W, true);
  const BackwardRows group = pick_backward_rows<Rows>(p);
  const BackwardOne one = pick_backward_one<Rows>(p);
  const float* tap = taps.packed + packed_index(blk.c0, 0, W + 1);
  const int64_t xs = p.x.stride1 * p.x.element_bytes(), dys = p.dy.stride1 * p.dy.element_bytes(),
                dxs = p.dx.stride1 * p.dx.element_bytes();
  const bool wants_dstate0 = blk.t0 == 0 && p.dstate0.present();
  const int first_final = p.S - (W - 1);  // the first position the final state holds
  const int group_end = blk.t1 < p.S ? blk.t1 : p.S;
  // Positions t = t0 .. t1+W-2 give dz_t and then dx_q, q = t-(W-1).
  for (int t = blk.t0; t < blk.t1 + W - 1;) {
    const int q = t - (W - 1);
    if (q >= blk.t0 && t + R <= group_end && (!p.dstate.present() || t + R - W < first_final)) {
      group(n, p.x.row(b, t, blk.c0), xs, p.dy.row(b, t, blk.c0), dys, xring, dzring, tap, partial,
            p.dx.row(b, q, blk.c0), dxs);
      t += R;
      continue;
    }
    const bool valid = t < p.S;
    if (valid) {
      Rows::load_row(p.x.row(b, t, blk.c0), p.x.dtype, n, xt);
      Rows::load_row(p.dy.row(b, t, blk.c0), p.dy.dtype, n, dyt);
    }
    one(n, xt, dyt, valid, t < blk.t1, xring, dzring, tap, partial, dx);
    ++t;
    const bool to_dx = q >= blk.t0;
    if (!to_dx && !(q < 0 && wants_dstate0)) continue;
    if (p.dstate.present() && q >= first_final)
      for (int i = 0; i < n; ++i)
        dx[i] += reinterpret_cast<const float*>(p.dstate.row(b, blk.c0 + i, 0))[q - first_final];
    if (!to_dx) {
      for (int i = 0; i < n; ++i) reinterpret_cast<float*>(p.dstate0.row(b, blk.c0 + i, 0))[q + W - 1] = dx[i];
    } else if (p.dx.dtype == DType::f32) {
      std::memcpy(p.dx.row(b, q, blk.c0), dx, sizeof(float) * size_t(n));
    } else {
      auto* out = reinterpret_cast<uint16_t*>(p.dx.row(b, q, blk.c0));
      for (int i = 0; i < n; ++i) out[i] = f32_to_bf16(dx[i]);
    }
  }
}

}  // namespace
}  // namespace flat::cpu::conv_leaf

namespace flat::cpu {
namespace {

// The leaves on a target's row primitives.
template <class Rows>
constexpr ConvKernels make_conv_kernels() {
  return {.workspace_floats = conv_leaf::workspace_floats,
          .forward = conv_leaf::forward<Rows>,
          .backward = conv_leaf::backward<Rows>};
}

}  // namespace
}  // namespace flat::cpu

// The leaves of the short convolution: one block of (batch b, positions [t0, t1), channels
// [c0, c1)), instantiated per target (conv_leaf.h over the target's row primitives, in
// src/cpu/target_<name>.cpp). The drivers in conv.cpp own threads and memory; a leaf never
// allocates and works in the workspace it is given.
#pragma once

#include <cstddef>

#include "conv_params.h"
#include "cpu/kernels/conv_packing.h"

namespace flat::cpu {

// The taps packed once per call: tap w of channel c at packed_index(c, w, W + 1), the bias at
// packed_index(c, W, W + 1) (zero when the call has none); channels past C are zero.
struct ConvTaps {
  const float* packed = nullptr;
};

struct ConvBlock {
  int b = 0, t0 = 0, t1 = 0, c0 = 0, c1 = 0;
};

struct ConvKernels {
  // Floats of workspace a block of `channels` channels needs (64-byte aligned by the caller).
  size_t (*workspace_floats)(int W, int channels);
  // y (rows t0..t1-1 of the block's channels).
  void (*forward)(const ConvParams& p, const ConvTaps& taps, const ConvBlock& block, float* workspace);
  // dx (rows t0..t1-1), dstate0 (when t0 = 0 and it is wanted), and the block's partial sums
  // over its positions, for channel c0 + i: partial[packed_index(i, w, W + 1)] =
  // sum_t dz_t x_{t-W+1+w} (w < W) and partial[packed_index(i, W, W + 1)] = sum_t dz_t.
  void (*backward)(const ConvParams& p, const ConvTaps& taps, const ConvBlock& block, float* workspace, float* partial);
};

}  // namespace flat::cpu

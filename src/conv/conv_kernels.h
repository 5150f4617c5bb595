// The leaves of the short convolution: one block of (batch b, positions [t0, t1), channels
// [c0, c1)), compiled once per instruction set (conv_leaf.inc included by conv_<isa>.cpp). The
// drivers in conv.cpp own threads and memory; a leaf never allocates and works in the
// workspace it is given.
#pragma once

#include <cstddef>

#include "conv/conv_params.h"

namespace flat::cpu {

// The taps packed once per call: tap w of channel c at w_packed[w * ld + c], bias[c] (zero when
// the call has none); ld is C rounded up to 16, the padding zero.
struct ConvTaps {
  const float* w = nullptr;
  const float* bias = nullptr;
  int ld = 0;
};

struct ConvBlock {
  int b = 0, t0 = 0, t1 = 0, c0 = 0, c1 = 0;
};

struct ConvKernels {
  const char* name;
  // Floats of workspace a block of `channels` channels needs (64-byte aligned by the caller).
  size_t (*workspace_floats)(int W, int channels);
  // y (rows t0..t1-1 of the block's channels).
  void (*forward)(const ConvParams& p, const ConvTaps& taps, const ConvBlock& block, float* workspace);
  // dx (rows t0..t1-1), dstate0 (when t0 = 0 and it is wanted), and the block's partial sums
  // over its positions: partial[w * ldp + i] = sum_t dz_t x_{t-W+1+w} for channel c0 + i and
  // partial[W * ldp + i] = sum_t dz_t, with ldp = (c1 - c0) rounded up to 16.
  void (*backward)(const ConvParams& p, const ConvTaps& taps, const ConvBlock& block, float* workspace,
                   float* partial);
};

namespace generic {
const ConvKernels& conv_kernels();
}
namespace avx512 {
const ConvKernels& conv_kernels();  // AVX-512 F/BW/DQ/VL + FMA
}
namespace avx512_bf16 {
const ConvKernels& conv_kernels();  // the same with AVX512-BF16 conversions to bf16
}

}  // namespace flat::cpu

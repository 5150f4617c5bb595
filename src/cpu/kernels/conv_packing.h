// How the short convolution's per-channel tables are laid out, which its row primitives
// (conv_rows__<name>.h) and the leaves over them (src/cpu/conv_leaf.h, their table ConvKernels in
// src/cpu/conv_kernels.h) share.
#pragma once

#include <cstddef>

namespace flat::cpu {

// Per-channel tables (taps, partial sums, the leaves' rings) are laid out by groups of 16
// channels, the K values of a group one vector after the other: value k of channel c at
// packed_index(c, k, K). A vector kernel then reaches all of a group's values from one pointer.
// Internal linkage: the ISA translation units include this too, each with its own flags.
namespace {
inline size_t packed_index(int c, int k, int K) {
  return (size_t(c / 16) * size_t(K) + size_t(k)) * 16 + size_t(c % 16);
}
inline size_t packed_size(int channels, int K) { return size_t((channels + 15) / 16) * size_t(K) * 16; }
}  // namespace

}  // namespace flat::cpu

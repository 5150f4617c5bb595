// Drivers of the short convolution: the work split over (sequence, block of positions, block of
// channels), the packed taps, the per-thread workspaces, the fixed-order reduction of the weight
// and bias gradients, and the final state. The math of one block lives in the leaves (conv_kernels.h),
// instantiated per target; the call's Run says which target and which workers.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/conv_kernels.h"
#include "conv_params.h"
#include "cpu/run.h"

namespace flat::cpu {

// The blocks a call is cut into: its problems (the call itself, or with sequences each sequence
// as a call of its own) cut into rows of kConvSeqBlock positions, problem by problem and batch
// row by batch row (an empty sequence has one row of no positions, which writes its dstate0),
// and the channels into blocks. They depend on the shape and the sequences only (never on the
// thread count), so the partial sums of dweight and dbias, and the order they are added in, are
// always the same.
struct ConvPartition {
  int channel_block = 0;  // channels per block, a multiple of 16 (the last one may be narrower)
  int channel_blocks = 0;
  std::vector<int64_t> first_row;  // problem i has the rows first_row[i] .. first_row[i+1] - 1
  int64_t rows() const { return first_row.back(); }
  int64_t items() const { return rows() * channel_blocks; }
};

// Positions per sequence block: the halo the backward recomputes (W-1 positions) is 1% of it.
constexpr int kConvSeqBlock = 256;
// Channels per block at most: whole rows, so a block's reads and writes are long contiguous
// runs. Narrower blocks (runs of 512 channels out of rows of 2048) measured 15% slower: each run
// of a row is too short for the hardware prefetchers.
constexpr int kConvMaxChannelBlock = 4096;
ConvPartition conv_partition(const ConvParams& p);

void conv_forward(const ConvParams& p, const Run& run);
void conv_backward(const ConvParams& p, const Run& run);

}  // namespace flat::cpu

// Timing of the short convolution for `flat bench`: the fused forward and backward, and a naive
// same-process baseline, at one shape.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <vector>

#include "bench_pass.h"
#include "flat/flat.h"

namespace flat::tool {

// The default is the seed paper's shape scaled to a 2-core CPU (the paper: B = 8, S = 4096,
// C = 2048 on a TPU v6e).
struct ConvBenchOptions {
  int64_t B = 2, S = 4096, C = 2048;
  int W = 4;
  bool bias = true;
  Activation activation = Activation::silu;
  DType dtype = DType::bf16;  // of x, y, dy, dx; weights fp32
  int threads = 0;            // 0: all hardware threads
  int repeats = 5;            // timed runs of the fused kernels (after one warm-up); median
  int baseline_repeats = 3;   // timed runs of the baseline (after one warm-up); 0: no baseline
};

// The passes' work at the bench's shape (tools/bench_pass.h):
//   bytes: what the pass must move, every input read once and every output written once at its
//     dtype. forward: x, weight, bias read, y written. backward: x, dy, weight, bias read;
//     dx, dweight, dbias written.
//   flops, per element of [B, S, C] (W taps; the SiLU counted as the seed paper does):
//     forward   2W (taps and bias; 2W-1 without bias) + 6 for the SiLU (negate, exp, add,
//               reciprocal, refinement, multiply)
//     backward  z recomputed 2W (2W-1) + 9 for the SiLU's slope (negate, exp, add, reciprocal;
//               1-s, z(1-s), +1, *s, *dy) + dx 2W-1 + dweight 2W + dbias 1 (with bias)
//   baseline_seconds: the naive baseline on the same inputs in fp32, as a framework runs it
//     unfused: forward z = conv(x) by a per-position, per-channel scalar loop over the taps, then
//     a separate SiLU pass; backward (from the forward's saved z) dz = dy * SiLU'(z), then dx by
//     a second loop over the taps, then dweight and dbias by another pass over the sequence.
//   decode (W > 1): 64 sequences of one position each (cu_seqlens), their states in a pool
//     [256, C, W-1] updated in place through indices, the rows rotated over 4 sets of 64 as the
//     serving bench does; bytes: x read, y written, each state read and written, taps.
// Times forward, backward, decode; progress lines go to `progress` when given.
std::vector<PassResult> bench_conv(const ConvBenchOptions& options, std::ostream* progress = nullptr);

// The results as a markdown table under a line naming the shape (write_pass_table).
void write_conv_markdown(const ConvBenchOptions& options, const std::vector<PassResult>& results,
                         std::optional<double> copy_gbs, std::ostream& out);

}  // namespace flat::tool

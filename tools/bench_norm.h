// Timing of the output norm and gate for `flat bench`: the fused forward and backward
// (flat::norm_gate_forward / _backward), and a naive same-process baseline, at one shape.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <vector>

#include "bench_pass.h"
#include "flat/flat.h"

namespace flat::tool {

// The default is the seed paper's layer scaled to a 2-core CPU like the variants' bench shape:
// 16 heads of D = 128, so that the norm runs over N * D = 2048 channels per token; FLA's layers'
// order (the norm first, then the SiLU gate) with one weight row shared by the heads.
struct NormGateBenchOptions {
  int64_t B = 2, S = 4096, N = 16, D = 128;
  bool gate = true;
  Activation activation = Activation::silu;
  bool norm_before_gate = true;
  bool weight_per_head = false;  // weight [N, D] instead of [D]
  DType dtype = DType::bf16;     // of x, g, y, dy, dx, dg; weight and dweight fp32
  int threads = 0;               // 0: all hardware threads
  int repeats = 5;               // timed runs of the fused kernels (after the warm-up); median
  int baseline_repeats = 3;      // timed runs of the baseline (after the warm-up); 0: no baseline

  int64_t weight_elements() const { return (weight_per_head ? N : 1) * D; }
};

// The passes' work at the bench's shape (tools/bench_pass.h):
//   bytes: every input read once and every output written once at its dtype. forward: x, g,
//     weight read, y written. backward: x, g, weight, dy read; dx, dg, dweight written. (g and
//     dg only with a gate.)
//   flops, per element of [B, S, N, D], as the leaves compute them (src/cpu/norm_leaf.h; an exp
//     counted as 1, the per-row square root and division not counted):
//     forward   4 (sum of squares 2, x * r * weight 2), and with a gate 1 more for the product
//               with act(g) plus act(g) itself: silu 5 (negate, exp, add, reciprocal, * g),
//               sigmoid 4, none 0
//     backward  11 without a gate (sum of squares 2; uhat, dy * weight 2; dweight 2; the dot of
//               t and uhat 2; du 3), 15 with one (norm first: dy * weight * act(g) and dg's
//               products; gate first: u = x * act(g), dg and dx's products) plus act(g) with its
//               slope: silu 9, sigmoid 6, none 0
//   baseline_seconds: the naive baseline on the same inputs in fp32, as a framework runs the
//     layer unfused (FLA's reference RMSNormGated): forward a gate pass (act(g) times its input,
//     before the norm or after it), a pass for every row's rms, a normalising pass (x / rms *
//     weight), each reading and writing fp32 tensors; backward autograd through the same ops
//     from their saved outputs, in reverse: the gate's backward, the weight's gradient summed
//     over the rows, the norm's backward row by row.
// Times forward then backward; progress lines go to `progress` when given.
std::vector<PassResult> bench_norm_gate(const NormGateBenchOptions& options, std::ostream* progress = nullptr);

// The results as a markdown table under a line naming the shape (write_pass_table).
void write_norm_gate_markdown(const NormGateBenchOptions& options, const std::vector<PassResult>& results,
                              std::optional<double> copy_gbs, std::ostream& out);

}  // namespace flat::tool

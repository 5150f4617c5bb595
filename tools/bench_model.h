// The bench's model of the variants' work: the shape `flat bench` measures each at (where it is not
// the bench's own) and the FLOPs and bytes a pass does (docs/performance.md, "FLOPs" and "Bytes").
// The library's table of variants (src/variants.h) holds only what the library needs.
#pragma once

#include <cstdint>

#include "flat/flat.h"
#include "variants.h"

namespace flat::tool {

// The shape `flat bench` measures a variant at, where it is not the bench's: keys this wide (0:
// the bench's K), shared by this many value heads each (SLA-R4: K = 256, 4 value heads).
struct BenchShape {
  int K = 0;
  int value_heads = 1;
};
BenchShape bench_shape(Variant variant);

// The work of one pass, as `flat bench` reports it (docs/performance.md, "FLOPs" and "Bytes").
// Items are (batch, key head), each with R value heads side by side (R = 1 but for sla).
struct ProblemSize {
  int64_t B = 1, S = 1, N = 1, K = 1, V = 1;
  int64_t R = 1;       // value heads per key head: q, k, g, beta at N / R heads
  int64_t G = 1;       // channels per gate value (Gate::grouped)
  int chunk = 64;
  DType dtype = DType::bf16;  // of q, k, v, beta / b / w, y and their gradients; g, dg are fp32

  int64_t key_heads() const { return N / R; }
};

// FLOPs of the chunkwise algorithm, a multiply-add as 2, no padding counted.
double chunk_flops(const VariantInfo& v, const ProblemSize& w, bool backward);
// FLOPs of the step-by-step recurrence.
double recurrent_flops(const VariantInfo& v, const ProblemSize& w, bool backward);
// Bytes a pass must move: every input read once and every output written once.
double io_bytes(const VariantInfo& v, const ProblemSize& w, bool backward);

}  // namespace flat::tool

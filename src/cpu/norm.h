// Drivers of the output norm and gate: rows cut into blocks that depend on the shape only, the
// blocks split over the workers, per-thread workspaces, and the fixed-order reduction of the
// weight's gradient. The math of a row lives in the leaves (norm_kernels.h), per target; the
// call's Run says which target and which workers.
#pragma once

#include <cstdint>

#include "cpu/run.h"
#include "norm_params.h"

namespace flat::cpu {

// Elements per block of rows: 16K elements (32 to 64 KB of x) amortise a block's dweight
// partial sum (D floats) over many rows and still give 2 threads 16 blocks at B S N D = 512K.
constexpr int64_t kNormBlockElements = 16384;
int64_t norm_block_rows(int D);

void norm_gate_forward(const NormGateParams& p, const Run& run);
void norm_gate_backward(const NormGateParams& p, const Run& run);

}  // namespace flat::cpu

// The leaves of the output norm and gate: a range of rows, instantiated per target (norm_leaf.h
// over the target's microkernels, in src/cpu/target_<name>.cpp). The drivers in norm.cpp own
// threads and memory; a leaf never allocates and works in the workspace it is given.
#pragma once

#include <cstddef>
#include <cstdint>

#include "norm_params.h"

namespace flat::cpu {

struct NormGateKernels {
  // Floats of workspace for rows of D channels (64-byte aligned by the caller).
  size_t (*workspace_floats)(int D);
  // y of rows [begin, end), rows numbered r = (b * S + s) * N + n.
  void (*forward)(const NormGateParams& p, int64_t begin, int64_t end, float* workspace);
  // dx (and dg) of rows [begin, end), and partial = the sum over those rows of dL/dweight, in
  // weight's layout (weight_rows * D floats, overwritten).
  void (*backward)(const NormGateParams& p, int64_t begin, int64_t end, float* workspace, float* partial);
};

}  // namespace flat::cpu

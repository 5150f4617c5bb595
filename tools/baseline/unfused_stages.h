// The single-chunk stages of the unfused baseline (tools/baseline/unfused.cpp) as a CPU target
// provides them: one table per target, compiled with its flags (tools/baseline/single_chunk.h).
#pragma once

#include <cstddef>

#include "cpu/sequence_kernels.h"
#include "cpu/targets.h"
#include "params.h"

namespace flat::baseline {

// Per item (batch b, pack m of p.pack heads) and chunk c, in the item's workspace:
struct UnfusedStages {
  // Bytes of workspace one thread needs (64-byte aligned by the caller).
  size_t (*workspace_bytes)(const Params& p);
  // dH [K, pack * V] of item b * (N / pack) + m from dht (or 0), and its dh0 written from dH when asked;
  void (*initial_state_gradient)(const Params& p, int64_t item, float* dH);
  void (*final_state_gradient)(const Params& p, int64_t item, const float* dH);
  // y of chunk c from its start state H0;
  void (*chunk_output)(const Params& p, int b, int m, int c, void* workspace, const float* H0);
  // dH at the chunk's end -> dH at its start, in place;
  void (*chunk_state_gradient)(const Params& p, int b, int m, int c, void* workspace, float* dH);
  // dq, dk, dv, dg of chunk c from its start state and the gradient wrt its end state.
  void (*chunk_gradients)(const Params& p, int b, int m, int c, void* workspace, const float* H0,
                          const float* dH_end, const cpu::GradSinks& sinks);
};

// Each compiled target's table (one declaration per target of the list).
#define FLAT_CPU_TARGET(name) const UnfusedStages& unfused_stages_##name();
#include "flat_cpu_targets.inc"
#undef FLAT_CPU_TARGET

// The table of the target a call runs on.
const UnfusedStages& unfused_stages(const cpu::Target& target);

}  // namespace flat::baseline

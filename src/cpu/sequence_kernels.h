// The per-item stages of every variant (additive and delta rule) as a target provides them: a
// table of entry points into src/cpu/stages/, instantiated for the target's primitives
// (src/cpu/target_<name>.cpp). The drivers in recurrence.cpp own threads and memory; a stage
// never allocates and works in the workspace it is given.
#pragma once

#include <cstddef>
#include <cstdint>

#include "params.h"

namespace flat::cpu {

// Where one head's gradients go: straight to the outputs, or to fp32 scratch rows (b, s, n)
// that a fixed-order reduction sums over the heads sharing an input.
struct GradSinks {
  RowView dq, dk, dv, dg;
  RowView dbeta, db, dw;
};

// What the backward's state pass keeps of each chunk of a delta-rule item for its gradient pass
// (SequenceKernels::forward's `solves`), so that the gradient pass does not form it again: the
// chunk's solve T [C, C] and then its new values rv [C, pack * V], the rows past the chunk's
// tokens unused. None for the additive family.
inline size_t solve_record_floats(const Params& p) {
  return p.delta == Delta::none ? 0 : size_t(p.chunk) * (size_t(p.chunk) + size_t(p.pack) * size_t(p.V));
}
// Where T and rv lie in the record at `record` (Float: float where it is written, const float
// where it is read).
template <class Float>
struct SolveRecord {
  Float* solved;      // T [C, C], rows C apart
  Float* new_values;  // rv [C, pack * V], rows pack * V apart
};
template <class Float>
SolveRecord<Float> solve_record(const Params& p, Float* record) {
  return {record, record + size_t(p.chunk) * size_t(p.chunk)};
}

struct SequenceKernels {
  // Bytes of workspace one thread needs (64-byte aligned by the caller).
  size_t (*workspace_bytes)(const Params& p);

  // Items are (batch b, pack m of p.pack heads n = m * pack ...), numbered b * (N / pack) + m;
  // each has a [K, pack * V] state.
  // The fused forward of `count` consecutive items from `first`, in lockstep, chunk by chunk:
  // items next to each other are neighbouring heads, whose rows of a token share a page and its
  // cache lines, where one item alone reads a new page per row (rows of a head sit N heads
  // apart). The states start from h0 and end as the final states (written to ht when asked) in
  // `states`: without `every_chunk` one per item ([count, K, pack * V]) updated in place, staying
  // in cache for the whole sequence; with it, each chunk's start state and the final one
  // ([count, chunks + 1, K, pack * V]): the state updated in place in the final one's slot, each
  // chunk-start state streamed from it into its own slot, as bf16 where the gradient pass reads it
  // only through products that round it so (states_kept_as_bf16, src/cpu/stages/forward.h).
  // With `solves` (the delta rule), each chunk's solve record ([count, chunks,
  // solve_record_floats]); with `write_y`, computes and writes y.
  void (*forward)(const Params& p, int64_t first, int count, void* workspace, float* states, bool every_chunk,
                  float* solves, bool write_y);

  // The decode path (stages/step.h): the same items token by token, from h0 (or zero) to ht,
  // keeping the state after each token in its pool row where p.token_states asks (a problem of one
  // sequence). H [pack, K, V]: scratch for states nothing keeps.
  void (*step)(const Params& p, int64_t first, int count, void* workspace, float* H);

  // The gradient pass of `count` consecutive items from `first`, in lockstep as the forward's:
  // chunks in reverse, carrying dH [count, K, pack * V] (from dht; ends as dh0), given their
  // chunk-start states ([count, chunks + 1, K, pack * V], as the forward keeps them) and, for the
  // delta rule, their chunks' solve records ([count, chunks, solve_record_floats], or null: each
  // chunk's solve is formed again).
  void (*backward)(const Params& p, int64_t first, int count, void* workspace, const float* states,
                   const float* solves, float* dH, const GradSinks& sinks);
};

}  // namespace flat::cpu

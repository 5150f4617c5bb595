// Fused chunkwise CPU kernels for every variant: the additive family and the delta rule.
#pragma once

#include <deque>
#include <vector>

#include "cpu/run.h"
#include "cpu/sequence_kernels.h"
#include "params.h"

namespace flat::cpu {

// y (and ht) from the inputs: one pass per item (sequence, pack of heads) with the state kept in
// cache, neighbouring items in lockstep. A call with sequences (Params::sequences: cu_seqlens, a
// pool of states) runs each sequence as a call of its own would, so bitwise alike.
void recurrence_forward(const Params& p, const Run& run);

// Every input's gradient from dy, dht: per item a state-passing pass that keeps the chunk-start
// states, then a gradient pass over the chunks in reverse carrying dH.
void recurrence_backward(const Params& p, const Run& run);

// Shared by the fused drivers and the baselines built from the same stages (the baselines take no
// sequences). Work items of a call without sequences are (batch, pack of p.pack heads):
// item_count of them, each with a [K, pack * V] state.
size_t state_bytes(const Params& p);
int chunk_count(const Params& p);
int64_t item_count(const Params& p);

// How many items the backward runs in lockstep, from one item's kept records (its chunk-start
// states' bytes, its solves' bytes): up to 4, as many as keep each kind within one kept buffer
// (kKeptScratchBytes, cpu/buffer.h), at least 1.
int backward_lockstep(size_t item_states_bytes, size_t item_solves_bytes);

// Where each item's gradients go: straight to the outputs, or, for an input several items share,
// to fp32 scratch that finish() reduces over them in a fixed order (and, for retnet's
// per-sequence gate, over batch and tokens, in float64).
class Gradients {
 public:
  explicit Gradients(const Params& p);
  void finish(const Run& run) const;

  GradSinks sinks;

 private:
  struct Reduction {
    std::vector<float> scratch;  // [B, S, rows, width]
    RowView view;
    RowView out;
    int rows, group, width;
    bool over_sequence;
  };
  void add(RowView& sink, const RowView& out, int rows, int group, int width, bool over_sequence);

  const Params& p_;
  std::deque<Reduction> reductions_;  // stable addresses: the sinks point into the scratch
};

}  // namespace flat::cpu

// Fused chunkwise CPU kernels for the additive family (la, retnet, mamba2, gla).
#pragma once

#include <deque>
#include <vector>

#include "cpu/stages.h"
#include "params.h"

namespace flat::cpu {

// y (and ht) from q, k, v, g, h0: one pass per (batch, head) with the state kept in cache.
void additive_forward(const AdditiveParams& p);

// dq, dk, dv, dg, dh0 from dy, dht: per (batch, head) a state-passing pass that keeps the
// chunk-start states, then a gradient pass over the chunks in reverse carrying dH.
void additive_backward(const AdditiveParams& p);

// Shared by the fused drivers and the baselines built from the same stages. Work items are
// (batch, pack of p.pack heads): item_count of them, each with a [K, pack * V] state.
size_t state_bytes(const AdditiveParams& p);
int chunk_count(const AdditiveParams& p);
int64_t item_count(const AdditiveParams& p);

// Where each item's gradients go: straight to the outputs, or, for an input several items share,
// to fp32 scratch that finish() reduces over them in a fixed order (and, for retnet's
// per-sequence gate, over batch and tokens, in float64).
class Gradients {
 public:
  explicit Gradients(const AdditiveParams& p);
  void finish() const;

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

  const AdditiveParams& p_;
  std::deque<Reduction> reductions_;  // stable addresses: the sinks point into the scratch
};

}  // namespace flat::cpu

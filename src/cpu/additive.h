// Fused chunkwise CPU kernels for the additive family (la, retnet, mamba2, gla).
#pragma once

#include <vector>

#include "cpu/stages.h"
#include "params.h"

namespace flat::cpu {

// y (and ht) from q, k, v, g, h0: one pass per (batch, head) with the state kept in cache.
void additive_forward(const AdditiveParams& p);

// dq, dk, dv, dg, dh0 from dy, dht: per (batch, head) a state-passing pass that keeps the
// chunk-start states, then a gradient pass over the chunks in reverse carrying dH.
void additive_backward(const AdditiveParams& p);

// Shared by the fused drivers and the baselines built from the same stages.
size_t state_bytes(const AdditiveParams& p);
int chunk_count(const AdditiveParams& p);
void store_state(const RowView& view, int b, int n, const float* H, int K, int V);

// Where each head's gradients go: straight to the outputs, or, for an input several heads share,
// to fp32 scratch that finish() reduces over those heads in a fixed order (and, for retnet's
// per-sequence gate, over batch and tokens, in float64).
class Gradients {
 public:
  explicit Gradients(const AdditiveParams& p);
  void finish() const;

  GradSinks sinks;

 private:
  RowView sink(std::vector<float>& scratch, const RowView& out, bool reduced, int width);

  const AdditiveParams& p_;
  const int gate_width_;
  const bool gate_reduced_;
  std::vector<float> q_, k_, v_, g_;
};

}  // namespace flat::cpu

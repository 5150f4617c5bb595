// Fused chunkwise CPU kernels for the additive family (la, retnet, mamba2, gla).
#pragma once

#include "params.h"

namespace flat::cpu {

// y (and ht) from q, k, v, g, h0: one pass per (batch, head) with the state kept in cache.
void additive_forward(const AdditiveParams& p);

// dq, dk, dv, dg, dh0 from dy, dht: per (batch, head) a state-passing pass that keeps the
// chunk-start states, then a gradient pass over the chunks in reverse carrying dH.
void additive_backward(const AdditiveParams& p);

}  // namespace flat::cpu

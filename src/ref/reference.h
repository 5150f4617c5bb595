// The float64 oracle: the recurrences of the spec run one token at a time, forward, and the
// backward as the reverse walk. Slow and simple on purpose; every fast path is tested against it.
#pragma once

#include <vector>

#include "flat/flat.h"

namespace flat::ref {

struct Problem {
  Variant variant = Variant::la;
  int B = 1, S = 1, Nq = 1, Nk = 1, Nv = 1, Ng = 1, K = 1, V = 1;
  double scale = 1.0;
  bool l2norm = false;

  int N() const;
  bool has_gate() const { return variant != Variant::la; }
  // Elements of g in its layout: [Ng] retnet, [B, S, Ng] mamba2, [B, S, Ng, K] gla, none for la.
  size_t gate_size() const;
};

// Dense row-major tensors in the spec's layouts: q [B, S, Nq, K], k [B, S, Nk, K],
// v [B, S, Nv, V], g as above, h0 [B, N, K, V] or empty for a zero initial state.
struct Inputs {
  std::vector<double> q, k, v, g, h0;
};

struct Outputs {
  std::vector<double> y;   // [B, S, N, V]
  std::vector<double> ht;  // [B, N, K, V]
};

// Each gradient in its input's layout; dh0 always [B, N, K, V].
struct Gradients {
  std::vector<double> dq, dk, dv, dg, dh0;
};

Outputs forward(const Problem& problem, const Inputs& in);
// dht empty means zero.
Gradients backward(const Problem& problem, const Inputs& in, const std::vector<double>& dy,
                   const std::vector<double>& dht);

}  // namespace flat::ref

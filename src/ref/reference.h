// The float64 oracle: the recurrences of the spec run one token at a time, forward, and the
// backward as the reverse walk. Slow and simple on purpose; every fast path is tested against it.
#pragma once

#include <vector>

#include "flat/flat.h"
#include "variants.h"

namespace flat::ref {

struct Problem {
  Variant variant = Variant::la;
  // Head counts of q, k, v, g, beta or b (Nb) and w (Nw); only those the variant reads count.
  int B = 1, S = 1, Nq = 1, Nk = 1, Nv = 1, Ng = 1, Nb = 1, Nw = 1, K = 1, V = 1;
  // Channels per gate value for kda, gdn2 and sla: g holds K / G values per head and token.
  int G = 1;
  double scale = 1.0;
  bool l2norm = false;

  // What the variant is made of (src/variants.h).
  const VariantInfo& info() const { return flat::info(variant); }
  int N() const;
  bool has_gate() const { return info().has_gate(); }
  // The delta rule with one write strength per head and token: b = w = beta.
  bool has_beta() const { return info().has_beta(); }
  // The erase gate b [K] and write gate w [V] instead of beta.
  bool has_erase_write() const { return info().has_erase_write(); }
  // Gate values per head and token: 1 for a scalar gate, K per channel, K / G per group.
  int gate_width() const { return int(info().gate_width(K, G)); }
  // Elements of g in its layout ([Ng] for a per-sequence gate); none without a gate.
  size_t gate_size() const;
};

// Dense row-major tensors in the spec's layouts: q [B, S, Nq, K], k [B, S, Nk, K],
// v [B, S, Nv, V], g as above, h0 [B, N, K, V] or empty for a zero initial state; beta
// [B, S, Nb] (delta family but gdn2), b [B, S, Nb, K] and w [B, S, Nw, V] (gdn2), empty where
// the variant takes none.
struct Inputs {
  std::vector<double> q, k, v, g, h0;
  std::vector<double> beta, b, w;
};

struct Outputs {
  std::vector<double> y;   // [B, S, N, V]
  std::vector<double> ht;  // [B, N, K, V]
};

// Each gradient in its input's layout (empty where there is no such input); dh0 always
// [B, N, K, V].
struct Gradients {
  std::vector<double> dq, dk, dv, dg, dh0;
  std::vector<double> dbeta, db, dw;
};

Outputs forward(const Problem& problem, const Inputs& in);
// dht empty means zero.
Gradients backward(const Problem& problem, const Inputs& in, const std::vector<double>& dy,
                   const std::vector<double>& dht);

}  // namespace flat::ref

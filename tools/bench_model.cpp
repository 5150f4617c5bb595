#include "bench_model.h"

#include <algorithm>

namespace flat::tool {

namespace {

// The variants measured at a shape of their own: SLA as its paper shapes it (keys 256 wide, each
// shared by 4 value heads).
struct OwnShape {
  Variant variant;
  BenchShape shape;
};
constexpr OwnShape kOwnShapes[] = {{.variant = Variant::sla, .shape = {.K = 256, .value_heads = 4}}};

}  // namespace

BenchShape bench_shape(Variant variant) {
  for (const OwnShape& own : kOwnShapes)
    if (own.variant == variant) return own.shape;
  return {};
}

// Per item (batch and key head, its R value heads side by side: W = R*V) and chunk of L tokens,
// with tri = L(L+1)/2 causal score entries (tri' = L(L-1)/2 strictly causal):
//   additive forward  tri*(K + W) + 2*L*K*W
//   additive backward tri*(3K + 2W) + 5*L*K*W
//   delta forward     the additive forward with v := the new values, plus the chunk solve:
//                     tri'*K (L) + L^3/6 (T) + L*K*W (Bp H0) + tri*W (T Z)
//   delta backward    the additive backward, plus the solve once (the state pass forms it and keeps
//                     T and the new values for the gradient pass), plus dZ = T^T dR (tri*W),
//                     dL = dZ R^T (tri'*W), dBp = dZ H0^T (L*K*W), dL through L (2*tri'*K),
//                     and Bp^T dZ into dH (L*K*W)
double chunk_flops(const VariantInfo& v, const ProblemSize& w, bool backward) {
  double total = 0;
  const double K = double(w.K), W = double(w.V * w.R);
  for (int64_t t0 = 0; t0 < w.S; t0 += w.chunk) {
    const double L = double(std::min<int64_t>(w.chunk, w.S - t0));
    const double tri = L * (L + 1) / 2, strict = L * (L - 1) / 2, lkw = L * K * W;
    total += backward ? tri * (3 * K + 2 * W) + 5 * lkw : tri * (K + W) + 2 * lkw;
    if (!v.is_delta()) continue;
    const double solve = strict * K + L * L * L / 6 + lkw + tri * W;
    total += backward ? solve + tri * W + strict * W + lkw + 2 * strict * K + lkw : solve;
  }
  return 2 * total * double(w.B * w.key_heads());
}

// Per token and head in units of K*V (a multiply-add 2):
//   additive forward 5 (decay and k v^T into the state 3, y 2); backward 17 (the state advanced
//   twice, once to take the checkpoints and once to replay each segment, 6; dq 2; q dy^T into dH
//   2; dk 2; dv 2; the gate's dot product 2; dH's decay 1).
//   delta forward 7 (decay 1, r 2, k r^T 2, y 2); backward 26 (the state advanced twice 10, dq 2,
//   q dy^T 2, dk 2, dr 2, dH' 2, dbt 2, the gate's dot product 2, dH's decay 1, H' 1).
double recurrent_flops(const VariantInfo& v, const ProblemSize& w, bool backward) {
  const double per_token = v.is_delta() ? (backward ? 26.0 : 7.0) : (backward ? 17.0 : 5.0);
  return per_token * double(w.K) * double(w.V) * double(w.B * w.S * w.N);
}

// At their dtypes: forward reads q, k, v, g (and beta, or b and w) and writes y; backward reads
// those and dy and writes every gradient.
double io_bytes(const VariantInfo& v, const ProblemSize& w, bool backward) {
  const double element = w.dtype == DType::bf16 ? 2 : 4;
  const double tokens = double(w.B * w.S);
  const double qk = tokens * double(2 * w.key_heads() * w.K) * element;
  const double values = tokens * double(w.N * w.V) * element, y = values;
  const double gate = v.gate == Gate::per_sequence
                          ? double(w.N)
                          : tokens * double(w.key_heads()) * double(v.gate_width(w.K, w.G));
  double strengths = 0;
  if (v.has_beta()) strengths = tokens * double(w.key_heads());
  if (v.has_erase_write()) strengths = tokens * double(w.N * w.K + w.N * w.V);
  const double inputs = qk + values + gate * 4 + strengths * element;
  return backward ? 2 * inputs + y : inputs + y;
}

}  // namespace flat::tool

#include "variants.h"

#include <algorithm>
#include <string>

namespace flat {
namespace {

// The table. The math of each row: docs/variants.md.
constexpr VariantInfo kVariants[] = {
    {Variant::la, "la", Gate::none, Update::additive, 0, "H = H + k v^T", 0, 1},
    {Variant::retnet, "retnet", Gate::per_sequence, Update::additive, 0, "H = gamma H + k v^T, gamma per head", 0, 1},
    {Variant::mamba2, "mamba2", Gate::per_token, Update::additive, 0, "H = exp(g_t) H + k v^T, g_t per head", 0, 1},
    {Variant::gla, "gla", Gate::per_channel, Update::additive, 0, "H = Diag(exp(g_t)) H + k v^T", 0, 1},
    {Variant::deltanet, "deltanet", Gate::none, Update::delta, 0, "H = (I - beta k k^T) H + beta k v^T", 0, 1},
    {Variant::gated_deltanet, "gated_deltanet", Gate::per_token, Update::delta, 0,
     "H = exp(g_t) (I - beta k k^T) H + beta k v^T", 0, 1},
    {Variant::kda, "kda", Gate::grouped, Update::delta, 0, "H = (I - beta k k^T) Diag(exp(g_t)) H + beta k v^T", 0, 1},
    {Variant::gdn2, "gdn2", Gate::grouped, Update::erase_write, 0,
     "H' = Diag(exp(g_t)) H; H = H' + k (w * v - H'^T (b * k))^T", 0, 1},
    {Variant::sla, "sla", Gate::grouped, Update::delta, 64, "kda with one gate per 64 channels, value heads sharing keys", 256, 4},
};

}  // namespace

std::span<const VariantInfo> all_variants() { return kVariants; }

const VariantInfo& info(Variant variant) {
  for (const VariantInfo& v : kVariants)
    if (v.variant == variant) return v;
  throw Error("flat: unknown variant " + std::to_string(int(variant)));
}

std::string_view variant_name(Variant variant) { return info(variant).name; }

Variant parse_variant(std::string_view name) {
  std::string names;
  for (const VariantInfo& v : kVariants) {
    if (v.name == name) return v.variant;
    names += names.empty() ? "" : ", ";
    names += v.name;
  }
  throw Error("flat: unknown variant '" + std::string(name) + "' (expected one of " + names + ")");
}

int64_t VariantInfo::gate_width(int64_t K, int64_t G) const {
  switch (gate) {
    case Gate::none: return 0;
    case Gate::per_sequence:
    case Gate::per_token: return 1;
    case Gate::per_channel: return K;
    case Gate::grouped: return K / G;
  }
  return 0;
}

std::vector<int64_t> VariantInfo::gate_shape(int64_t B, int64_t S, int64_t Ng, int64_t K, int64_t G) const {
  switch (gate) {
    case Gate::none: return {};
    case Gate::per_sequence: return {Ng};
    case Gate::per_token: return {B, S, Ng};
    case Gate::per_channel:
    case Gate::grouped: return {B, S, Ng, gate_width(K, G)};
  }
  return {};
}

std::vector<std::string> VariantInfo::gate_axes() const {
  switch (gate) {
    case Gate::none: return {};
    case Gate::per_sequence: return {"Ng"};
    case Gate::per_token: return {"B", "S", "Ng"};
    case Gate::per_channel: return {"B", "S", "Ng", "K"};
    case Gate::grouped: return {"B", "S", "Ng", "K/G"};
  }
  return {};
}

// Per item (batch and key head, its R value heads side by side: W = R*V) and chunk of L tokens,
// with tri = L(L+1)/2 causal score entries (tri' = L(L-1)/2 strictly causal):
//   additive forward  tri*(K + W) + 2*L*K*W
//   additive backward tri*(3K + 2W) + 5*L*K*W
//   delta forward     the additive forward with v := the new values, plus the chunk solve:
//                     tri'*K (L) + L^3/6 (T) + L*K*W (Bp H0) + tri*W (T Z)
//   delta backward    the additive backward, plus the solve twice (state pass and gradient pass:
//                     2*(tri'*K + L^3/6 + L*K*W + tri*W)), plus dZ = T^T dR (tri*W),
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
    total += backward ? 2 * solve + tri * W + strict * W + lkw + 2 * strict * K + lkw : solve;
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

}  // namespace flat

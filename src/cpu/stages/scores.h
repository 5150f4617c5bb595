// Intra-chunk scores A_ij = <q_i * F_ij, k_j> and their adjoint, for scalar and per-channel
// decay (the cross-block factorisation through a reference row; exact pairwise factors in the
// diagonal blocks).
//
// Everything here has internal linkage (an anonymous namespace): each target's translation unit
// (src/cpu/target_<name>.cpp) compiles its own copy with its own flags, so no out-of-line copy
// built for one instruction set is picked by the linker for another. For the same reason it uses
// no standard-library templates but header-only ones that inline.
#pragma once

#include "cpu/stages/products.h"

namespace flat::cpu::stages {
namespace {

// Per-channel factors for the block [j0, j1) with reference row r = j1 - 1:
//   pre_j  = F_rj for the block's keys, ks_j = keys_j * pre_j
//   post_i = F_ir for the queries i in [j1, L), qs_i = queries_i * post_i
void block_factors(Chunk& ch, const float* queries, const float* keys, int j0, int j1) {
  const int K = ch.K, L = ch.L;
  const int r = j1 - 1;
  for (int c = 0; c < K; ++c) ch.pre[size_t(r - j0) * K + c] = 1.0f;
  for (int j = r - 1; j >= j0; --j)
    for (int c = 0; c < K; ++c)
      ch.pre[size_t(j - j0) * K + c] = ch.pre[size_t(j + 1 - j0) * K + c] * ch.decay[size_t(j + 1) * K + c];
  std::memcpy(ch.post, ch.decay + size_t(j1) * K, sizeof(float) * K);
  for (int i = j1 + 1; i < L; ++i)
    for (int c = 0; c < K; ++c)
      ch.post[size_t(i - j1) * K + c] = ch.post[size_t(i - 1 - j1) * K + c] * ch.decay[size_t(i) * K + c];
  for (size_t e = 0; e < size_t(j1 - j0) * K; ++e) ch.ks[e] = keys[size_t(j0) * K + e] * ch.pre[e];
  for (size_t e = 0; e < size_t(L - j1) * K; ++e) ch.qs[e] = queries[size_t(j1) * K + e] * ch.post[e];
}

// Scalar gate: D_ij = F_ij for j <= i (j < i when strict), 0 elsewhere, applied in place, with
// row i's factor and column j's (either absent: 1). Row by row, F_i. = F_{i-1}. * a_i over the keys
// before i and F_ii = 1: whole rows of vectors, where a running product along each row (f *= a_j,
// one dependent multiply per pair) took a fifth of mamba2's forward beside its products, in cache,
// on an EPYC Zen 3. Without a gate or factors (la, deltanet on fp32 FMA units) every factor is 1:
// only the causal mask is written.
void apply_scalar_decay(Chunk& ch, float* m, bool strict, const float* row_factor = nullptr,
                        const float* column_factor = nullptr) {
  const int C = ch.C, L = ch.L;
  if (!ch.gated && !row_factor && !column_factor) {
    for (int i = 0; i < L; ++i) {
      float* row = m + size_t(i) * C;
      for (int j = i + 1; j < L; ++j) row[j] = 0.f;
      if (strict) row[i] = 0.f;
    }
    return;
  }
  float* F = ch.key_decays;
  for (int i = 0; i < L; ++i) {
    const float a = ch.decay[i];
    for (int j = 0; j < i; ++j) F[j] *= a;
    F[i] = 1.0f;
    float* row = m + size_t(i) * C;
    const float f = row_factor ? row_factor[i] : 1.0f;
    if (column_factor) {
      for (int j = 0; j <= i; ++j) row[j] *= f * F[j] * column_factor[j];
    } else {
      for (int j = 0; j <= i; ++j) row[j] *= f * F[j];
    }
    for (int j = i + 1; j < L; ++j) row[j] = 0.f;
    if (strict) row[i] = 0.f;
  }
}

// Scalar gate: out_ij = queries_i . keys_j for j <= i on the keys' rows transposed (keys_t, packed
// once by the caller), then the decays and both sides' factors (apply_scalar_decay); `raw` as in
// intra_scores (below).
template <class Ops>
void scalar_gate_scores(Chunk& ch, const ScaledRows& queries, const ScaledRows& keys, PackedB keys_t, float* out,
                        bool strict, float* raw = nullptr) {
  const int C = ch.C, L = ch.L;
  gemm_packed<Ops>(ch, L, L, ch.K, queries.rows, ch.K, keys_t, out, C, false, Triangle::c_lower, queries.values,
                   keys.values, queries.bf16);
  if (raw)
    for (int i = 0; i < L; ++i) std::memcpy(raw + size_t(i) * C, out + size_t(i) * C, sizeof(float) * size_t(i + 1));
  apply_scalar_decay(ch, out, strict, queries.factor, keys.factor);
}

// out_ij = <queries_i * F_ij, keys_j> for j <= i (j < i when strict), 0 elsewhere: [L, L], from the
// rows [L, K] (`queries`, `keys`) and, where the gate is scalar (the decay applied to the
// product), as the products read them (`queries_read`, `keys_read`: bf16 rows, their factors applied
// with the decay); there, `raw` (when given) receives the product before factors and decay (its
// lower triangle, diagonal included).
template <class Ops>
void intra_scores(Chunk& ch, const float* queries, const float* keys, const ScaledRows& queries_read,
                  const ScaledRows& keys_read, float* out, bool strict, float* raw = nullptr) {
  const int C = ch.C, K = ch.K, L = ch.L;
  if (ch.W == 1) {
    const PackedB keys_t = transposed_b<Ops>(ch, L, K, keys_read.rows, K, ch.packed, keys_read.values,
                                             queries_read.values, queries_read.values, keys_read.bf16);
    scalar_gate_scores<Ops>(ch, queries_read, keys_read, keys_t, out, strict, raw);
    return;
  }
  for (int i = 0; i < L; ++i) zero(out + size_t(i) * C, size_t(L));
  for (int j0 = 0; j0 < L; j0 += kDiagBlock) {
    const int j1 = imin(j0 + kDiagBlock, L);
    const size_t row = size_t(j0) * K;
    Ops::diagonal_scores(j1 - j0, K, queries + row, keys + row, ch.decay + row, out + size_t(j0) * C + j0, C, ch.pair);
    if (j1 < L) {
      block_factors(ch, queries, keys, j0, j1);
      gemm_nt<Ops>(ch, L - j1, j1 - j0, K, ch.qs, K, ch.ks, K, out + size_t(j1) * C + j0, C, false);
    }
  }
  if (strict)
    for (int i = 0; i < L; ++i) out[size_t(i) * C + i] = 0.f;
}

// Scalar gate: intra_scores of two row sets against the chunk's keys, `first` strict (the delta
// rule's L, from bt) and `second` not (the output's scores, from q), on one transpose of the keys:
// the two products share B in one call where they can (one_call; a target that packs B packs it
// once, Ops::gemm_shared_b), where each intra_scores transposed the keys again.
template <class Ops>
void intra_scores_sharing_keys(Chunk& ch, const ScaledRows& first, float* first_out, const ScaledRows& second,
                               float* second_out) {
  const int C = ch.C, K = ch.K, L = ch.L;
  const ScaledRows& keys = ch.keys;
  const PackedB keys_t =
      transposed_b<Ops>(ch, L, K, keys.rows, K, ch.packed, keys.values, first.values, second.values);
  if (!one_call(ch, first.values, second.values)) {
    scalar_gate_scores<Ops>(ch, first, keys, keys_t, first_out, true);
    scalar_gate_scores<Ops>(ch, second, keys, keys_t, second_out, false);
    return;
  }
  gemm_packed_sharing_b<Ops>(ch, L, L, K, keys_t, K, first.rows, first_out, second.rows, second_out, C,
                             Triangle::c_lower, keys.values, one_call_values(first.values, second.values));
  apply_scalar_decay(ch, first_out, true, first.factor, keys.factor);
  apply_scalar_decay(ch, second_out, false, second.factor, keys.factor);
}

// Adds the strictly causal (j < i) intra-chunk parts of the gradients of the queries and keys
// given dS, the gradient of intra_scores' output (only j <= i is read). The diagonal dS_ii goes
// to `diagonal` when given (its share of q * dq and k * dk cancels exactly in the gate gradient,
// so it is added only after that); a strict dS has none. The rows as intra_scores takes them; under
// a scalar gate the products read `keys_read` and `queries_read`, their factors applied to dS's
// columns and rows (on the sums' index).
template <class Ops>
void intra_backward(Chunk& ch, float* dS, const float* queries, const float* keys, const ScaledRows& queries_read,
                    const ScaledRows& keys_read, float* dqueries, float* dkeys, float* diagonal) {
  const int C = ch.C, K = ch.K, L = ch.L;
  if (diagonal)
    for (int i = 0; i < L; ++i) diagonal[i] = dS[size_t(i) * C + i];
  if (ch.W == 1) {
    apply_scalar_decay(ch, dS, true);
    const ScaledOperand for_keys = scaled_operand(ch, dS, C, keys_read.factor, FactorsAlong::columns, L, L);
    gemm_nn<Ops>(ch, L, K, L, for_keys.data, for_keys.ld, keys_read.rows, K, dqueries, K, true, Triangle::a_lower,
                 Operands::f32, keys_read.values);
    const ScaledOperand for_queries = scaled_operand(ch, dS, C, queries_read.factor, FactorsAlong::rows, L, L);
    gemm_tn<Ops>(ch, L, K, L, for_queries.data, for_queries.ld, queries_read.rows, K, dkeys, K, true,
                 Triangle::a_upper, Operands::f32, queries_read.values);
    return;
  }
  for (int j0 = 0; j0 < L; j0 += kDiagBlock) {
    const int j1 = imin(j0 + kDiagBlock, L);
    const size_t row = size_t(j0) * K;
    Ops::diagonal_gradients(j1 - j0, K, queries + row, keys + row, ch.decay + row, dS + size_t(j0) * C + j0, C,
                       dqueries + row, dkeys + row, ch.pair);
    if (j1 < L) {
      block_factors(ch, queries, keys, j0, j1);
      const float* panel_dS = dS + size_t(j1) * C + j0;
      gemm_nn<Ops>(ch, L - j1, K, j1 - j0, panel_dS, C, ch.ks, K, ch.panel, K, false);
      add_scaled_rows(dqueries + size_t(j1) * K, ch.panel, ch.post, L - j1, K);
      gemm_tn<Ops>(ch, j1 - j0, K, L - j1, panel_dS, C, ch.qs, K, ch.panel, K, false);
      add_scaled_rows(dkeys + size_t(j0) * K, ch.panel, ch.pre, j1 - j0, K);
    }
  }
}

}  // namespace
}  // namespace flat::cpu::stages

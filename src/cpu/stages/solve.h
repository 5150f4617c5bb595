// The delta rule's chunk solve T = (I + L)^-1 three ways, and the new values R = T (Vt - Bp H0).
//
// Everything here has internal linkage (an anonymous namespace): each target's translation unit
// (src/cpu/target_<name>.cpp) compiles its own copy with its own flags, so no out-of-line copy
// built for one instruction set is picked by the linker for another. For the same reason it uses
// no standard-library templates but header-only ones that inline.
#pragma once

#include "cpu/stages/scores.h"

namespace flat::cpu::stages {
namespace {

// ---- The delta rule's chunk solve -------------------------------------------------------------
//
// Within a chunk, r_t = vt_t - (Diag(a_t) H_{t-1})^T bt_t and H_t = Diag(a_t) H_{t-1} + k_t r_t^T
// give (I + L) R = Vt - (Bt * P) H0 with L_ij = <bt_i * F_ij, k_j> (j < i): R = T (Vt - Bp H0),
// T = (I + L)^-1, a unit lower triangular [L, L] matrix. Three exact ways to form T.

// T[i, :] = e_i - sum_{m<i} L[i, m] T[m, :] for the rows [i0, i1) of a diagonal block, whose
// columns are [i0, i1): plain forward substitution.
void substitute_block(const float* Lm, float* T, int ld, int i0, int i1) {
  for (int i = i0; i < i1; ++i) {
    float* ti = T + size_t(i) * ld;
    for (int j = i0; j < i1; ++j) ti[j] = j == i ? 1.0f : 0.f;
    for (int m = i0; m < i; ++m) {
      const float l = -Lm[size_t(i) * ld + m];
      const float* tm = T + size_t(m) * ld;
      for (int j = i0; j <= m; ++j) ti[j] += l * tm[j];
    }
  }
}

// Rows [i0, i1) of T below the diagonal block, columns [0, i0), from the rows above it:
//   T[I, :I] = -T_II L[I, :I] T[:I, :I]   (block forward substitution, two products)
template <class Ops>
void merge_rows(Chunk& ch, int i0, int i1) {
  const int C = ch.C;
  float* T = ch.solved;
  gemm_nn<Ops>(ch, i1 - i0, i0, i0, ch.lower + size_t(i0) * C, C, T, C, ch.panel, i0, false, Triangle::none);
  gemm_nn<Ops>(ch, i1 - i0, i0, i1 - i0, T + size_t(i0) * C + i0, C, ch.panel, i0, T + size_t(i0) * C, C, false,
          Triangle::a_lower);
  for (int i = i0; i < i1; ++i)
    for (int j = 0; j < i0; ++j) T[size_t(i) * C + j] = -T[size_t(i) * C + j];
}

template <class Ops>
void solve(const Params& p, Chunk& ch) {
  const int C = ch.C, L = ch.L;
  float* T = ch.solved;
  for (int i = 0; i < L; ++i) zero(T + size_t(i) * C, size_t(L));
  switch (p.solve) {
    case Solve::substitution:
      substitute_block(ch.lower, T, C, 0, L);
      return;
    case Solve::automatic:
    case Solve::blocked:
      // 16 x 16 diagonal blocks by substitution, then each block row from the ones above it.
      for (int i0 = 0; i0 < L; i0 += kDiagBlock) {
        const int i1 = imin(i0 + kDiagBlock, L);
        substitute_block(ch.lower, T, C, i0, i1);
        if (i0 > 0) merge_rows<Ops>(ch, i0, i1);
      }
      return;
    case Solve::doubling:
      // From 1 x 1 blocks (T_ii = 1) up: the inverse of [[A, 0], [X, D]] is
      // [[A^-1, 0], [-D^-1 X A^-1, D^-1]], two products per merge and nothing else.
      for (int i = 0; i < L; ++i) T[size_t(i) * C + i] = 1.0f;
      for (int size = 1; size < L; size *= 2)
        for (int a0 = 0; a0 + size < L; a0 += 2 * size) {
          const int d0 = a0 + size, d1 = imin(d0 + size, L);
          // panel = X A^-1, then T[D, A] = -D^-1 panel.
          gemm_nn<Ops>(ch, d1 - d0, size, size, ch.lower + size_t(d0) * C + a0, C, T + size_t(a0) * C + a0, C, ch.panel,
                  size, false, Triangle::none);
          gemm_nn<Ops>(ch, d1 - d0, size, d1 - d0, T + size_t(d0) * C + d0, C, ch.panel, size, T + size_t(d0) * C + a0, C,
                  false, Triangle::a_lower);
          for (int i = d0; i < d1; ++i)
            for (int j = a0; j < d0; ++j) T[size_t(i) * C + j] = -T[size_t(i) * C + j];
        }
      return;
  }
}

// bt = b * k and bp = bt * P: the delta rule's rows of the keys' side of the chunk, elementwise.
// With beta per token, bt is k's rows read with beta among their factors.
void delta_rows(const Params& p, Chunk& ch) {
  const int K = ch.K, L = ch.L;
  if (p.delta == Delta::beta) {
    scale_rows(ch.bt, ch.k, ch.beta, L, K, 1);
    for (int i = 0; i < L; ++i) ch.bt_factor[i] = ch.keys.factor ? ch.beta[i] * ch.keys.factor[i] : ch.beta[i];
    ch.erase_keys = {ch.keys.rows, ch.bt_factor, ch.keys.values};
  } else {
    for (size_t e = 0; e < size_t(L) * K; ++e) ch.bt[e] = ch.erase[e] * ch.k[e];
    ch.erase_keys = {ch.bt, nullptr, Operands::f32};
  }
  ch.decayed_erase = decayed(ch, ch.erase_keys, ch.bt, ch.prefix, ch.bp_factor, ch.bp);
}

// The rows (delta_rows), L and T: everything of the delta rule that does not depend on the
// chunk-start state. With `with_scores`, under a scalar gate, the output's scores too (into
// ch.scores), on L's transposed keys; returns whether it formed them.
template <class Ops>
bool prepare_delta(const Params& p, Chunk& ch, bool with_scores = false) {
  delta_rows(p, ch);
  const bool scores = with_scores && ch.W == 1;
  if (scores)
    intra_scores_sharing_keys<Ops>(ch, ch.erase_keys, ch.lower, ch.queries, ch.scores);
  else
    intra_scores<Ops>(ch, ch.bt, ch.k, ch.erase_keys, ch.keys, ch.lower, true);
  solve<Ops>(p, ch);
  return scores;
}

// The new values rv = T (vt - bp H0) with vt = beta v (or w * v), dz holding bp H0 for the
// chunk-start state H0 (state_products, forward.h), and vt - bp H0 after.
template <class Ops>
void delta_values(const Params& p, Chunk& ch) {
  const int C = ch.C, VW = ch.VW, L = ch.L;
  for (int i = 0; i < L; ++i) {
    const float* vi = ch.v + size_t(i) * VW;
    float* dzi = ch.dz + size_t(i) * VW;
    if (p.delta == Delta::beta) {
      const float beta = ch.beta[i];
      for (int j = 0; j < VW; ++j) dzi[j] = beta * vi[j] - dzi[j];
    } else {
      const float* wi = ch.write + size_t(i) * VW;
      for (int j = 0; j < VW; ++j) dzi[j] = wi[j] * vi[j] - dzi[j];
    }
  }
  gemm_nn<Ops>(ch, L, VW, L, ch.solved, C, ch.dz, VW, ch.rv, VW, false, Triangle::a_lower);
}

}  // namespace
}  // namespace flat::cpu::stages

// The backward of one chunk (every input's gradient from the chunk-start state and dH) and the
// gradient pass of an item, chunks in reverse.
//
// Everything here has internal linkage (an anonymous namespace): each target's translation unit
// (src/cpu/target_<name>.cpp) compiles its own copy with its own flags, so no out-of-line copy
// built for one instruction set is picked by the linker for another. For the same reason it uses
// no standard-library templates but header-only ones that inline.
#pragma once

#include "cpu/stages/forward.h"

namespace flat::cpu::stages {
namespace {

// ---- Backward ---------------------------------------------------------------------------------
//
// Gradient wrt the log gates. Differentiating the chunk's prefix sums of g gives, for token t,
//   dg_t = sum_{s>=t} (q_s * dq_s + bt_s * dbt_s - k_s * dk_s) + <dH_end, H_end>   (per channel)
// (seed paper, Backward Recurrence; the delta rule's erase rows bt decay like queries). Written
// out, terms of equal magnitude and opposite sign in it cancel exactly: the diagonal scores, and
// the keys j >= t against the boundary term. What remains, evaluated without forming the
// cancelling pairs, is
//   dg_t = sum_{s>=t} (q_s * dq'_s + bt_s * dbt_s - k_s * dk'_s) + sum_{j<t} k_j * dk_state_j
//          + P_{L-1} * <dH_end, H0>
// with dq', dk' the parts of dq, dk that are strictly causal or go through H0, and
// dk_state = R * (values dH^T). So strong decay keeps its relative accuracy: every term carries
// the decay that makes it small.

// <dH_c, H0_c>: row c of dH [K, VW] against row c of the chunk-start state as the state pass kept
// it, fp32 (H0) or bf16 (H0_bf16, states_kept_as_bf16: the gate's boundary term then reads the
// state rounded once to bf16, as its products do at fast precision), widened a piece at a time.
template <class Ops>
float boundary_row(const float* dH, const float* H0, const Bf16Rows& H0_bf16, int c, int VW) {
  const float* d = dH + size_t(c) * VW;
  if (!H0_bf16.present()) return Ops::dot(d, H0 + size_t(c) * VW, VW);
  constexpr int kPiece = 128;
  float wide[kPiece], sum = 0.0f;
  for (int j = 0; j < VW; j += kPiece) {
    const int n = imin(kPiece, VW - j);
    const uint16_t* h = H0_bf16.at(c, j);
    for (int x = 0; x < n; ++x) wide[x] = bf16_to_f32(h[x]);
    sum += Ops::dot(d + j, wide, n);
  }
  return sum;
}

// Additive family, scalar gate: summed over channels the pair terms are dscores_ij * scores_ij,
// so sum_{s>=t} (q_s dq'_s - k_s dk'_s) is the rectangle sum over (i >= t, j < t) of those plus
// the queries' state terms, O(L^2) on the score tiles. Row dot products in fp32, everything
// summed across rows and pairs in float64: L^2 terms of both signs.
//
// Every term is formed in float64 from its undecayed parts and its decay, exp of a sum of log
// decays: behind gates of -84 per token (a decay of 4e-37 per token) the gradient is a normal
// number, 3.8e-37, made of terms that the fp32 decayed scores, dq and dk_state would take
// through the flushed subnormal range (docs/algorithm.md, "Subnormal numbers"). So the pair terms
// read the scores before their decay (ch.raw_scores, with the rows' factors) times
// F_ij = exp(g_{j+1} + ... + g_i); the queries' state terms q_s . dq_s = P_s (q_s . (dY H0^T)_s)
// with dq_unscaled = dY H0^T; the keys' ones k_j . dk_state_j = R_j (k_j . (values dH^T)_j), their
// dot products taken by key_state_terms; and the boundary term P_{L-1} <dH, H0>.
// Call after key_state_terms and before intra_backward (it reads the raw dscores).
template <class Ops>
void key_state_terms(Chunk& ch, const float* values_dH) {
  for (int j = 0; j < ch.L; ++j)
    ch.key_terms[j] = Ops::dot(ch.k + size_t(j) * ch.K, values_dH + size_t(j) * ch.K, ch.K);
}

// The pairs' factors F_tj = exp(g_{j+1} + ... + g_t) are running products of exp(g) in float64
// taken from j = t - 1 down (not an exp per pair; and quotients P_t / P_j of the prefix products
// underflow to 0 / 0 behind strong gates). Along a whole block of 8 keys below t's own block they
// are one running product to the block's top times each key's product within its block
// (ch.pair_within), so that the block's 8 terms are independent (vector lanes, 8 partial sums); a
// token at a time, the product's and the sum's chains held the loop at their latency. This function's share of Mamba-2's backward
// (amx, fast, the bench's shape) fell from 4.9% to 3.0% of the samples, the backward from 78.7-82.8
// ms to 75.9-78.9. The terms' order changes float64's rounding only (gradients of about 1e-11
// beside terms of 1e3 moved); every factor is still at least F_tj itself.
constexpr int kPairBlock = 8;

template <class Ops>
void scalar_gate_gradient(Chunk& ch, const float* dH, const float* H0, const Bf16Rows& H0_bf16,
                          const float* dq_unscaled) {
  const int C = ch.C, K = ch.K, VW = ch.VW, L = ch.L;
  double* decay = ch.pair_decay;  // exp(g_t) in float64
  for (int t = 0; t < L; ++t) decay[t] = __builtin_exp(double(ch.log_decay[t]));
  double* within = ch.pair_within;  // prod_{m=j+1}^{top} decay[m], top = j's block's last token
  for (int j = L - 1; j >= 0; --j) {
    const bool top = j % kPairBlock == kPairBlock - 1 || j == L - 1;
    within[j] = top ? 1.0 : within[j + 1] * decay[j + 1];
  }
  double boundary = 0;
  for (int c = 0; c < K; ++c) boundary += boundary_row<Ops>(dH, H0, H0_bf16, c, VW);
  boundary *= __builtin_exp(ch.log_total[0]);
  const float *row_factor = ch.queries.factor, *column_factor = ch.keys.factor;
  double* columns = ch.gate_columns;  // sum_{i>=t} X_ij for each j < t
  for (int j = 0; j < L; ++j) columns[j] = 0.0;
  double* log_prefix = ch.dgate_acc;  // log P_t, then the gradient's accumulators (t from the end)
  double running = 0;
  for (int t = 0; t < L; ++t) {
    log_prefix[t] = running += double(ch.log_decay[t]);
    ch.key_terms[t] *= __builtin_exp(ch.log_total[0] - log_prefix[t]);  // R_t = P_{L-1} / P_t
  }
  double query_suffix = 0, pairs = 0;
  for (int t = L - 1; t >= 0; --t) {
    const float* dA = ch.dscores + size_t(t) * C;
    const float* raw = ch.raw_scores + size_t(t) * C;
    // pairs(t) = sum_{i>=t, j<t} X_ij = pairs(t+1) - sum_{i>t} X_it + sum_{j<t} X_tj
    pairs -= columns[t];
    double f = row_factor ? double(row_factor[t]) : 1.0;  // F_tj times row t's factor
    const int own = t - t % kPairBlock;                    // t's block's first token
    for (int j = t - 1; j >= own; --j) {
      f *= decay[j + 1];
      const double x = double(dA[j]) * double(raw[j]) * (column_factor ? f * double(column_factor[j]) : f);
      columns[j] += x;
      pairs += x;
    }
    double lanes[kPairBlock] = {};
    for (int block = own - kPairBlock; block >= 0; block -= kPairBlock) {
      f *= decay[block + kPairBlock];  // F to the block's top token, times the row's factor
#pragma omp simd
      for (int u = 0; u < kPairBlock; ++u) {
        const int j = block + u;
        const double factor = f * within[j];
        const double x = double(dA[j]) * double(raw[j]) * (column_factor ? factor * double(column_factor[j]) : factor);
        columns[j] += x;
        lanes[u] += x;
      }
      f *= within[block];
    }
    for (int u = 0; u < kPairBlock; ++u) pairs += lanes[u];
    query_suffix += __builtin_exp(log_prefix[t]) * Ops::dot(ch.q + size_t(t) * K, dq_unscaled + size_t(t) * K, K);
    ch.dgate_acc[t] = query_suffix + pairs + boundary;
  }
  double key_prefix = 0;
  for (int t = 0; t < L; ++t) {
    ch.dgate[t] = float(ch.dgate_acc[t] + key_prefix);
    key_prefix += ch.key_terms[t];
  }
}

// Per channel into ch.dgate [L, K]: the pair terms need the per-channel factors F_ij, which only
// the products in intra_backward apply, so this reads their strictly causal results (the
// diagonal left out). Call after intra_backward.
template <class Ops>
void channel_gate_gradient(Chunk& ch, const float* dH, const float* H0, const Bf16Rows& H0_bf16) {
  const int K = ch.K, VW = ch.VW, L = ch.L;
  const size_t LK = size_t(L) * K;
  for (size_t e = 0; e < LK; ++e) ch.dgate[e] = ch.q[e] * ch.dq[e] - ch.k[e] * ch.dk[e];
  if (ch.delta)
    for (size_t e = 0; e < LK; ++e) ch.dgate[e] += ch.bt[e] * ch.dbt[e];
  for (int i = L - 2; i >= 0; --i)
    for (int c = 0; c < K; ++c) ch.dgate[size_t(i) * K + c] += ch.dgate[size_t(i + 1) * K + c];
  float* carry = ch.gate_carry;  // [K] boundary term plus the keys before t
  const float* total = ch.gate_row(ch.prefix, L - 1);
  for (int c = 0; c < K; ++c) carry[c] = total[ch.W == 1 ? 0 : c] * boundary_row<Ops>(dH, H0, H0_bf16, c, VW);
  for (int t = 0; t < L; ++t) {
    float* dg = ch.dgate + size_t(t) * K;
    const float *kt = ch.k + size_t(t) * K, *dkt = ch.dk_state + size_t(t) * K;
    for (int c = 0; c < K; ++c) {
      dg[c] += carry[c];
      carry[c] += kt[c] * dkt[c];
    }
  }
}

// Writes the gate gradient rows in the gate's own width: per channel, summed per group of G
// channels, or summed over all channels for a scalar gate (the additive scalar path has it
// summed already).
void store_gate_gradient(const Params& p, const Item& item, int t0, Chunk& ch, const GradSinks& sinks) {
  const int K = ch.K, L = ch.L;
  const bool per_channel = p.gate == GateKind::channel || ch.delta;
  const int width = p.gate == GateKind::channel ? K / p.gate_group : 1;
  const int group = p.gate == GateKind::channel ? p.gate_group : K;
  for (int i = 0; i < L; ++i) {
    float* row = ch.dgate + size_t(i) * (per_channel ? K : 1);
    if (per_channel && group > 1) {
      for (int x = 0; x < width; ++x) {
        float s = 0.f;
        for (int c = 0; c < group; ++c) s += row[x * group + c];
        ch.pair[x] = s;
      }
      row = ch.pair;
    }
    store_row(sinks.dg, item.b, t0 + i, item.n0 / p.pack, row, width, 1.0f, item.output_stores());
  }
}

// The delta rule's backward through rv = T (vt - bp H0) and L:
//   dz = T^T drv,  dL = -(dz rv^T) (strictly lower),  dvt = dz,  dbp = -dz H0^T,
//   dbt = P * dbp + the queries' part of dL's gradient; the keys' part goes to dk.
// dz first (from drv), then dz rv^T into dlower and dz H0^T into dbp with the products of dY that
// read the same operands (gradients), then the rest.
template <class Ops>
void delta_backward_dz(Chunk& ch) {
  gemm_tn<Ops>(ch, ch.L, ch.VW, ch.L, ch.solved, ch.C, ch.drv, ch.VW, ch.dz, ch.VW, false, Triangle::a_upper);
}
template <class Ops>
void delta_backward(Chunk& ch) {
  const int C = ch.C, K = ch.K, L = ch.L;
  for (int i = 0; i < L; ++i)
    for (int j = 0; j < i; ++j) ch.dlower[size_t(i) * C + j] = -ch.dlower[size_t(i) * C + j];
  for (size_t e = 0; e < size_t(L) * K; ++e) ch.dbp[e] = -ch.dbp[e];
  scale_rows(ch.dbt, ch.dbp, ch.prefix, L, K, ch.W);
  intra_backward<Ops>(ch, ch.dlower, ch.bt, ch.k, ch.erase_keys, ch.keys, ch.dbt, ch.dk, nullptr);
}

// dq, dk, dv, dg (and the strengths' gradients) of the loaded chunk from its start state H0 (or,
// where the state pass kept it as bf16, H0_bf16 and H0 null: states_kept_as_bf16) and
// dH, the gradient wrt its end state, with the delta rule's solve and new values from the state
// pass's record of the chunk (`kept_solve`, keep_solve in forward.h) or, without one, formed again:
//   dq = P * (dY H0^T) + intra;  dk = R * (values dH^T) + intra;  dvalues = A^T dY + (k * R) dH
// (values: v, or the delta rule's new values, whose gradient goes on through delta_backward).
// The state part of dk and the diagonal of the intra part stay apart until after dg. With the
// delta rule dY values^T and dz rv^T are one call, and dY H0^T and dz H0^T another, each operand
// transposed once and packed once by a target that packs (Ops::gemm_shared_b).
template <class Ops>
void gradients(const Params& p, const Item& item, int t0, Chunk& ch, const float* H0, const Bf16Rows& H0_bf16,
               const float* dH, const float* kept_solve, const GradSinks& sinks) {
  const int C = ch.C, K = ch.K, V = ch.V, VW = ch.VW, L = ch.L;
  if (ch.delta && kept_solve) {
    delta_rows(p, ch);
    const SolveRecord<const float> kept = solve_record(p, kept_solve);
    std::memcpy(ch.solved, kept.solved, sizeof(float) * size_t(L) * C);
    std::memcpy(ch.rv, kept.new_values, sizeof(float) * size_t(L) * VW);
  } else if (ch.delta) {
    prepare_delta<Ops>(p, ch);
    state_products<Ops>(ch, H0, false);
    delta_values<Ops>(p, ch);
  }
  float* dvalues = ch.delta ? ch.drv : ch.dv;
  ch.decayed_queries = decayed(ch, ch.queries, ch.q, ch.prefix, ch.qg_factor, ch.qg);
  const ScaledRows kd = decayed(ch, ch.keys, ch.k, ch.suffix, ch.kd_factor, ch.kd);
  const bool rectangle = p.gate == GateKind::scalar && !ch.delta;
  intra_scores<Ops>(ch, ch.q, ch.k, ch.queries, ch.keys, ch.scores, false, ch.raw_scores);
  gemm_nt<Ops>(ch, L, K, VW, ch.values(), VW, dH, VW, ch.panel, K, false, Triangle::none, ch.values_values);
  if (rectangle) key_state_terms<Ops>(ch, ch.panel);
  scale_rows(ch.dk_state, ch.panel, ch.suffix, L, K, ch.W);
  zero(ch.dk, size_t(L) * K);
  gemm_scaled_nn<Ops>(ch, L, VW, kd, dH, VW, dvalues);
  gemm_tn<Ops>(ch, L, VW, L, ch.scores, C, ch.dy, VW, dvalues, VW, true, Triangle::a_upper);
  if (ch.delta) delta_backward_dz<Ops>(ch);
  const float* dz = ch.delta ? ch.dz : nullptr;
  const PackedB values_t =
      transposed_b<Ops>(ch, L, VW, ch.values(), VW, ch.packed, ch.values_values, Operands::f32, Operands::f32);
  gemm_packed_sharing_b<Ops>(ch, L, L, VW, values_t, VW, ch.dy, ch.dscores, dz, ch.dlower, C, Triangle::c_lower,
                             ch.values_values);
  const PackedB H0_t =
      transposed_b<Ops>(ch, K, VW, H0, VW, ch.packed, Operands::f32, Operands::f32, Operands::f32, H0_bf16);
  gemm_packed_sharing_b<Ops>(ch, L, K, VW, H0_t, VW, ch.dy, ch.panel, dz, ch.dbp, K);
  scale_rows(ch.dq, ch.panel, ch.prefix, L, K, ch.W);
  if (rectangle) scalar_gate_gradient<Ops>(ch, dH, H0, H0_bf16, ch.panel);
  intra_backward<Ops>(ch, ch.dscores, ch.q, ch.k, ch.queries, ch.keys, ch.dq, ch.dk, ch.diag);
  if (ch.delta) delta_backward<Ops>(ch);
  if (p.gate != GateKind::none) {
    if (!rectangle) channel_gate_gradient<Ops>(ch, dH, H0, H0_bf16);
    store_gate_gradient(p, item, t0, ch, sinks);
  }

  const int m = item.n0 / p.pack;
  for (int i = 0; i < L; ++i) {
    float* dqi = ch.dq + size_t(i) * K;
    float* dki = ch.dk + size_t(i) * K;
    const float *qi = ch.q + size_t(i) * K, *ki = ch.k + size_t(i) * K;
    const float *dk_state = ch.dk_state + size_t(i) * K, w = ch.diag[i];
    for (int c = 0; c < K; ++c) {
      dqi[c] += w * ki[c];
      dki[c] += w * qi[c] + dk_state[c];
    }
    float* dvi = ch.dv + size_t(i) * VW;
    if (ch.delta) {
      // bt = b * k and vt = w * v: the strengths' gradients and the rest of dk, dv.
      const float *dbti = ch.dbt + size_t(i) * K, *dvti = ch.dz + size_t(i) * VW, *vi = ch.v + size_t(i) * VW;
      if (p.delta == Delta::beta) {
        const float beta = ch.beta[i];
        const float dbeta = Ops::dot(ki, dbti, K) + Ops::dot(vi, dvti, VW);
        for (int c = 0; c < K; ++c) dki[c] += beta * dbti[c];
        for (int j = 0; j < VW; ++j) dvi[j] = beta * dvti[j];
        store_row(sinks.dbeta, item.b, t0 + i, m, &dbeta, 1, 1.0f, item.output_stores());
      } else {
        const float *erase = ch.erase + size_t(i) * K, *write = ch.write + size_t(i) * VW;
        float* db = ch.panel;
        float* dw = ch.drv + size_t(i) * VW;  // drv is spent
        for (int c = 0; c < K; ++c) {
          db[c] = ki[c] * dbti[c];
          dki[c] += erase[c] * dbti[c];
        }
        for (int j = 0; j < VW; ++j) {
          dw[j] = vi[j] * dvti[j];
          dvi[j] = write[j] * dvti[j];
        }
        store_row(sinks.db, item.b, t0 + i, m, db, K, 1.0f, item.output_stores());
        item.store_wide(sinks.dw, t0 + i, 1, dw, V);
      }
    }
    if (p.l2norm_qk) {
      l2norm_backward<Ops>(qi, ch.q_rstd[i], dqi, K);
      l2norm_backward<Ops>(ki, ch.k_rstd[i], dki, K);
    }
    store_row(sinks.dq, item.b, t0 + i, m, dqi, K, 1.0f, item.output_stores());
    store_row(sinks.dk, item.b, t0 + i, m, dki, K, 1.0f, item.output_stores());
    item.store_wide(sinks.dv, t0 + i, 1, dvi, V);
  }
}

// The power of two 2^e that brings the largest of the chunk's prefix decays P into [0.5, 1), where
// that largest lies below 2^-64 (the chunk's first token behind a gate of -45 or stronger); else
// 0, no rescaling. P_i = exp(G_i), G_i the log decays summed in float64 through token i. Every
// g <= 0 (the call's contract, Options::check_values), so the sums only fall along the chunk and
// the largest is the first token's, max_c g_0[c]: read off that row, where summing every row again
// to find it (until 2026-12-06) took 15% of gla's backward beside its products on an EPYC Zen 3
// (a call to fmax per channel and token).
constexpr double kLn2 = 0.69314718055994531;

inline int prefix_exponent(const Chunk& ch) {
  constexpr double kLargestUnscaled = -64 * kLn2;
  float largest = ch.log_decay[0];
  for (int c = 1; c < ch.W; ++c) largest = ch.log_decay[c] > largest ? ch.log_decay[c] : largest;
  if (!(double(largest) < kLargestUnscaled)) return 0;
  return int(__builtin_floor(double(largest) / kLn2)) + 1;
}

// dH <- P_{L-1} * dH + (q * P)^T dY (- bp^T dz for the delta rule) over the loaded chunk: the
// gradient wrt its start state. Reads q * P (and bp, dz), which `gradients` leaves in place
// (ch.decayed_queries, ch.decayed_erase); consumes dz.
// Behind a chunk of strong gates the result can be a normal number (1.6e-38 from a decay of
// 4e-37, a query of 0.01 and an output gradient of 4) whose terms, formed as q * P first, pass
// through the flushed subnormal range and vanish. Where every prefix decay is below 2^-64
// (prefix_exponent), P is formed again from the log decays as P 2^-e, the products made into
// ch.rescaled and 2^e times them added: a power of two scales exactly where the result is normal.
template <class Ops>
void propagate_state_gradient(Chunk& ch, float* dH) {
  const int L = ch.L, K = ch.K, VW = ch.VW, W = ch.W;
  decay_state(ch, dH, dH);
  const int e = ch.gated ? prefix_exponent(ch) : 0;
  if (e) {
    // P 2^-e over ch.prefix (decay_state has read P_{L-1}), and q * P, bp again from it.
    const double shift = -double(e) * kLn2;
    for (int c = 0; c < W; ++c) ch.log_total[c] = 0.0;
    for (int i = 0; i < L; ++i)
      for (int c = 0; c < W; ++c)
        ch.prefix[size_t(i) * W + c] = float((ch.log_total[c] += double(ch.log_decay[size_t(i) * W + c])) + shift);
    Ops::exp(ch.prefix, L * W);
    ch.decayed_queries = decayed(ch, ch.queries, ch.q, ch.prefix, ch.qg_factor, ch.qg);
    if (ch.delta) ch.decayed_erase = decayed(ch, ch.erase_keys, ch.bt, ch.prefix, ch.bp_factor, ch.bp);
  }
  float* out = e ? ch.rescaled : dH;
  gemm_scaled_tn<Ops>(ch, VW, L, ch.decayed_queries, ch.dy, VW, Operands::f32, out, VW, !e);
  if (ch.delta) {
    for (size_t x = 0; x < size_t(L) * VW; ++x) ch.dz[x] = -ch.dz[x];
    gemm_scaled_tn<Ops>(ch, VW, L, ch.decayed_erase, ch.dz, VW, Operands::f32, out, VW, true);
  }
  if (!e || e < -252) return;  // below 2^-252 every term is under fp32's range
  // 2^e in two normal factors where e < -126: the first product stays normal wherever the result is.
  const float up = __builtin_ldexpf(1.0f, e < -126 ? e + 126 : e), down = e < -126 ? 0x1p-126f : 1.0f;
  for (size_t x = 0; x < size_t(K) * VW; ++x) dH[x] += ch.rescaled[x] * up * down;
}

// Item `index`'s dH [K, pack * V] from dht (or 0), and its dh0 written from dH when asked.
void initial_state_gradient(const Params& p, int64_t index, float* dH) { item_at(p, index).load_state(p.dht, dH); }
void final_state_gradient(const Params& p, int64_t index, const float* dH) {
  if (p.dh0.present()) item_at(p, index).store_state(p.dh0, dH);
}

// The gradient pass of `count` consecutive items from `first`, in lockstep as the forward runs
// them (forward_sequence): chunk by chunk in reverse, each chunk of every item in turn, so that
// the rows of a token that neighbouring heads read share their pages and cache lines.
template <class Ops>
void backward_sequence(const Params& p, int64_t first, int count, void* workspace, const float* states,
                       const float* solves, float* dH, const GradSinks& sinks) {
  Chunk ch(p, workspace);
  const Records records(p, true);
  const size_t KV = size_t(ch.K) * ch.VW;
  const int parts = Loader<Ops>::keys_values | Loader<Ops>::with_queries | Loader<Ops>::with_output_grads;
  const bool bf16_states = states_kept_as_bf16<Ops>(p, solves != nullptr);
  for (int i = 0; i < count; ++i) initial_state_gradient(p, first + i, dH + size_t(i) * KV);
  for (int c = chunk_count(p) - 1; c >= 0; --c)
    for (int i = 0; i < count; ++i) {
      const int t0 = c * ch.C;
      const Item item = item_at(p, first + i);
      float* dHi = dH + size_t(i) * KV;
      Loader<Ops>{p, item}.chunk(ch, t0, parts);
      prefetch_next<Ops>(p, first, count, i, t0, t0 - ch.C, parts);
      const float* kept = solves ? records.solve(solves, i, c) : nullptr;
      const float* H0 = records.state(states, i, c);
      const Bf16Rows H0_bf16{bf16_states ? reinterpret_cast<const uint16_t*>(H0) : nullptr, ch.VW};
      gradients<Ops>(p, item, t0, ch, bf16_states ? nullptr : H0, H0_bf16, dHi, kept, sinks);
      propagate_state_gradient<Ops>(ch, dHi);
    }
  for (int i = 0; i < count; ++i) final_state_gradient(p, first + i, dH + size_t(i) * KV);
  finish_streamed_stores();
}

}  // namespace
}  // namespace flat::cpu::stages

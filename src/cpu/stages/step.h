// The decode path: the recurrence token by token, from a state in memory to a state in memory,
// for a few tokens per sequence (a serving step) or wherever every token's state is kept
// (Sequences::token_state_indices). Per head and token, in the GDN-2 form every variant takes
// (docs/variants.md; the additive family is b = 0, w = 1):
//   H' = Diag(a) H,   u = w * v - H'^T (b * k),   H_t = H' + k u^T,
//   y = scale * H_t^T q = scale * (H'^T q + <q, k> u).
// A state is K rows of V floats. A decode step is bound by the state's memory traffic (64 KiB per
// head at K = V = 128 against 2 x 128 FMAs per row), so the passes over it are what counts: the
// additive family makes one (read a row, write its update, accumulate y), the delta rule two
// (H'^T (b * k) and H'^T q, then the update), the second reading the rows back from L2 rather
// than memory. The rows are read where they are, written where they go (a pool row, ht, or the
// thread's scratch between kept tokens), in place when those are the same.
//
// Everything here has internal linkage (an anonymous namespace): each target's translation unit
// (src/cpu/target_<name>.cpp) compiles its own copy with its own flags, so no out-of-line copy
// built for one instruction set is picked by the linker for another. For the same reason it uses
// no standard-library templates but header-only ones that inline.
#pragma once

#include <cstring>

#include "cpu/stages/forward.h"

namespace flat::cpu::stages {
namespace {

// One head's state as K rows of V floats at `stride` floats apart; absent (null) is the zero state.
struct StateRows {
  float* base = nullptr;
  int64_t stride = 0;

  float* row(int c) const { return base + c * stride; }
  // Head n of a state view (its rows (b, n, c)), or absent.
  static StateRows of(const RowView& view, int b, int n) {
    if (!view.present()) return {};
    return {reinterpret_cast<float*>(view.row(b, n, 0)), view.stride2};
  }
};

// Asks for a row of the next state to read (into L2), one cache line at a time. The pass that
// reads a head's state from memory (the additive family's only one, the delta rule's first) asks
// for the next head's rows as it goes, one row for each of its own, so that two streams are in
// flight and the next head starts from L2 (measured on the delta rule, 1 thread, 64 sequences x 16
// heads: 5.5-5.65 ms against 5.7-6.0 ms asking during the second pass, which runs from L2 and is
// over before memory answers).
void prefetch_row(const float* row, int V) {
  for (int j = 0; j < V; j += 16) __builtin_prefetch(row + j, 0, 2);
}

// Rows processed together: 4 rows' FMAs per accumulator load and store, the 2 accumulators of V
// floats staying in L1.
constexpr int kStepRows = 4;

// The delta rule's first pass over a state H [K, V]: e[j] = sum_c fe[c] H[c, j] and
// y[j] = sum_c fq[c] H[c, j], both zero for the zero state (H absent). The factors are held in
// registers and each row's vector loaded once for both sums: the arrays are declared unaliased,
// else every store to e or y would force the factors and the rows to be loaded again (measured:
// twice the time of the whole pass, loads being its bottleneck at 20 per 16 floats).
void erase_and_query(const StateRows& H, const float* __restrict fe, const float* __restrict fq, int K, int V,
                     float* __restrict e, float* __restrict y, const StateRows& next) {
  for (int j = 0; j < V; ++j) e[j] = y[j] = 0.0f;
  if (!H.base) return;
  int c = 0;
  for (; c + kStepRows <= K; c += kStepRows) {
    if (next.base)
      for (int r = 0; r < kStepRows; ++r) prefetch_row(next.row(c + r), V);
    const float* __restrict h0 = H.row(c);
    const float* __restrict h1 = H.row(c + 1);
    const float* __restrict h2 = H.row(c + 2);
    const float* __restrict h3 = H.row(c + 3);
    const float e0 = fe[c], e1 = fe[c + 1], e2 = fe[c + 2], e3 = fe[c + 3];
    const float q0 = fq[c], q1 = fq[c + 1], q2 = fq[c + 2], q3 = fq[c + 3];
#pragma omp simd
    for (int j = 0; j < V; ++j) {
      const float x0 = h0[j], x1 = h1[j], x2 = h2[j], x3 = h3[j];
      e[j] += e0 * x0 + e1 * x1 + e2 * x2 + e3 * x3;
      y[j] += q0 * x0 + q1 * x1 + q2 * x2 + q3 * x3;
    }
  }
  for (; c < K; ++c) {
    if (next.base) prefetch_row(next.row(c), V);
    const float* __restrict h = H.row(c);
    const float ec = fe[c], qc = fq[c];
#pragma omp simd
    for (int j = 0; j < V; ++j) {
      e[j] += ec * h[j];
      y[j] += qc * h[j];
    }
  }
}

// The update of one head's state by one token, H_t = Diag(a) H + k u^T, from src to dst (which
// may be src). a: the decays (W = 1: one for every row), k, q [K]; u [V]: the new values. The
// additive family's y [V] is H_t^T q, accumulated in the same pass; the delta rule's y is formed
// before (it needs H'^T q and u) and left alone. Rows of `next` (when present) are prefetched.
void step_token(const Chunk& ch, const float* a, const float* k, const float* q, const float* u, bool delta,
                const StateRows& src, const StateRows& dst, float* y, const StateRows& next) {
  const int K = ch.K, V = ch.V;
  if (!delta) {
    for (int j = 0; j < V; ++j) y[j] = 0.0f;
  }
  for (int c = 0; c < K; ++c) {
    const float ac = a[ch.W == 1 ? 0 : c], kc = k[c], qc = q[c];
    float* out = dst.row(c);
    if (next.base) prefetch_row(next.row(c), V);
    if (src.base) {
      const float* in = src.row(c);
      if (delta) {
#pragma omp simd
        for (int j = 0; j < V; ++j) out[j] = ac * in[j] + kc * u[j];
      } else {
#pragma omp simd
        for (int j = 0; j < V; ++j) {
          const float h = ac * in[j] + kc * u[j];
          out[j] = h;
          y[j] += qc * h;
        }
      }
    } else if (delta) {
#pragma omp simd
      for (int j = 0; j < V; ++j) out[j] = kc * u[j];
    } else {
#pragma omp simd
      for (int j = 0; j < V; ++j) {
        const float h = kc * u[j];
        out[j] = h;
        y[j] += qc * h;
      }
    }
  }
}

// Items [first, first + count) of p (each its packed heads in turn) token by token: y of every
// token, the state after each token to its pool row where p.token_states asks, the final state to
// ht. H [pack, K, V]: where a head's state goes that nothing keeps (a token between kept ones).
template <class Ops>
void step_sequence(const Params& p, int64_t first, int count, void* workspace, float* H) {
  Chunk ch(p, workspace);
  const int K = ch.K, V = ch.V;
  const int parts = Loader<Ops>::keys_values | Loader<Ops>::with_queries;
  float* y = ch.out;     // [V] one head's y of one token
  float* u = ch.dv;      // [V] its new values
  float* erase = ch.dq;  // [K] a * b * k, the erase product's factors
  float* query = ch.dk;  // [K] a * q
  for (int i = 0; i < count; ++i) {
    const Item item = item_at(p, first + i);
    // Where head r's state after token t is: its pool row, ht after the last token, else the
    // scratch; before token 0, h0 (absent: zero).
    const auto place = [&](int t, int r) {
      const int n = item.n0 + r;
      if (t < 0) return StateRows::of(p.h0, item.b, n);
      if (const RowView row = p.token_states.after(t); row.present()) return StateRows::of(row, 0, n);
      if (t == p.S - 1 && p.ht.present()) return StateRows::of(p.ht, item.b, n);
      return StateRows{H + size_t(r) * K * V, V};
    };
    // The state the next head reads first, after head r's last token: the next head's h0, or the
    // next item's first head's.
    const auto next_state = [&](int i_, int r, int t) {
      if (t != p.S - 1) return StateRows{};
      if (r + 1 < p.pack) return StateRows::of(p.h0, item.b, item.n0 + r + 1);
      if (i_ + 1 == count) return StateRows{};
      const Item following = item_at(p, first + i_ + 1);
      return StateRows::of(p.h0, following.b, following.n0);
    };
    for (int t0 = 0; t0 < p.S; t0 += ch.C) {
      Loader<Ops>{p, item}.chunk(ch, t0, parts);
      for (int r = 0; r < p.pack; ++r)
        for (int l = 0; l < ch.L; ++l) {
          const int t = t0 + l;
          const float* a = ch.gate_row(ch.decay, l);
          const float *k = ch.k + size_t(l) * K, *q = ch.q + size_t(l) * K, *v = ch.v + size_t(l) * ch.VW + r * V;
          const StateRows src = place(t - 1, r), dst = place(t, r);
          if (ch.delta) {
            // b * k with the delta rule's erase strength: beta per token, or gdn2's b [K].
            for (int c = 0; c < K; ++c) {
              const float b = p.delta == Delta::beta ? ch.beta[l] : ch.erase[size_t(l) * K + c];
              const float ac = a[ch.W == 1 ? 0 : c];
              erase[c] = ac * b * k[c];
              query[c] = ac * q[c];
            }
            erase_and_query(src, erase, query, K, V, u, y, next_state(i, r, t));
            const float* w = p.delta == Delta::beta ? nullptr : ch.write + size_t(l) * ch.VW + r * V;
            const float qk = Ops::dot(q, k, K);
            for (int j = 0; j < V; ++j) {
              u[j] = (w ? w[j] : ch.beta[l]) * v[j] - u[j];
              y[j] += qk * u[j];
            }
            step_token(ch, a, k, q, u, true, src, dst, y, StateRows{});
          } else {
            step_token(ch, a, k, q, v, false, src, dst, y, next_state(i, r, t));
          }
          for (int j = 0; j < V; ++j) y[j] *= p.scale;
          store_row(p.y, item.b, t, item.n0 + r, y, V);
          if (t == p.S - 1 && p.token_states.after(t).present() && p.ht.present()) {
            const StateRows final_state = StateRows::of(p.ht, item.b, item.n0 + r);
            for (int c = 0; c < K; ++c) std::memcpy(final_state.row(c), dst.row(c), sizeof(float) * V);
          }
        }
    }
  }
}

}  // namespace
}  // namespace flat::cpu::stages

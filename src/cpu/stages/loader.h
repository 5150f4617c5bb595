// Loading one chunk of an item: rows of q, k, v (L2-normalised when asked), the delta rule's
// strengths, output gradients, and the decays with their prefix and suffix products.
//
// Everything here has internal linkage (an anonymous namespace): each target's translation unit
// (src/cpu/target_<name>.cpp) compiles its own copy with its own flags, so no out-of-line copy
// built for one instruction set is picked by the linker for another. For the same reason it uses
// no standard-library templates but header-only ones that inline.
#pragma once

#include <cfloat>
#include <cstring>

#include "cpu/rescale.h"
#include "cpu/stages/chunk.h"

namespace flat::cpu::stages {
namespace {

// Rows x_t [L, K] of q or k (tokens t0 .. t0 + L - 1 of one head), with `l2norm` normalised:
// x_hat = x rstd with rstd = 1 / sqrt(sum x^2 + eps), for every finite row: a row whose sum of
// squares overflows is first scaled by a power of two s (cpu/rescale.h), rstd = s / sqrt(...).
// Where `rows` is given, x_hat = (x s) r is also split as factor * rows for the products
// (ScaledRows): with r = 1 / sqrt(sum + eps) = m 2^e (m in [0.5, 1)), rows = x s 2^e, bf16 values
// when x is (powers of two scale them exactly), and factor = m; factor * rows rounds to x_hat's
// own bits.
// In three walks over the chunk, every row widened, then every row's sum of squares, then the
// scalings: each sum is a chain of dependent FMAs, and the chains of rows in turn overlap, where
// each row's scaling waiting on its own sum held the next row back.
template <class Ops>
void load_normalised_rows(const RowView& view, int b, int t0, int head, int L, bool l2norm, float* x, float* rstd,
                          int K, float* rows = nullptr, float* factor = nullptr) {
  for (int i = 0; i < L; ++i) load_row(view, b, t0 + i, head, x + size_t(i) * K, K);
  if (!l2norm) return;
  for (int i = 0; i < L; ++i) rstd[i] = Ops::dot(x + size_t(i) * K, x + size_t(i) * K, K);
  for (int i = 0; i < L; ++i) {
    float* xi = x + size_t(i) * K;
    float sum = rstd[i], eps = kL2NormEps;
    const float s = rescale_overflowed_row(xi, K, sum, eps, [](const float* y, int n) { return Ops::dot(y, y, n); });
    const float r = 1.0f / __builtin_sqrtf(sum + eps);
    if (rows) {
      int e = 0;
      factor[i] = __builtin_frexpf(r, &e);
      const float power = __builtin_ldexpf(1.0f, e);
      float* row = rows + size_t(i) * K;
      for (int c = 0; c < K; ++c) row[c] = xi[c] * power;
    }
    for (int c = 0; c < K; ++c) xi[c] *= r;
    rstd[i] = r * s;
  }
}

// Gradient through x_hat = x * rstd: dx = rstd * (dx_hat - x_hat <x_hat, dx_hat>), in place.
template <class Ops>
void l2norm_backward(const float* x_hat, float rstd, float* d, int K) {
  const float along = Ops::dot(x_hat, d, K);
  for (int c = 0; c < K; ++c) d[c] = rstd * (d[c] - x_hat[c] * along);
}

// a [W] = each of the W / G values of `groups` over its G channels. A loop per group: an index
// divided per channel (c / G, G known only at run time) took a tenth of sla's backward beside its
// products (G = 64) on an EPYC Zen 3.
inline void spread_groups(const float* groups, int G, float* a, int W) {
  for (int x = 0; x < W / G; ++x)
    for (int c = 0; c < G; ++c) a[size_t(x) * G + c] = groups[x];
}

template <class Ops>
struct Loader {
  const Params& p;
  const Item& item;

  // Rows [t0, t0 + L) of the bf16 tensor `view` kept as bf16 in `out` (Bf16Rows): the item's heads
  // side by side where the rows are per head (v), else its shared head's (`group`).
  Bf16Rows bf16_rows(const RowView& view, int t0, int L, int group, bool per_head, int width, uint16_t* out) const {
    const int heads = per_head ? p.pack : 1, ld = heads * width;
    for (int i = 0; i < L; ++i)
      for (int r = 0; r < heads; ++r)
        std::memcpy(out + size_t(i) * ld + size_t(r) * width,
                    view.row(item.b, t0 + i, per_head ? item.head(r, group) : item.shared(group)),
                    sizeof(uint16_t) * size_t(width));
    return {out, ld};
  }

  void queries(Chunk& ch, int t0) const {
    load_normalised_rows<Ops>(p.q, item.b, t0, item.shared(p.group_q), ch.L, p.l2norm_qk, ch.q, ch.q_rstd, ch.K,
                              ch.factored_qk ? ch.q_rows : nullptr, ch.q_factor);
  }
  void keys(Chunk& ch, int t0) const {
    load_normalised_rows<Ops>(p.k, item.b, t0, item.shared(p.group_k), ch.L, p.l2norm_qk, ch.k, ch.k_rstd, ch.K,
                              ch.factored_qk ? ch.k_rows : nullptr, ch.k_factor);
  }
  void values(Chunk& ch, int t0) const {
    for (int i = 0; i < ch.L; ++i) item.load_wide(p.v, t0 + i, p.group_v, ch.v + size_t(i) * ch.VW, ch.V);
  }
  // dy pre-multiplied by scale as it is loaded: every gradient below is then that of the unscaled
  // products.
  void output_grads(Chunk& ch, int t0) const {
    for (int i = 0; i < ch.L; ++i) item.load_wide(p.dy, t0 + i, 1, ch.dy + size_t(i) * ch.VW, ch.V, p.scale);
  }
  // The delta rule's write strengths: beta per token, or gdn2's b [K] and w [V] rows.
  void strengths(Chunk& ch, int t0) const {
    for (int i = 0; i < ch.L; ++i) {
      if (p.delta == Delta::beta) {
        load_row(p.beta, item.b, t0 + i, item.shared(p.group_b), ch.beta + i, 1);
      } else {
        load_row(p.b, item.b, t0 + i, item.shared(p.group_b), ch.erase + size_t(i) * ch.K, ch.K);
        item.load_wide(p.w, t0 + i, p.group_w, ch.write + size_t(i) * ch.VW, ch.V);
      }
    }
  }
  // The log-gates of a scalar gate (one value a row): loaded (and kept) and summed, then
  // exponentiated in one call, not a vector call for each token's one value (5% of Mamba-2's
  // forward on an AMX Xeon), then the running product P.
  void scalar_decays(Chunk& ch, int t0, bool keep_logs) const {
    const int L = ch.L;
    for (int i = 0; i < L; ++i) {
      load_row(p.g, item.b, t0 + i, item.shared(p.group_g), ch.decay + i, 1);
      ch.log_total[0] += ch.decay[i];
    }
    if (keep_logs) std::memcpy(ch.log_decay, ch.decay, sizeof(float) * size_t(L));
    Ops::exp(ch.decay, L);
    float running = 1.0f;
    for (int i = 0; i < L; ++i) ch.prefix[i] = running *= ch.decay[i];
  }
  // Every other gate (or none): one walk down the rows, each row while it is in L1: its log-gates
  // loaded (and kept), summed into the chunk's total, exponentiated, and the running product P
  // taken on. A grouped gate (G > 1) is summed and exponentiated per group, its W / G values in
  // ch.pair, and spread over its channels as it is written (the logs only where they are kept).
  void row_decays(Chunk& ch, int t0, bool keep_logs) const {
    const int W = ch.W, L = ch.L, G = p.gate_group, groups = W / G;
    for (int i = 0; i < L; ++i) {
      float* a = ch.decay + size_t(i) * W;
      if (p.gate == GateKind::none) {
        a[0] = 1.0f;
      } else {
        float* logs = G == 1 ? a : ch.pair;
        load_row(p.g, item.b, t0 + i, item.shared(p.group_g), logs, groups);
        for (int c = 0; c < groups; ++c) ch.log_total[c] += logs[c];
        if (G == 1) {
          if (keep_logs) std::memcpy(ch.log_decay + size_t(i) * W, a, sizeof(float) * W);
          Ops::exp(a, W);
        } else {
          if (keep_logs) spread_groups(logs, G, ch.log_decay + size_t(i) * W, W);
          Ops::exp(logs, groups);  // once per group, not per channel
          spread_groups(logs, G, a, W);
        }
      }
      float* prefix = ch.prefix + size_t(i) * W;
      if (i == 0) {
        std::memcpy(prefix, a, sizeof(float) * W);
      } else {
        const float* before = prefix - W;
        for (int c = 0; c < W; ++c) prefix[c] = before[c] * a[c];
      }
    }
  }
  // a_t = exp(g_t) (a grouped gate spread over its channels) and the prefix and suffix
  // products P, R; with keep_logs, the log decays g_t too (the backward's, ch.log_decay).
  void decays(Chunk& ch, int t0, bool keep_logs) const {
    const int W = ch.W, L = ch.L, G = p.gate_group, groups = W / G;
    if (p.gate != GateKind::none)
      for (int c = 0; c < groups; ++c) ch.log_total[c] = 0.0;
    if (p.gate != GateKind::none && W == 1)
      scalar_decays(ch, t0, keep_logs);
    else
      row_decays(ch, t0, keep_logs);
    // A grouped gate's total, summed per group, spread over its channels.
    if (p.gate != GateKind::none && G > 1)
      for (int x = groups - 1; x >= 0; --x)  // in place, from the last group down
        for (int c = G - 1; c >= 0; --c) ch.log_total[size_t(x) * G + c] = ch.log_total[x];
    // The chunk's total decay P_{L-1} carries the state from chunk to chunk, so an error in it
    // compounds over the whole sequence: under a gate just below 1 (memory of thousands of tokens)
    // every factor a_t is rounded the same way, and the running product above is off by L such
    // roundings in the same direction. So it is taken from the exact sum of the chunk's log-gates
    // instead (float64, rounded once), within an ulp; the factors inside the chunk keep their
    // running products, whose error stays bounded by the chunk length.
    if (p.gate != GateKind::none) {
      float* total = ch.prefix + size_t(L - 1) * W;
      for (int c = 0; c < W; ++c) total[c] = float(ch.log_total[c]);
      Ops::exp(total, W);
    }
    for (int c = 0; c < W; ++c) ch.suffix[size_t(L - 1) * W + c] = 1.0f;
    for (int i = L - 2; i >= 0; --i)
      for (int c = 0; c < W; ++c)
        ch.suffix[size_t(i) * W + c] = ch.suffix[size_t(i + 1) * W + c] * ch.decay[size_t(i + 1) * W + c];
  }
  // What a chunk's stages read (t0: the chunk's first token): the decays always, and the
  // keys and values (with the delta rule's strengths), queries, output gradients as asked; with
  // rows_as_bf16 (the forward's passes, on a target whose products read rows kept as bf16:
  // MicroKernels::reads_bf16_rows), the rows only the products read (Chunk::bf16_queries_keys,
  // bf16_values) kept as bf16 for them (ScaledRows::bf16, Chunk::values_bf16), not widened (on an
  // AMX Xeon, docs/performance.md, "The rows the tiles read kept as bf16").
  enum Parts { keys_values = 1, with_queries = 2, with_output_grads = 4, rows_as_bf16 = 8 };
  // Asks for the rows chunk(ch, t0, parts) reads, into L2, while the chunk before it is worked
  // on: a token's row of one head lies N heads past the last token's, so each row is a new page
  // to the hardware prefetcher, which does not cross pages, and each load of the chunk waited
  // on memory (a quarter of the fused gla forward's vector work on an EPYC Zen 3).
  void prefetch(int t0, int parts) const {
    const int L = imin(p.S - t0, p.chunk);
    const auto rows = [&](const RowView& view, int group, int width, bool per_head) {
      if (!view.present()) return;
      const int64_t bytes = int64_t(width) * view.element_bytes();
      for (int i = 0; i < L; ++i)
        for (int r = 0; r < (per_head ? p.pack : 1); ++r) {
          const char* row = view.row(item.b, t0 + i, per_head ? item.head(r, group) : item.shared(group));
          for (int64_t at = 0; at < bytes; at += kCacheLine) __builtin_prefetch(row + at, 0, 2);
        }
    };
    if (p.gate != GateKind::none) rows(p.g, p.group_g, p.gate == GateKind::channel ? p.K / p.gate_group : 1, false);
    if (parts & keys_values) {
      rows(p.k, p.group_k, p.K, false);
      rows(p.v, p.group_v, p.V, true);
      if (p.delta == Delta::beta) rows(p.beta, p.group_b, 1, false);
      if (p.delta == Delta::erase_write) {
        rows(p.b, p.group_b, p.K, false);
        rows(p.w, p.group_w, p.V, true);
      }
    }
    if (parts & with_queries) rows(p.q, p.group_q, p.K, false);
    if (parts & with_output_grads) rows(p.dy, 1, p.V, true);
  }
  // Inlined into the passes, which call it with their parts known: out of line (as GCC 12 left it
  // once decays grew a grouped gate's branch) deltanet's forward beside its products took 8-13%
  // longer on an EPYC Zen 3.
  [[gnu::always_inline]] void chunk(Chunk& ch, int t0, int parts) const {
    ch.L = imin(ch.C, p.S - t0);
    decays(ch, t0, parts & with_output_grads);
    const bool as_bf16 = parts & rows_as_bf16;
    if (parts & keys_values) {
      if (as_bf16 && ch.bf16_queries_keys)
        ch.keys.bf16 = bf16_rows(p.k, t0, ch.L, p.group_k, false, ch.K, ch.k_kept);
      else
        keys(ch, t0);
      if (as_bf16 && ch.bf16_values)
        ch.values_bf16 = bf16_rows(p.v, t0, ch.L, p.group_v, true, ch.V, ch.v_kept);
      else
        values(ch, t0);
      if (ch.delta) strengths(ch, t0);
    }
    if (parts & with_queries) {
      if (as_bf16 && ch.bf16_queries_keys)
        ch.queries.bf16 = bf16_rows(p.q, t0, ch.L, p.group_q, false, ch.K, ch.q_kept);
      else
        queries(ch, t0);
    }
    if (parts & with_output_grads) output_grads(ch, t0);
  }
};

// In a walk over the items first .. first + count - 1 in lockstep, chunk by chunk, once item i's
// chunk at t0 is loaded: asks for the rows the walk loads next, item i + 1's chunk at t0 or, after
// the last item, the first item's chunk at next_t0 (none where next_t0 is outside the sequence).
template <class Ops>
void prefetch_next(const Params& p, int64_t first, int count, int i, int t0, int next_t0, int parts) {
  if (i + 1 < count)
    Loader<Ops>{p, item_at(p, first + i + 1)}.prefetch(t0, parts);
  else if (next_t0 >= 0 && next_t0 < p.S)
    Loader<Ops>{p, item_at(p, first)}.prefetch(next_t0, parts);
}

}  // namespace
}  // namespace flat::cpu::stages

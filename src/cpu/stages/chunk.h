// The chunk stages' working set: one item's rows for one chunk (Chunk, in the workspace arena),
// the item's rows of the tensors (Item), and the elementwise steps on them.
//
// Everything here has internal linkage (an anonymous namespace): each target's translation unit
// (src/cpu/target_<name>.cpp) compiles its own copy with its own flags, so no out-of-line copy
// built for one instruction set is picked by the linker for another. For the same reason it uses
// no standard-library templates but header-only ones that inline.
#pragma once

#include <cstddef>
#include <cstring>

#include "cpu/arena.h"
#include "cpu/kernels/product.h"
#include "cpu/rows.h"
#include "params.h"

namespace flat::cpu::stages {
namespace {

constexpr int kDiagBlock = 16;  // tokens per diagonal block of exact pairwise factors
constexpr float kL2NormEps = 1e-6f;

inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }

void zero(float* x, size_t n) { std::memset(x, 0, sizeof(float) * n); }

// Floats of scratch the delta rule's chunk solves use beside T (docs/algorithm.md): the doubling
// solve's panel X A^-1 is at most (C/2) x (C/2) (a block of s < C rows merges with at most
// min(s, C - s) rows below it), the blocked solve's T L[I, :I] at most 16 x (C - 16).
size_t solve_scratch(int C) {
  const size_t doubling = size_t(C / 2) * size_t(C / 2), blocked = size_t(kDiagBlock) * size_t(C - kDiagBlock);
  return doubling > blocked ? doubling : blocked;
}

// The working set of one item for one chunk: [C, K] and [C, VW] tiles that stay in L1/L2. An
// item is R heads that share q, k, g and beta / b ("packed" heads, p.pack): their values, outputs
// and states sit side by side, VW = R * V wide, so one set of scores, one chunk solve and one
// pass of every product serve all of them (SLA's value heads sharing a key head).
// What rows loaded from an input of `dtype` hold: its bf16 values when bf16 and `as_loaded` (no
// arithmetic between the load and the product).
constexpr Operands held_as_loaded(DType dtype, bool as_loaded) {
  return dtype == DType::bf16 && as_loaded ? Operands::bf16_values : Operands::f32;
}

// Whether every token output of the call is bf16: y in a forward, dq, dk and dv (q's, k's and v's
// dtypes) in a backward. The spec bounds such a call's outputs as bf16 I/O (docs/algorithm.md,
// "Precision"), whatever the dtype of its states and gate gradients.
inline bool bf16_token_outputs(const Params& p) {
  const auto bf16_or_absent = [](const RowView& r) { return !r.present() || r.dtype == DType::bf16; };
  return (p.y.present() || p.dq.present()) && bf16_or_absent(p.y) && bf16_or_absent(p.dq) &&
         bf16_or_absent(p.dk) && bf16_or_absent(p.dv);
}

// Rows x_i = factor_i * rows_i [L, K] as the products read them: `rows` (holding `values`) in the
// product, each row's scalar factor (none: 1) applied to what the product makes of it. Normalised
// bf16 q and k are their rows as loaded times a power of two (still bf16 values) with the rest of
// the reciprocal norm as the factor, and a scalar gate's decays, the delta rule's beta, fold into
// the factor too; so the products read bf16 values, which a bf16 unit takes exactly in one pass
// (docs/algorithm.md, "Precision").
// Where the chunk's loader keeps them as bf16 (Loader::rows_as_bf16), `bf16` holds the rows and
// `rows` is not loaded: the products read them so, and any other reader from there
// (scale_bf16_rows).
struct ScaledRows {
  const float* rows;
  const float* factor;  // [L] or null
  Operands values;
  Bf16Rows bf16{};
};

struct Chunk {
  Chunk(const Params& p, void* workspace)
      : C(p.chunk),
        K(p.K),
        V(p.V),
        R(p.pack),
        VW(p.pack * p.V),
        W(p.gate == GateKind::channel ? p.K : 1),
        delta(p.delta != Delta::none),
        gated(p.gate != GateKind::none),
        precision(p.precision),
        bf16_outputs(bf16_token_outputs(p)),
        factored_qk(p.l2norm_qk && p.q.dtype == DType::bf16 && p.k.dtype == DType::bf16),
        values_values(held_as_loaded(p.v.dtype, !delta)),
        bf16_queries_keys(p.q.dtype == DType::bf16 && p.k.dtype == DType::bf16 && !p.l2norm_qk && !delta && W == 1),
        bf16_values(values_values == Operands::bf16_values) {
    Arena arena(workspace);
    const size_t CK = size_t(C) * K, CV = size_t(C) * VW, CW = size_t(C) * W, CC = size_t(C) * C;
    for (float** t : {&q, &k, &qg, &kd, &qs, &post, &dq, &dk, &dk_state}) *t = arena.take<float>(CK);
    panel = arena.take<float>(CK > solve_scratch(C) ? CK : solve_scratch(C));
    for (float** t : {&v, &dy, &out, &dv}) *t = arena.take<float>(CV);
    for (float** t : {&decay, &prefix, &suffix}) *t = arena.take<float>(CW);
    dgate = arena.take<float>(CK);
    for (float** t : {&scores, &dscores}) *t = arena.take<float>(CC);
    for (float** t : {&ks, &pre}) *t = arena.take<float>(size_t(kDiagBlock) * K);
    for (float** t : {&q_rstd, &k_rstd, &diag, &beta, &key_decays}) *t = arena.take<float>(size_t(C));
    for (float** t : {&q_factor, &k_factor, &bt_factor, &qg_factor, &kd_factor, &bp_factor})
      *t = arena.take<float>(size_t(C));
    if (factored_qk)
      for (float** t : {&q_rows, &k_rows}) *t = arena.take<float>(CK);
    scaled = arena.take<float>(size_t(C) * size_t(imax(C, VW)));
    for (float** t : {&pair, &gate_carry}) *t = arena.take<float>(size_t(K + 15) / 16 * 16);  // whole vectors
    for (double** t : {&gate_columns, &dgate_acc}) *t = arena.take<double>(size_t(C));
    log_total = arena.take<double>(size_t(W));
    if (gated) {
      log_decay = arena.take<float>(CW);
      rescaled = arena.take<float>(size_t(K) * VW);
    }
    if (gated && W == 1 && !delta) {
      raw_scores = arena.take<float>(CC);
      for (double** t : {&pair_decay, &pair_within, &key_terms}) *t = arena.take<double>(size_t(C));
    }
    if (delta) {
      for (float** t : {&erase, &bt, &bp, &dbt, &dbp}) *t = arena.take<float>(CK);
      for (float** t : {&write, &rv, &drv, &dz}) *t = arena.take<float>(CV);
      for (float** t : {&lower, &solved, &dlower}) *t = arena.take<float>(CC);
    }
    // B^T of an A B^T product: at most [max(K, VW), max(C, K, VW)].
    const size_t widest = size_t(imax(K, VW)), longest = size_t(imax(C, imax(K, VW)));
    packed = arena.take<float>(widest * longest);
    if (bf16_queries_keys)
      for (uint16_t** t : {&q_kept, &k_kept}) *t = arena.take<uint16_t>(CK);
    if (bf16_values) v_kept = arena.take<uint16_t>(CV);
    bytes = arena.used();
    queries = factored_qk ? ScaledRows{q_rows, q_factor, Operands::bf16_values}
                          : ScaledRows{q, nullptr, held_as_loaded(p.q.dtype, !p.l2norm_qk)};
    keys = factored_qk ? ScaledRows{k_rows, k_factor, Operands::bf16_values}
                       : ScaledRows{k, nullptr, held_as_loaded(p.k.dtype, !p.l2norm_qk)};
  }

  const int C, K, V, R, VW;  // VW = R * V: the packed heads' values side by side
  const int W;               // decay width: K for per-channel (and grouped) gates, 1 otherwise
  const bool delta;
  const bool gated;           // a forget gate (else every decay is 1)
  const Precision precision;  // of every product (Params::precision)
  const bool bf16_outputs;    // bf16_token_outputs: the products' error budget (GemmDesc::bf16_outputs)
  // q and k L2-normalised from bf16 inputs: the products read them as bf16 rows and factors
  // (q_rows, q_factor; k_rows, k_factor).
  const bool factored_qk;
  // What values() holds (GemmDesc::b_values): v's bf16 values without the delta rule. A target
  // runs bf16 values on its bf16 products, exactly (one pass on the tiles).
  const Operands values_values;
  // Which rows only the products read, which a target whose products read rows kept as bf16
  // (MicroKernels::reads_bf16_rows) keeps so in its forward passes (Loader::rows_as_bf16): q and k
  // of bf16 values as loaded (no L2 norm) where no gate scales them into rows of their own (none, or
  // a scalar gate: its decays are factors) and no solve reads them (no delta rule); v of bf16
  // values (no delta rule: the products read the new values).
  const bool bf16_queries_keys, bf16_values;
  // q and k as the products read them (ScaledRows): their bf16 rows and factors, or q and k; and
  // set per chunk, bt (erase_keys, by prepare_delta), q * P and bp (by whichever stage forms them,
  // for propagate_state_gradient).
  ScaledRows queries, keys, erase_keys{}, decayed_queries{}, decayed_erase{};
  int L = 0;  // tokens in this chunk
  size_t bytes = 0;

  float *q, *k, *v, *dy;        // [C, K], [C, K], [C, VW], [C, VW]; dy pre-scaled
  float *q_rstd, *k_rstd;       // [C] reciprocal norms when q, k are L2-normalised
  float *q_rows = nullptr, *k_rows = nullptr;  // [C, K] q = q_factor * q_rows, k likewise (factored_qk)
  float *q_factor, *k_factor;   // [C]
  // [C] the factors of bt = beta * k, q * P, k * R and bp = bt * P under a scalar gate (decayed).
  float *bt_factor, *qg_factor, *kd_factor, *bp_factor;
  float* scaled;                // [C, max(C, VW)] a product's operand with its factors applied
  float* decay;                 // [C, W] a_t
  float *prefix, *suffix;       // [C, W] P_i, R_i
  float *qg, *kd;               // [C, K] q * P, k * R
  float *scores, *dscores;      // [C, C] intra-chunk scores (zero above the diagonal)
  float *pre, *ks;              // [b, K] F_rj and keys_j * F_rj for a block's keys
  float *post, *qs;             // [C, K] F_ir and queries_i * F_ir for the queries after it
  float* panel;                 // [C, K] product scratch, and the solves' (solve_scratch)
  float* pair;                  // [K] running pairwise factor
  float* key_decays;            // [C] a scalar gate's F_ij from each key j <= i to the query i
  float* gate_carry;            // [K] gate-gradient terms carried along the chunk
  double* log_total;            // [W] the chunk's log-gates summed: log P_{L-1}
  // For the backward's terms whose decay factors would take them through the flushed subnormal
  // range (docs/algorithm.md, "Subnormal numbers"): the log decays g_t, the state gradient's
  // products rescaled by a power of two (propagate_state_gradient) and, for the additive family's
  // scalar gate, the scores before their decay, exp(g_t) in float64 and the keys' state terms
  // (scalar_gate_gradient).
  float* log_decay = nullptr;    // [C, W] g_t, loaded with the output gradients
  float* rescaled = nullptr;     // [K, VW]
  float* raw_scores = nullptr;   // [C, C] <q_i, k_j> as the products read them, before factors and decay
  double* pair_decay = nullptr;   // [C] exp(g_t)
  double* pair_within = nullptr;  // [C] exp(g_{j+1} + ... + g_{j|7}), within j's block of 8 tokens
  double* key_terms = nullptr;   // [C] k_j . (values dH^T)_j
  double *gate_columns, *dgate_acc;  // [C] scalar-gate gradient accumulators
  float* out;                   // [C, VW] y
  float *dq, *dk, *dv;          // [C, K], [C, K], [C, VW]
  float* dgate;                 // [C, K] per channel (or [C] for the additive scalar gate)
  float* dk_state;              // [C, K] the part of dk that flows through the chunk-end state
  float* diag;                  // [C] dscores_ii, kept out of dq, dk until the gate gradient
  float* packed;                // a transposed operand, packed for the products that read it
  // [C, K], [C, K], [C, VW] q's, k's and v's rows kept as bf16 (bf16_queries_keys, bf16_values)
  uint16_t *q_kept = nullptr, *k_kept = nullptr, *v_kept = nullptr;
  // The delta rule (docs/algorithm.md): erase bt = b * k, write vt = w * v, L, T = (I + L)^-1,
  // bp = bt * P, new values rv = T (vt - bp H0), and their gradients.
  float* beta;                  // [C] beta per token (Delta::beta)
  float *erase, *write;         // [C, K] b, [C, VW] w (Delta::erase_write)
  float *bt, *bp, *dbt, *dbp;   // [C, K]
  float *rv, *drv, *dz;         // [C, VW]
  float *lower, *solved, *dlower;  // [C, C] L, T, dL

  const float* gate_row(const float* t, int i) const { return t + size_t(i) * W; }
  // The values the additive stages read: v itself, or the delta rule's new values; v kept as bf16
  // where the loader keeps it so (then v is not loaded).
  float* values() const { return delta ? rv : v; }
  Bf16Rows values_bf16{};
};

// Multiplies each row of x [L, width] by its gate factors (broadcast when the gate is scalar).
void scale_rows(float* out, const float* x, const float* factors, int L, int width, int W) {
  for (int i = 0; i < L; ++i) {
    const float* f = factors + size_t(i) * W;
    float* o = out + size_t(i) * width;
    const float* xi = x + size_t(i) * width;
    if (W == 1) {
      const float s = f[0];
      for (int c = 0; c < width; ++c) o[c] = xi[c] * s;
    } else {
      for (int c = 0; c < width; ++c) o[c] = xi[c] * f[c];
    }
  }
}

// scale_rows of rows of bf16 values [L, width] (one factor per row).
void scale_bf16_rows(float* out, const Bf16Rows& x, const float* factors, int L, int width) {
  for (int i = 0; i < L; ++i) {
    const uint16_t* row = x.at(i, 0);
    float* o = out + size_t(i) * width;
    for (int c = 0; c < width; ++c) o[c] = bf16_to_f32(row[c]) * factors[i];
  }
}

// x * D (D: the chunk's prefix or suffix decays, P or R) as the products read it, for rows x [L, K]
// (x_full) read as `x`: under a scalar gate D folds into x's factors (into `factor` [L]), under a
// per-channel gate the rows x * D are formed (into `full` [L, K]), and without a gate it is x.
ScaledRows decayed(const Chunk& ch, const ScaledRows& x, const float* x_full, const float* D, float* factor,
                   float* full) {
  if (!ch.gated) return x;
  if (ch.W == 1) {
    for (int i = 0; i < ch.L; ++i) factor[i] = x.factor ? D[i] * x.factor[i] : D[i];
    return {x.rows, factor, x.values, x.bf16};
  }
  scale_rows(full, x_full, D, ch.L, ch.K, ch.W);
  return {full, nullptr, Operands::f32};
}

// acc += x * factors elementwise over rows [L, width] (per-channel factors).
void add_scaled_rows(float* acc, const float* x, const float* factors, int L, int width) {
  for (size_t e = 0; e < size_t(L) * width; ++e) acc[e] += x[e] * factors[e];
}

// Rows of one item: (batch b, packed heads n0 .. n0 + R - 1).
struct Item {
  const Params& p;
  int b, n0;

  // The input head of x shared by the item's heads, and the head of x read by its r-th head.
  int shared(int group) const { return n0 / group; }
  int head(int r, int group) const { return (n0 + r) / group; }

  // Per-head rows [R * width] side by side, times `scale`: v, w, dy read; y, dv, dw written (stored as
  // the call's token outputs are, output_stores).
  void load_wide(const RowView& view, int t, int group, float* dst, int width, float scale = 1.0f) const {
    for (int r = 0; r < p.pack; ++r) load_row(view, b, t, head(r, group), dst + size_t(r) * width, width, scale);
  }
  // The stores of the call's token outputs (Params::streamed_outputs).
  Stores output_stores() const { return p.streamed_outputs ? Stores::streamed : Stores::cached; }
  void store_wide(const RowView& view, int t, int group, const float* src, int width, float scale = 1.0f) const {
    for (int r = 0; r < p.pack; ++r)
      store_row(view, b, t, head(r, group), src + size_t(r) * width, width, scale, output_stores());
  }
  // States [B, N, K, V] of the item's heads as one [K, R * V] matrix.
  void load_state(const RowView& view, float* H) const {
    const int VW = p.pack * p.V;
    if (!view.present()) {
      zero(H, size_t(p.K) * VW);
      return;
    }
    for (int c = 0; c < p.K; ++c)
      for (int r = 0; r < p.pack; ++r) load_row(view, b, n0 + r, c, H + size_t(c) * VW + size_t(r) * p.V, p.V);
  }
  void store_state(const RowView& view, const float* H) const {
    const int VW = p.pack * p.V;
    for (int c = 0; c < p.K; ++c)
      for (int r = 0; r < p.pack; ++r) store_row(view, b, n0 + r, c, H + size_t(c) * VW + size_t(r) * p.V, p.V);
  }
};

// Item `index` of the sequence stages: batch index / (N / pack), heads from (index % (N / pack)) * pack.
Item item_at(const Params& p, int64_t index) {
  const int items = p.N / p.pack;
  return Item{p, int(index / items), int(index % items) * p.pack};
}

// to = P_{L-1} * from: a state's [K, VW] rows scaled by the chunk's total decay (to may be from).
// Without a gate P_{L-1} = 1, and in place there is nothing to do (a pass over the state that was a
// tenth of la's forward beside its products, in cache, on an EPYC Zen 3).
void decay_state(const Chunk& ch, const float* from, float* to) {
  if (!ch.gated && from == to) return;
  const float* total = ch.gate_row(ch.prefix, ch.L - 1);
  for (int c = 0; c < ch.K; ++c) {
    const float f = total[ch.W == 1 ? 0 : c];
    const float* row = from + size_t(c) * ch.VW;
    float* out = to + size_t(c) * ch.VW;
    for (int j = 0; j < ch.VW; ++j) out[j] = row[j] * f;
  }
}

int chunk_count(const Params& p) { return (p.S + p.chunk - 1) / p.chunk; }

// Bytes of workspace one thread's Chunk takes.
size_t workspace_bytes(const Params& p) { return Chunk(p, nullptr).bytes; }

}  // namespace
}  // namespace flat::cpu::stages

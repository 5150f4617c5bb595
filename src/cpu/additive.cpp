// Chunkwise additive linear attention on the CPU.
//
// Inside a chunk of L <= C tokens, with a_t = exp(g_t) in [0, 1] (per channel or per head),
//   P_i = prod_{s<=i} a_s        (decay from the chunk start through token i)
//   R_j = prod_{j<s<L} a_s       (decay from token j to the chunk end)
//   F_ij = prod_{j<s<=i} a_s     (decay from key j to query i, j <= i)
// the forward is
//   y_i   = scale * ( (q_i * P_i)^T H0 + sum_{j<=i} <q_i * F_ij, k_j> v_j )
//   H_end = P_{L-1} * H0 + sum_j (k_j * R_j) v_j^T
// Every factor is a product of numbers in [0, 1]: no exponent of a positive log-decay is ever
// formed, so any finite g <= 0 gives finite results (products underflow to 0 gracefully).
// Per-channel F is factored through the last row r of a 16-token block for all queries after the
// block (F_ij = F_ir * F_rj, both <= 1), which makes the cross-block scores one matrix product;
// inside the diagonal blocks the pairwise factors are exact running products.
// docs/algorithm.md has the derivation and the backward.
#include "cpu/additive.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace flat::cpu {
namespace {

constexpr int kDiagBlock = 16;  // tokens per diagonal block of exact pairwise factors
constexpr float kL2NormEps = 1e-6f;

// The working set of one (batch, head) for one chunk: [C, K] and [C, V] tiles that stay in L1/L2.
struct Chunk {
  explicit Chunk(const AdditiveParams& p)
      : C(p.chunk), K(p.K), V(p.V), W(p.gate == GateKind::channel ? p.K : 1) {
    for (auto* t : {&q, &k, &qg, &kd, &qs, &post, &panel, &dq, &dk, &dk_state}) t->resize(size_t(C) * K);
    for (auto* t : {&v, &dy, &out, &dv}) t->resize(size_t(C) * V);
    for (auto* t : {&decay, &prefix, &suffix, &dgate}) t->resize(size_t(C) * W);
    for (auto* t : {&scores, &dscores}) t->resize(size_t(C) * C);
    for (auto* t : {&ks, &pre}) t->resize(size_t(kDiagBlock) * K);
    for (auto* t : {&q_rstd, &k_rstd, &diag}) t->resize(size_t(C));
    for (auto* t : {&pair, &gate_carry}) t->resize(size_t(K));
    for (auto* t : {&gate_columns, &dgate_acc}) t->resize(size_t(C));
  }

  const int C, K, V, W;  // W: gate width, K for per-channel gates, 1 otherwise
  int L = 0;             // tokens in this chunk

  std::vector<float> q, k, v, dy;      // [C, K], [C, K], [C, V], [C, V]; dy pre-scaled
  std::vector<float> q_rstd, k_rstd;   // [C] reciprocal norms when q, k are L2-normalised
  std::vector<float> decay;            // [C, W] a_t
  std::vector<float> prefix, suffix;   // [C, W] P_i, R_i
  std::vector<float> qg, kd;           // [C, K] q * P, k * R
  std::vector<float> scores, dscores;  // [C, C] intra-chunk scores (zero above the diagonal)
  std::vector<float> pre, ks;          // [b, K] F_rj and k_j * F_rj for the block's keys
  std::vector<float> post, qs;         // [C, K] F_ir and q_i * F_ir for the queries after it
  std::vector<float> panel;            // [C, K] product scratch
  std::vector<float> pair;             // [K] running pairwise factor
  std::vector<float> gate_carry;       // [K] gate-gradient terms carried along the chunk
  std::vector<double> gate_columns, dgate_acc;  // [C] scalar-gate gradient accumulators
  std::vector<float> out;              // [C, V] y
  std::vector<float> dq, dk, dv, dgate;
  std::vector<float> dk_state;         // [C, K] the part of dk that flows through the chunk-end state
  std::vector<float> diag;             // [C] dscores_ii, kept out of dq, dk until the gate gradient

  const float* gate_row(const std::vector<float>& t, int i) const { return t.data() + size_t(i) * W; }
};

// Multiplies each row of x [L, width] by its gate factors (broadcast when the gate is scalar).
void scale_rows(float* out, const float* x, const float* factors, int L, int width, int W) {
  for (int i = 0; i < L; ++i) {
    const float* f = factors + size_t(i) * W;
    float* o = out + size_t(i) * width;
    const float* xi = x + size_t(i) * width;
    if (W == 1) {
      for (int c = 0; c < width; ++c) o[c] = xi[c] * f[0];
    } else {
      for (int c = 0; c < width; ++c) o[c] = xi[c] * f[c];
    }
  }
}

// Adds factor * x to acc elementwise over rows [L, width] (broadcast for scalar gates).
void add_scaled_rows(float* acc, const float* x, const float* factors, int L, int width, int W) {
  for (int i = 0; i < L; ++i) {
    const float* f = factors + size_t(i) * W;
    float* a = acc + size_t(i) * width;
    const float* xi = x + size_t(i) * width;
    for (int c = 0; c < width; ++c) a[c] += xi[c] * f[W == 1 ? 0 : c];
  }
}

void load_normalised_row(const RowView& view, int b, int t, int head, bool l2norm, float* dst,
                         float* rstd, int K) {
  load_row(view, b, t, head, dst, K);
  if (!l2norm) return;
  float sum = 0.f;
  for (int c = 0; c < K; ++c) sum += dst[c] * dst[c];
  const float r = 1.0f / std::sqrt(sum + kL2NormEps);
  for (int c = 0; c < K; ++c) dst[c] *= r;
  *rstd = r;
}

// Gradient through x_hat = x * rstd: dx = rstd * (dx_hat - x_hat <x_hat, dx_hat>), in place.
void l2norm_backward(const float* x_hat, float rstd, float* d, int K) {
  float dot = 0.f;
  for (int c = 0; c < K; ++c) dot += x_hat[c] * d[c];
  for (int c = 0; c < K; ++c) d[c] = rstd * (d[c] - x_hat[c] * dot);
}

struct Loader {
  const AdditiveParams& p;
  int b, n;

  void queries(Chunk& ch, int t0) const {
    for (int i = 0; i < ch.L; ++i)
      load_normalised_row(p.q, b, t0 + i, n / p.group_q, p.l2norm_qk, &ch.q[size_t(i) * ch.K],
                          &ch.q_rstd[i], ch.K);
  }
  void keys(Chunk& ch, int t0) const {
    for (int i = 0; i < ch.L; ++i)
      load_normalised_row(p.k, b, t0 + i, n / p.group_k, p.l2norm_qk, &ch.k[size_t(i) * ch.K],
                          &ch.k_rstd[i], ch.K);
  }
  void values(Chunk& ch, int t0) const {
    for (int i = 0; i < ch.L; ++i) load_row(p.v, b, t0 + i, n / p.group_v, &ch.v[size_t(i) * ch.V], ch.V);
  }
  // dy pre-multiplied by scale: every gradient below is then that of the unscaled products.
  void output_grads(Chunk& ch, int t0) const {
    for (int i = 0; i < ch.L; ++i) {
      float* row = &ch.dy[size_t(i) * ch.V];
      load_row(p.dy, b, t0 + i, n, row, ch.V);
      for (int c = 0; c < ch.V; ++c) row[c] *= p.scale;
    }
  }
  // a_t = exp(g_t) and the prefix and suffix products P, R.
  void decays(Chunk& ch, int t0) const {
    const int W = ch.W, L = ch.L;
    for (int i = 0; i < L; ++i) {
      float* a = &ch.decay[size_t(i) * W];
      if (p.gate == GateKind::none) {
        a[0] = 1.0f;
      } else {
        load_row(p.g, b, t0 + i, n / p.group_g, a, W);
        for (int c = 0; c < W; ++c) a[c] = std::exp(a[c]);
      }
    }
    std::memcpy(ch.prefix.data(), ch.decay.data(), sizeof(float) * W);
    for (int i = 1; i < L; ++i)
      for (int c = 0; c < W; ++c)
        ch.prefix[size_t(i) * W + c] = ch.prefix[size_t(i - 1) * W + c] * ch.decay[size_t(i) * W + c];
    for (int c = 0; c < W; ++c) ch.suffix[size_t(L - 1) * W + c] = 1.0f;
    for (int i = L - 2; i >= 0; --i)
      for (int c = 0; c < W; ++c)
        ch.suffix[size_t(i) * W + c] = ch.suffix[size_t(i + 1) * W + c] * ch.decay[size_t(i + 1) * W + c];
  }
};

// Per-channel factors for the block [j0, j1) with reference row r = j1 - 1:
//   pre_j  = F_rj for the block's keys, ks_j = k_j * pre_j
//   post_i = F_ir for the queries i in [j1, L), qs_i = q_i * post_i
void block_factors(Chunk& ch, int j0, int j1) {
  const int K = ch.K, L = ch.L;
  const int r = j1 - 1;
  for (int c = 0; c < K; ++c) ch.pre[size_t(r - j0) * K + c] = 1.0f;
  for (int j = r - 1; j >= j0; --j)
    for (int c = 0; c < K; ++c)
      ch.pre[size_t(j - j0) * K + c] = ch.pre[size_t(j + 1 - j0) * K + c] * ch.decay[size_t(j + 1) * K + c];
  std::memcpy(ch.post.data(), &ch.decay[size_t(j1) * K], sizeof(float) * K);
  for (int i = j1 + 1; i < L; ++i)
    for (int c = 0; c < K; ++c)
      ch.post[size_t(i - j1) * K + c] = ch.post[size_t(i - 1 - j1) * K + c] * ch.decay[size_t(i) * K + c];
  for (int j = j0; j < j1; ++j)
    for (int c = 0; c < K; ++c)
      ch.ks[size_t(j - j0) * K + c] = ch.k[size_t(j) * K + c] * ch.pre[size_t(j - j0) * K + c];
  for (int i = j1; i < L; ++i)
    for (int c = 0; c < K; ++c)
      ch.qs[size_t(i - j1) * K + c] = ch.q[size_t(i) * K + c] * ch.post[size_t(i - j1) * K + c];
}

// Scalar gate: D_ij = F_ij for j <= i, 0 above the diagonal, applied to a score matrix in place.
void apply_scalar_decay(Chunk& ch, float* m) {
  const int C = ch.C, L = ch.L;
  for (int i = 0; i < L; ++i) {
    float* row = m + size_t(i) * C;
    float f = 1.0f;
    for (int j = i; j >= 0; --j) {
      row[j] *= f;
      f *= ch.decay[j];
    }
    for (int j = i + 1; j < L; ++j) row[j] = 0.f;
  }
}

// scores_ij = <q_i * F_ij, k_j> for j <= i, 0 above the diagonal.
void intra_scores(Chunk& ch) {
  const int C = ch.C, K = ch.K, L = ch.L;
  float* A = ch.scores.data();
  if (ch.W == 1) {
    gemm_nt(L, L, K, ch.q.data(), K, ch.k.data(), K, A, C, false);
    apply_scalar_decay(ch, A);
    return;
  }
  for (int i = 0; i < L; ++i) std::memset(A + size_t(i) * C, 0, sizeof(float) * L);
  for (int j0 = 0; j0 < L; j0 += kDiagBlock) {
    const int j1 = std::min(j0 + kDiagBlock, L);
    for (int i = j0; i < j1; ++i) {
      const float* qi = &ch.q[size_t(i) * K];
      float* f = ch.pair.data();
      for (int c = 0; c < K; ++c) f[c] = 1.0f;
      for (int j = i; j >= j0; --j) {
        const float* kj = &ch.k[size_t(j) * K];
        const float* aj = &ch.decay[size_t(j) * K];
        float s = 0.f;
        for (int c = 0; c < K; ++c) s += qi[c] * f[c] * kj[c];
        A[size_t(i) * C + j] = s;
        for (int c = 0; c < K; ++c) f[c] *= aj[c];
      }
    }
    if (j1 < L) {
      block_factors(ch, j0, j1);
      gemm_nt(L - j1, j1 - j0, K, ch.qs.data(), K, ch.ks.data(), K, A + size_t(j1) * C + j0, C,
              false);
    }
  }
}

// Adds the strictly causal (j < i) intra-chunk parts of dq and dk given dscores, and keeps the
// diagonal dscores_ii in ch.diag: its share of q * dq and k * dk cancels exactly in the gate
// gradient, so it is added only after that.
void intra_backward(Chunk& ch) {
  const int C = ch.C, K = ch.K, L = ch.L;
  float* dA = ch.dscores.data();
  if (ch.W == 1) {
    apply_scalar_decay(ch, dA);
    for (int i = 0; i < L; ++i) {
      ch.diag[i] = dA[size_t(i) * C + i];
      dA[size_t(i) * C + i] = 0.f;
    }
    gemm_nn(L, K, L, dA, C, ch.k.data(), K, ch.dq.data(), K, true);
    gemm_tn(L, K, L, dA, C, ch.q.data(), K, ch.dk.data(), K, true);
    return;
  }
  for (int j0 = 0; j0 < L; j0 += kDiagBlock) {
    const int j1 = std::min(j0 + kDiagBlock, L);
    for (int i = j0; i < j1; ++i) {
      const float* qi = &ch.q[size_t(i) * K];
      float* dqi = &ch.dq[size_t(i) * K];
      ch.diag[i] = dA[size_t(i) * C + i];
      float* f = ch.pair.data();
      for (int c = 0; c < K; ++c) f[c] = 1.0f;
      for (int j = i - 1; j >= j0; --j) {
        const float w = dA[size_t(i) * C + j];
        const float* kj = &ch.k[size_t(j) * K];
        float* dkj = &ch.dk[size_t(j) * K];
        const float* a = &ch.decay[size_t(j + 1) * K];
        for (int c = 0; c < K; ++c) {
          f[c] *= a[c];
          const float wf = w * f[c];
          dqi[c] += wf * kj[c];
          dkj[c] += wf * qi[c];
        }
      }
    }
    if (j1 < L) {
      block_factors(ch, j0, j1);
      const float* panel_dA = dA + size_t(j1) * C + j0;
      gemm_nn(L - j1, K, j1 - j0, panel_dA, C, ch.ks.data(), K, ch.panel.data(), K, false);
      add_scaled_rows(&ch.dq[size_t(j1) * K], ch.panel.data(), ch.post.data(), L - j1, K, K);
      gemm_tn(j1 - j0, K, L - j1, panel_dA, C, ch.qs.data(), K, ch.panel.data(), K, false);
      add_scaled_rows(&ch.dk[size_t(j0) * K], ch.panel.data(), ch.pre.data(), j1 - j0, K, K);
    }
  }
}

// H [K, V] rows scaled by the chunk's total decay P_{L-1}.
void decay_state(const Chunk& ch, float* H) {
  const float* total = ch.gate_row(ch.prefix, ch.L - 1);
  for (int c = 0; c < ch.K; ++c) {
    const float f = total[ch.W == 1 ? 0 : c];
    for (int j = 0; j < ch.V; ++j) H[size_t(c) * ch.V + j] *= f;
  }
}

void load_state(const RowView& view, int b, int n, float* H, int K, int V) {
  if (!view.present()) {
    std::memset(H, 0, sizeof(float) * size_t(K) * V);
    return;
  }
  for (int c = 0; c < K; ++c) load_row(view, b, n, c, H + size_t(c) * V, V);
}

void store_state(const RowView& view, int b, int n, const float* H, int K, int V) {
  for (int c = 0; c < K; ++c) store_row(view, b, n, c, H + size_t(c) * V, V);
}

int chunk_count(const AdditiveParams& p) { return (p.S + p.chunk - 1) / p.chunk; }

// The fused forward of one (batch, head): the state H [K, V] stays in cache for the whole
// sequence. With `states`, also keeps H at every chunk start and at the end ([chunks + 1, K, V]);
// with `write_y`, computes and writes y.
void forward_sequence(const AdditiveParams& p, int b, int n, Chunk& ch, float* H, float* states,
                      bool write_y) {
  const int C = ch.C, K = ch.K, V = ch.V;
  const Loader load{p, b, n};
  load_state(p.h0, b, n, H, K, V);
  for (int c = 0, t0 = 0; t0 < p.S; ++c, t0 += C) {
    ch.L = std::min(C, p.S - t0);
    const int L = ch.L;
    load.keys(ch, t0);
    load.values(ch, t0);
    load.decays(ch, t0);
    if (states) std::memcpy(states + size_t(c) * K * V, H, sizeof(float) * size_t(K) * V);
    if (write_y) {
      load.queries(ch, t0);
      scale_rows(ch.qg.data(), ch.q.data(), ch.prefix.data(), L, K, ch.W);
      intra_scores(ch);
      gemm_nn(L, V, K, ch.qg.data(), K, H, V, ch.out.data(), V, false);
      gemm_nn(L, V, L, ch.scores.data(), C, ch.v.data(), V, ch.out.data(), V, true);
      for (int i = 0; i < L; ++i) {
        float* row = &ch.out[size_t(i) * V];
        for (int j = 0; j < V; ++j) row[j] *= p.scale;
        store_row(p.y, b, t0 + i, n, row, V);
      }
    }
    scale_rows(ch.kd.data(), ch.k.data(), ch.suffix.data(), L, K, ch.W);
    decay_state(ch, H);
    gemm_tn(K, V, L, ch.kd.data(), K, ch.v.data(), V, H, V, true);
  }
  if (states) std::memcpy(states + size_t(chunk_count(p)) * K * V, H, sizeof(float) * size_t(K) * V);
}

// Where one head's gradients go: straight to the outputs, or to fp32 scratch rows (b, s, n)
// that a fixed-order reduction sums over the heads sharing an input.
struct GradSinks {
  RowView dq, dk, dv, dg;
};

// Gradient wrt the log gates. Differentiating the chunk's prefix sums of g gives, for token t,
//   dg_t = sum_{s>=t} (q_s * dq_s - k_s * dk_s) + <dH_end, H_end>   (per channel)
// (seed paper, Backward Recurrence). Written out, the terms of equal magnitude and opposite sign
// in it cancel exactly: the diagonal scores, and the keys j >= t against the boundary term. What
// remains, evaluated below without forming the cancelling pairs, is
//   dg_t = sum_{i>=t} q_i * dq_state_i + sum_{i>=t, j<t} X_ij + sum_{j<t} k_j * dk_state_j
//          + P_{L-1} * <dH_end, H0>
// with X_ij = dscores_ij * F_ij * q_i * k_j the pair terms, dq_state = P * (dY H0^T) and
// dk_state = R * (V dH^T). So strong decay keeps its relative accuracy: every term carries the
// decay that makes it small.

// Scalar gate: X_ij summed over channels is dscores_ij * scores_ij, so the rectangle sums over
// (i >= t, j < t) are O(L^2) on the score tiles. Call before intra_backward (it reads the raw
// dscores and the state parts of dq). Accumulates in float64: L^2 terms of both signs.
void scalar_gate_gradient(Chunk& ch, const float* dH, const float* H0) {
  const int C = ch.C, K = ch.K, V = ch.V, L = ch.L;
  auto dot = [](const float* a, const float* b, int n) {
    double s = 0;
    for (int c = 0; c < n; ++c) s += double(a[c]) * b[c];
    return s;
  };
  double boundary = 0;
  for (int c = 0; c < K; ++c) boundary += dot(dH + size_t(c) * V, H0 + size_t(c) * V, V);
  boundary *= ch.prefix[size_t(L - 1)];

  std::vector<double>& columns = ch.gate_columns;  // sum_{i>=t} X_ij for each j < t
  std::fill(columns.begin(), columns.begin() + L, 0.0);
  double query_suffix = 0, pairs = 0;
  for (int t = L - 1; t >= 0; --t) {
    const float* X_dA = &ch.dscores[size_t(t) * C];
    const float* X_A = &ch.scores[size_t(t) * C];
    for (int j = 0; j < t; ++j) columns[size_t(j)] += double(X_dA[j]) * X_A[j];
    // pairs(t) = sum_{i>=t, j<t} X_ij = pairs(t+1) - sum_{i>t} X_it + sum_{j<t} X_tj
    pairs -= columns[size_t(t)];
    for (int j = 0; j < t; ++j) pairs += double(X_dA[j]) * X_A[j];
    query_suffix += dot(&ch.q[size_t(t) * K], &ch.dq[size_t(t) * K], K);
    ch.dgate_acc[size_t(t)] = query_suffix + pairs + boundary;
  }
  double key_prefix = 0;
  for (int t = 0; t < L; ++t) {
    ch.dgate[size_t(t)] = float(ch.dgate_acc[size_t(t)] + key_prefix);
    key_prefix += dot(&ch.k[size_t(t) * K], &ch.dk_state[size_t(t) * K], K);
  }
}

// Per-channel gate: the pair terms need the per-channel factors F_ij, which only the products
// in intra_backward apply, so it evaluates sum_{s>=t} (q_s * dq_s - k_s * dk_s) from their
// strictly causal results (the diagonal left out) and adds the key and boundary terms. Call
// after intra_backward.
void channel_gate_gradient(Chunk& ch, const float* dH, const float* H0) {
  const int K = ch.K, V = ch.V, L = ch.L;
  for (int i = 0; i < L; ++i) {
    float* dg = &ch.dgate[size_t(i) * K];
    const float *qi = &ch.q[size_t(i) * K], *dqi = &ch.dq[size_t(i) * K];
    const float *ki = &ch.k[size_t(i) * K], *dki = &ch.dk[size_t(i) * K];
    for (int c = 0; c < K; ++c) dg[c] = qi[c] * dqi[c] - ki[c] * dki[c];
  }
  for (int i = L - 2; i >= 0; --i)
    for (int c = 0; c < K; ++c) ch.dgate[size_t(i) * K + c] += ch.dgate[size_t(i + 1) * K + c];
  float* carry = ch.gate_carry.data();  // [K] boundary term plus the keys before t
  const float* total = ch.gate_row(ch.prefix, L - 1);
  for (int c = 0; c < K; ++c) {
    float s = 0.f;
    for (int j = 0; j < V; ++j) s += dH[size_t(c) * V + j] * H0[size_t(c) * V + j];
    carry[c] = total[c] * s;
  }
  for (int t = 0; t < L; ++t) {
    float* dg = &ch.dgate[size_t(t) * K];
    const float *kt = &ch.k[size_t(t) * K], *dkt = &ch.dk_state[size_t(t) * K];
    for (int c = 0; c < K; ++c) {
      dg[c] += carry[c];
      carry[c] += kt[c] * dkt[c];
    }
  }
}

// The gradient pass of one (batch, head), chunks in reverse, carrying dH [K, V] (the gradient
// wrt the state at the current chunk's end). `states` holds the chunk-start states.
void backward_sequence(const AdditiveParams& p, int b, int n, Chunk& ch, const float* states,
                       float* dH, const GradSinks& sinks) {
  const int C = ch.C, K = ch.K, V = ch.V;
  const Loader load{p, b, n};
  load_state(p.dht, b, n, dH, K, V);
  for (int c = chunk_count(p) - 1; c >= 0; --c) {
    const int t0 = c * C;
    ch.L = std::min(C, p.S - t0);
    const int L = ch.L;
    const float* H0 = states + size_t(c) * K * V;
    load.queries(ch, t0);
    load.keys(ch, t0);
    load.values(ch, t0);
    load.output_grads(ch, t0);
    load.decays(ch, t0);
    scale_rows(ch.qg.data(), ch.q.data(), ch.prefix.data(), L, K, ch.W);
    scale_rows(ch.kd.data(), ch.k.data(), ch.suffix.data(), L, K, ch.W);
    intra_scores(ch);
    gemm_nt(L, L, V, ch.dy.data(), V, ch.v.data(), V, ch.dscores.data(), C, false);

    // dq = P * (dY H0^T) + intra;  dk = R * (V dH^T) + intra;  dv = A^T dY + (k * R) dH.
    // The state part of dk and the diagonal of the intra part stay apart until after dg.
    gemm_nt(L, K, V, ch.dy.data(), V, H0, V, ch.panel.data(), K, false);
    scale_rows(ch.dq.data(), ch.panel.data(), ch.prefix.data(), L, K, ch.W);
    gemm_nt(L, K, V, ch.v.data(), V, dH, V, ch.panel.data(), K, false);
    scale_rows(ch.dk_state.data(), ch.panel.data(), ch.suffix.data(), L, K, ch.W);
    std::fill(ch.dk.begin(), ch.dk.begin() + size_t(L) * K, 0.f);
    gemm_tn(L, V, L, ch.scores.data(), C, ch.dy.data(), V, ch.dv.data(), V, false);
    gemm_nn(L, V, K, ch.kd.data(), K, dH, V, ch.dv.data(), V, true);
    if (p.gate == GateKind::scalar) scalar_gate_gradient(ch, dH, H0);
    intra_backward(ch);
    if (p.gate == GateKind::channel) channel_gate_gradient(ch, dH, H0);
    if (p.gate != GateKind::none) {
      for (int i = 0; i < L; ++i) store_row(sinks.dg, b, t0 + i, n, ch.gate_row(ch.dgate, i), ch.W);
    }
    // dH <- P_{L-1} * dH + (q * P)^T dY: the gradient wrt the chunk-start state.
    decay_state(ch, dH);
    gemm_tn(K, V, L, ch.qg.data(), K, ch.dy.data(), V, dH, V, true);

    for (int i = 0; i < L; ++i) {
      float* dqi = &ch.dq[size_t(i) * K];
      float* dki = &ch.dk[size_t(i) * K];
      const float *qi = &ch.q[size_t(i) * K], *ki = &ch.k[size_t(i) * K];
      const float *dk_state = &ch.dk_state[size_t(i) * K], w = ch.diag[i];
      for (int c = 0; c < K; ++c) {
        dqi[c] += w * ki[c];
        dki[c] += w * qi[c] + dk_state[c];
      }
      if (p.l2norm_qk) {
        l2norm_backward(&ch.q[size_t(i) * K], ch.q_rstd[i], dqi, K);
        l2norm_backward(&ch.k[size_t(i) * K], ch.k_rstd[i], dki, K);
      }
      store_row(sinks.dq, b, t0 + i, n, dqi, K);
      store_row(sinks.dk, b, t0 + i, n, dki, K);
      store_row(sinks.dv, b, t0 + i, n, &ch.dv[size_t(i) * V], V);
    }
  }
  if (p.dh0.present()) store_state(p.dh0, b, n, dH, K, V);
}

// fp32 scratch [B, S, N, width] for per-head gradients of a shared input.
struct Scratch {
  std::vector<float> data;
  RowView view(int S, int N, int width) {
    RowView r;
    r.base = reinterpret_cast<char*>(data.data());
    r.dtype = DType::f32;
    r.stride0 = int64_t(S) * N * width;
    r.stride1 = int64_t(N) * width;
    r.stride2 = width;
    return r;
  }
};

// out(b, s, x) = sum over the heads n = x*group .. x*group+group-1 of scratch(b, s, n), in that
// order. With over_sequence (retnet's per-head gate) out(x) also sums over b, then s.
void reduce_heads(const AdditiveParams& p, const RowView& scratch, const RowView& out, int group,
                  int width, bool over_sequence) {
  const int Nx = p.N / group;
  if (over_sequence) {
    // Thousands of terms of both signs: summed in float64, rounded once.
    std::vector<double> acc(static_cast<size_t>(width));
    std::vector<float> row(static_cast<size_t>(width)), result(static_cast<size_t>(width));
    for (int x = 0; x < Nx; ++x) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int b = 0; b < p.B; ++b)
        for (int s = 0; s < p.S; ++s)
          for (int r = 0; r < group; ++r) {
            load_row(scratch, b, s, x * group + r, row.data(), width);
            for (int c = 0; c < width; ++c) acc[size_t(c)] += row[size_t(c)];
          }
      for (int c = 0; c < width; ++c) result[size_t(c)] = float(acc[size_t(c)]);
      store_row(out, 0, 0, x, result.data(), width);
    }
    return;
  }
  parallel_ranges(int64_t(p.B) * p.S, p.threads, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(width)), row(static_cast<size_t>(width));
    for (int64_t bs = begin; bs < end; ++bs) {
      const int b = int(bs / p.S), s = int(bs % p.S);
      for (int x = 0; x < Nx; ++x) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int r = 0; r < group; ++r) {
          load_row(scratch, b, s, x * group + r, row.data(), width);
          for (int c = 0; c < width; ++c) acc[size_t(c)] += row[size_t(c)];
        }
        store_row(out, b, s, x, acc.data(), width);
      }
    }
  });
}

}  // namespace

void additive_forward(const AdditiveParams& p) {
  parallel_ranges(int64_t(p.B) * p.N, p.threads, [&](int64_t begin, int64_t end) {
    Chunk ch(p);
    std::vector<float> H(size_t(p.K) * p.V);
    for (int64_t item = begin; item < end; ++item) {
      const int b = int(item / p.N), n = int(item % p.N);
      forward_sequence(p, b, n, ch, H.data(), nullptr, true);
      if (p.ht.present()) store_state(p.ht, b, n, H.data(), p.K, p.V);
    }
  });
}

void additive_backward(const AdditiveParams& p) {
  const int gate_width = p.gate == GateKind::channel ? p.K : 1;
  const bool gate_reduced = p.gate != GateKind::none && (p.group_g > 1 || p.gate_per_sequence);
  Scratch scratch_q, scratch_k, scratch_v, scratch_g;
  auto sink = [&](Scratch& scratch, const RowView& out, bool reduced, int width) {
    if (!reduced) return out;
    scratch.data.resize(size_t(p.B) * p.S * p.N * width);
    return scratch.view(p.S, p.N, width);
  };
  GradSinks sinks{sink(scratch_q, p.dq, p.group_q > 1, p.K), sink(scratch_k, p.dk, p.group_k > 1, p.K),
                  sink(scratch_v, p.dv, p.group_v > 1, p.V),
                  sink(scratch_g, p.dg, gate_reduced, gate_width)};

  parallel_ranges(int64_t(p.B) * p.N, p.threads, [&](int64_t begin, int64_t end) {
    Chunk ch(p);
    std::vector<float> states(size_t(chunk_count(p) + 1) * p.K * p.V);
    std::vector<float> H(size_t(p.K) * p.V), dH(size_t(p.K) * p.V);
    for (int64_t item = begin; item < end; ++item) {
      const int b = int(item / p.N), n = int(item % p.N);
      forward_sequence(p, b, n, ch, H.data(), states.data(), false);
      backward_sequence(p, b, n, ch, states.data(), dH.data(), sinks);
    }
  });

  if (p.group_q > 1) reduce_heads(p, sinks.dq, p.dq, p.group_q, p.K, false);
  if (p.group_k > 1) reduce_heads(p, sinks.dk, p.dk, p.group_k, p.K, false);
  if (p.group_v > 1) reduce_heads(p, sinks.dv, p.dv, p.group_v, p.V, false);
  if (gate_reduced) reduce_heads(p, sinks.dg, p.dg, p.group_g, gate_width, p.gate_per_sequence);
}

}  // namespace flat::cpu

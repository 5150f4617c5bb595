// The step-by-step recurrence in fp32, one token at a time, the way CPU inference engines run
// linear attention (llama.cpp's gated-linear-attention and RWKV ops): per token, one pass over the
// state H [K, V] decays it, adds k v^T and reads y off it. The backward walks the tokens in
// reverse, replaying the states of each segment from fp32 checkpoints.
//
// It is what the fused kernels are measured against, so it is written to be a fair one:
// state rows are padded to whole vectors so every inner loop runs over contiguous V without a
// tail, dot products keep their partial sums in vector lanes (the compiler may not reorder a
// scalar sum), and the walks are compiled for each instruction-set level the CPU targets use, the
// copy run being the one of the call's target (FLAT_ISA included), like the kernels'.
#include "baseline/baselines.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/recurrence.h"
#include "cpu/rescale.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"
#include "cpu/targets.h"

namespace flat::baseline {
namespace {

constexpr int kLanes = 16;  // fp32 lanes of an AVX-512 vector; state rows are padded to a multiple
constexpr float kL2NormEps = 1e-6f;
// Tokens between checkpoints in the backward. The replayed states of one segment
// (kSegment + 1 states of K x V fp32, 1.1 MiB at K = V = 128) stay in a core's 2 MiB L2 while
// the reverse walk reads them back; at 64 tokens they would spill and every state would make a
// round trip through L3 (gla's backward at B=2 S=4096 N=16 K=V=128: 0.69 s, against 1.46 s).
constexpr int kSegment = 16;

int padded(int width) { return (width + kLanes - 1) / kLanes * kLanes; }

float lane_sum(const float (&lanes)[kLanes]) {
  float sum = 0.f;
  for (float x : lanes) sum += x;
  return sum;
}

// The row loops over one padded state row [Vp]. Each is one pass over the row, as an inference
// engine's fused op: the state is read and written once per token.

// h <- a h + kc v;  y += qc h   (forward)
[[gnu::always_inline]] inline void forward_row(float* __restrict h, float* __restrict y,
                                               const float* __restrict v, float a, float kc,
                                               float qc, int Vp) {
  for (int j = 0; j < Vp; ++j) {
    const float x = a * h[j] + kc * v[j];
    h[j] = x;
    y[j] += qc * x;
  }
}

// h <- a h + kc v   (the checkpoint pass of the backward)
[[gnu::always_inline]] inline void advance_row(float* __restrict h, const float* __restrict v,
                                               float a, float kc, int Vp) {
  for (int j = 0; j < Vp; ++j) h[j] = a * h[j] + kc * v[j];
}

// next = a prev + kc v; returns <next, dy>   (replay of a segment, with dq's row)
[[gnu::always_inline]] inline float replay_row(float* __restrict next, const float* __restrict prev,
                                               const float* __restrict v,
                                               const float* __restrict dy, float a, float kc,
                                               int Vp) {
  float dot[kLanes] = {};
  for (int j = 0; j < Vp; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float x = a * prev[j + l] + kc * v[j + l];
      next[j + l] = x;
      dot[l] += x * dy[j + l];
    }
  return lane_sum(dot);
}

// One token of the reverse walk on row c of dH:
//   d += qc dy (dH_t),  dk_c = <d, v>,  dv += kc d,  gate_dot = <d, H_{t-1}[c]>,  d <- a d.
[[gnu::always_inline]] inline void reverse_row(float* __restrict d, float* __restrict dv,
                                               const float* __restrict prev,
                                               const float* __restrict v,
                                               const float* __restrict dy, float a, float kc,
                                               float qc, int Vp, float& dk, float& gate_dot) {
  float dk_lanes[kLanes] = {}, gate_lanes[kLanes] = {};
  for (int j = 0; j < Vp; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float x = d[j + l] + qc * dy[j + l];
      dk_lanes[l] += x * v[j + l];
      gate_lanes[l] += x * prev[j + l];
      dv[j + l] += kc * x;
      d[j + l] = a * x;
    }
  dk = lane_sum(dk_lanes);
  gate_dot = lane_sum(gate_lanes);
}

// Loads row (b, t, head) of q or k, L2-normalised when asked; returns the reciprocal norm.
float load_normalised(const RowView& view, int b, int t, int head, bool l2norm, float* dst, int K) {
  cpu::load_row(view, b, t, head, dst, K);
  if (!l2norm) return 1.f;
  const auto sum_of_squares = [](const float* x, int n) {
    float sum = 0.f;
    for (int c = 0; c < n; ++c) sum += x[c] * x[c];
    return sum;
  };
  float sum = sum_of_squares(dst, K), eps = kL2NormEps;
  const float s = cpu::rescale_overflowed_row(dst, K, sum, eps, sum_of_squares);
  const float r = 1.f / std::sqrt(sum + eps);
  for (int c = 0; c < K; ++c) dst[c] *= r;
  return r * s;
}

// Gradient through x_hat = x * rstd, in place: dx = rstd (dx_hat - x_hat <x_hat, dx_hat>).
void l2norm_backward(const float* x_hat, float rstd, float* d, int K) {
  float dot = 0.f;
  for (int c = 0; c < K; ++c) dot += x_hat[c] * d[c];
  for (int c = 0; c < K; ++c) d[c] = rstd * (d[c] - x_hat[c] * dot);
}

// The fp32 inputs of up to `capacity` consecutive tokens of one (batch, head): q and k
// normalised when asked, v and dy padded to Vp with zeros, the decay a = exp(g) per gate
// channel (1 without a gate; a grouped gate spread over its channels), and the delta rule's
// erase and write rows bt = b * k [K], vt = w * v [Vp] (b = w = beta but for gdn2).
struct Tokens {
  Tokens(const Params& p, int capacity)
      : K(p.K), V(p.V), Vp(padded(p.V)), W(p.gate == GateKind::channel ? p.K : 1) {
    q.resize(size_t(capacity) * K);
    k.resize(size_t(capacity) * K);
    v.assign(size_t(capacity) * Vp, 0.f);
    dy.assign(size_t(capacity) * Vp, 0.f);
    decay.assign(size_t(capacity) * W, 1.f);
    q_rstd.resize(size_t(capacity));
    k_rstd.resize(size_t(capacity));
    if (p.delta != Delta::none) {
      beta.resize(size_t(capacity));
      erase.resize(size_t(capacity) * K);
      write.assign(size_t(capacity) * Vp, 0.f);
      bt.resize(size_t(capacity) * K);
      vt.assign(size_t(capacity) * Vp, 0.f);
    }
  }

  const int K, V, Vp, W;
  std::vector<float> q, k, v, dy, decay, q_rstd, k_rstd;
  std::vector<float> beta, erase, write, bt, vt;

  float* row(std::vector<float>& x, int i, int width) { return x.data() + size_t(i) * width; }
  float gate(int i, int c) const { return decay[size_t(i) * W + size_t(W == 1 ? 0 : c)]; }

  // What the state update needs: k, v, a.
  void load_update(const Params& p, int b, int n, int t, int i) {
    k_rstd[size_t(i)] = load_normalised(p.k, b, t, n / p.group_k, p.l2norm_qk, row(k, i, K), K);
    cpu::load_row(p.v, b, t, n / p.group_v, row(v, i, Vp), V);
    if (p.delta != Delta::none) load_strengths(p, b, n, t, i);
    if (p.gate == GateKind::none) return;
    float* a = row(decay, i, W);
    const int G = p.gate == GateKind::channel ? p.gate_group : 1;
    cpu::load_row(p.g, b, t, n / p.group_g, a, W / G);
    for (int c = W - 1; c >= 0; --c) a[c] = std::exp(a[c / G]);
  }
  void load_strengths(const Params& p, int b, int n, int t, int i) {
    float *e = row(erase, i, K), *w = row(write, i, Vp);
    if (p.delta == Delta::beta) {
      cpu::load_row(p.beta, b, t, n / p.group_b, &beta[size_t(i)], 1);
      std::fill(e, e + K, beta[size_t(i)]);
      std::fill(w, w + V, beta[size_t(i)]);
    } else {
      cpu::load_row(p.b, b, t, n / p.group_b, e, K);
      cpu::load_row(p.w, b, t, n / p.group_w, w, V);
    }
    const float *kk = row(k, i, K), *vv = row(v, i, Vp);
    float *bti = row(bt, i, K), *vti = row(vt, i, Vp);
    for (int c = 0; c < K; ++c) bti[c] = e[c] * kk[c];
    for (int j = 0; j < Vp; ++j) vti[j] = w[j] * vv[j];
  }
  void load_query(const Params& p, int b, int n, int t, int i) {
    q_rstd[size_t(i)] = load_normalised(p.q, b, t, n / p.group_q, p.l2norm_qk, row(q, i, K), K);
  }
  void load_dy(const Params& p, int b, int n, int t, int i) {
    cpu::load_row(p.dy, b, t, n, row(dy, i, Vp), V);
  }
};

void load_state(const RowView& view, int b, int n, float* H, int K, int V, int Vp) {
  std::fill(H, H + size_t(K) * Vp, 0.f);
  if (!view.present()) return;
  for (int c = 0; c < K; ++c) cpu::load_row(view, b, n, c, H + size_t(c) * Vp, V);
}

void store_state(const RowView& view, int b, int n, const float* H, int K, int V, int Vp) {
  if (!view.present()) return;
  for (int c = 0; c < K; ++c) cpu::store_row(view, b, n, c, H + size_t(c) * Vp, V);
}

// The per-channel gate gradient row [W] of one token in the gate's own width: summed per group
// of channels for grouped gates (a scalar gate's is already one value).
void store_gate_gradient(const Params& p, const cpu::GradSinks& grads, int b, int t, int n, float* dg) {
  const int G = p.gate == GateKind::channel ? p.gate_group : 1;
  if (G > 1) {
    for (int x = 0; x < p.K / G; ++x) {
      float sum = 0.f;
      for (int c = 0; c < G; ++c) sum += dg[x * G + c];
      dg[x] = sum;
    }
  }
  cpu::store_row(grads.dg, b, t, n, dg, p.gate == GateKind::channel ? p.K / G : 1);
}

// fp32 buffers of one thread, reused across its (batch, head) items.
struct Scratch {
  Scratch(const Params& p, int tokens, int states)
      : in(p, tokens), H(size_t(states) * p.K * padded(p.V)), y(size_t(padded(p.V))) {}
  Tokens in;
  std::vector<float> H;  // [states, K, Vp]
  std::vector<float> y;  // [Vp]
};

[[gnu::always_inline]] inline void forward_sequence(const Params& p, int b, int n, Scratch& w) {
  Tokens& in = w.in;
  const int K = p.K, V = p.V, Vp = in.Vp;
  float* H = w.H.data();
  load_state(p.h0, b, n, H, K, V, Vp);
  for (int t = 0; t < p.S; ++t) {
    in.load_update(p, b, n, t, 0);
    in.load_query(p, b, n, t, 0);
    std::fill(w.y.begin(), w.y.end(), 0.f);
    for (int c = 0; c < K; ++c)
      forward_row(H + size_t(c) * Vp, w.y.data(), in.v.data(), in.gate(0, c), in.k[size_t(c)],
                  p.scale * in.q[size_t(c)], Vp);
    cpu::store_row(p.y, b, t, n, w.y.data(), V);
  }
  store_state(p.ht, b, n, H, K, V, Vp);
}

// Per (batch, head): a forward pass keeping the state before every kSegment-th token, then the
// segments in reverse: replay the segment's states from its checkpoint (computing dq on the
// way, dq_t = scale H_t dy_t), then walk its tokens backwards carrying dH.
[[gnu::always_inline]] inline void backward_sequence(const Params& p, int b, int n,
                                                     Scratch& w, const cpu::GradSinks& grads) {
  Tokens& in = w.in;
  const int K = p.K, V = p.V, Vp = in.Vp, W = in.W;
  const size_t state = size_t(K) * Vp;
  const int segments = (p.S + kSegment - 1) / kSegment;
  // w.H: [dH, kSegment + 1 replayed states, one checkpoint per segment]
  float* dH = w.H.data();
  float* replay = dH + state;
  float* checkpoints = replay + (kSegment + 1) * state;

  float* H = replay;
  load_state(p.h0, b, n, H, K, V, Vp);
  for (int t = 0; t < p.S; ++t) {
    if (t % kSegment == 0) std::copy_n(H, state, checkpoints + size_t(t / kSegment) * state);
    in.load_update(p, b, n, t, 0);
    for (int c = 0; c < K; ++c) advance_row(H + size_t(c) * Vp, in.v.data(), in.gate(0, c), in.k[size_t(c)], Vp);
  }

  load_state(p.dht, b, n, dH, K, V, Vp);
  std::vector<float> dq(static_cast<size_t>(K)), dk(static_cast<size_t>(K)), dv(static_cast<size_t>(Vp)),
      dg(static_cast<size_t>(W));
  for (int s = segments - 1; s >= 0; --s) {
    const int t0 = s * kSegment, L = std::min(kSegment, p.S - t0);
    std::copy_n(checkpoints + size_t(s) * state, state, replay);
    for (int i = 0; i < L; ++i) {
      in.load_update(p, b, n, t0 + i, i);
      in.load_query(p, b, n, t0 + i, i);
      in.load_dy(p, b, n, t0 + i, i);
      const float* prev = replay + size_t(i) * state;
      float* next = replay + size_t(i + 1) * state;
      for (int c = 0; c < K; ++c)
        dq[size_t(c)] = p.scale * replay_row(next + size_t(c) * Vp, prev + size_t(c) * Vp,
                                             in.row(in.v, i, Vp), in.row(in.dy, i, Vp),
                                             in.gate(i, c), in.k[size_t(i) * K + size_t(c)], Vp);
      if (p.l2norm_qk) l2norm_backward(in.row(in.q, i, K), in.q_rstd[size_t(i)], dq.data(), K);
      cpu::store_row(grads.dq, b, t0 + i, n, dq.data(), K);
    }
    for (int i = L - 1; i >= 0; --i) {
      const float* prev = replay + size_t(i) * state;
      const float* q = in.row(in.q, i, K);
      const float* k = in.row(in.k, i, K);
      std::fill(dv.begin(), dv.end(), 0.f);
      float scalar_dg = 0.f;
      for (int c = 0; c < K; ++c) {
        const float a = in.gate(i, c);
        float gate_dot;
        reverse_row(dH + size_t(c) * Vp, dv.data(), prev + size_t(c) * Vp, in.row(in.v, i, Vp),
                    in.row(in.dy, i, Vp), a, k[c], p.scale * q[c], Vp, dk[size_t(c)], gate_dot);
        if (W > 1) dg[size_t(c)] = a * gate_dot;
        else scalar_dg += a * gate_dot;
      }
      if (W == 1) dg[0] = scalar_dg;
      if (p.l2norm_qk) l2norm_backward(k, in.k_rstd[size_t(i)], dk.data(), K);
      cpu::store_row(grads.dk, b, t0 + i, n, dk.data(), K);
      cpu::store_row(grads.dv, b, t0 + i, n, dv.data(), V);
      if (p.gate != GateKind::none) store_gate_gradient(p, grads, b, t0 + i, n, dg.data());
    }
  }
  store_state(p.dh0, b, n, dH, K, V, Vp);
}

// ---- The delta rule ----------------------------------------------------------------------------

// One token on the state H [K, Vp]: H' = a H; r = vt - H'^T bt; H = H' + k r^T; and, when y is
// given, y = qs^T H with qs = scale * q. Two passes over the state, as a delta-rule inference op.
[[gnu::always_inline]] inline void delta_step(Tokens& in, int i, float* H, float* r, float* y, const float* qs) {
  const int K = in.K, Vp = in.Vp;
  const float *k = in.row(in.k, i, K), *bt = in.row(in.bt, i, K);
  std::copy_n(in.row(in.vt, i, Vp), Vp, r);
  for (int c = 0; c < K; ++c) {
    float* h = H + size_t(c) * Vp;
    const float a = in.gate(i, c), e = bt[c];
    for (int j = 0; j < Vp; ++j) {
      const float x = a * h[j];
      h[j] = x;
      r[j] -= e * x;
    }
  }
  if (y) std::fill(y, y + Vp, 0.f);
  for (int c = 0; c < K; ++c) {
    float* h = H + size_t(c) * Vp;
    const float kc = k[c], qc = y ? qs[c] : 0.f;
    for (int j = 0; j < Vp; ++j) {
      const float x = h[j] + kc * r[j];
      h[j] = x;
      if (y) y[j] += qc * x;
    }
  }
}

[[gnu::always_inline]] inline void delta_forward_sequence(const Params& p, int b, int n, Scratch& w) {
  Tokens& in = w.in;
  const int K = p.K, V = p.V, Vp = in.Vp;
  float* H = w.H.data();
  std::vector<float> r(static_cast<size_t>(Vp)), qs(static_cast<size_t>(K));
  load_state(p.h0, b, n, H, K, V, Vp);
  for (int t = 0; t < p.S; ++t) {
    in.load_update(p, b, n, t, 0);
    in.load_query(p, b, n, t, 0);
    for (int c = 0; c < K; ++c) qs[size_t(c)] = p.scale * in.q[size_t(c)];
    delta_step(in, 0, H, r.data(), w.y.data(), qs.data());
    cpu::store_row(p.y, b, t, n, w.y.data(), V);
  }
  store_state(p.ht, b, n, H, K, V, Vp);
}

// The reverse walk of the delta rule, segment by segment as for the additive family; per token,
// with dH the gradient wrt H_t (after scale q dy^T):
//   dk = dH r,  dr = dH^T k,  dH' = dH - bt dr^T,  dbt = -H' dr,  dlog a_c = <dH'_c, H'_c>,
//   dH_{t-1} = a dH';  then dvt = dr, and through bt = b k, vt = w v.
[[gnu::always_inline]] inline void delta_backward_sequence(const Params& p, int b, int n, Scratch& w,
                                                           const cpu::GradSinks& grads) {
  Tokens& in = w.in;
  const int K = p.K, V = p.V, Vp = in.Vp, W = in.W;
  const size_t state = size_t(K) * Vp;
  const int segments = (p.S + kSegment - 1) / kSegment;
  float* dH = w.H.data();
  float* replay = dH + state;
  float* checkpoints = replay + (kSegment + 1) * state;
  std::vector<float> r(size_t(kSegment) * Vp), dr(static_cast<size_t>(Vp)), dq(static_cast<size_t>(K)),
      dk(static_cast<size_t>(K)), dbt(static_cast<size_t>(K)), dg(static_cast<size_t>(W)), dv(static_cast<size_t>(Vp)),
      dw(static_cast<size_t>(Vp)), db(static_cast<size_t>(K));

  float* H = replay;
  load_state(p.h0, b, n, H, K, V, Vp);
  for (int t = 0; t < p.S; ++t) {
    if (t % kSegment == 0) std::copy_n(H, state, checkpoints + size_t(t / kSegment) * state);
    in.load_update(p, b, n, t, 0);
    delta_step(in, 0, H, r.data(), nullptr, nullptr);
  }

  load_state(p.dht, b, n, dH, K, V, Vp);
  for (int s = segments - 1; s >= 0; --s) {
    const int t0 = s * kSegment, L = std::min(kSegment, p.S - t0);
    std::copy_n(checkpoints + size_t(s) * state, state, replay);
    for (int i = 0; i < L; ++i) {
      in.load_update(p, b, n, t0 + i, i);
      in.load_query(p, b, n, t0 + i, i);
      in.load_dy(p, b, n, t0 + i, i);
      float* next = replay + size_t(i + 1) * state;
      std::copy_n(replay + size_t(i) * state, state, next);
      delta_step(in, i, next, r.data() + size_t(i) * Vp, nullptr, nullptr);
      const float* dyi = in.row(in.dy, i, Vp);
      for (int c = 0; c < K; ++c) {
        float dot[kLanes] = {};
        const float* h = next + size_t(c) * Vp;
        for (int j = 0; j < Vp; j += kLanes)
          for (int l = 0; l < kLanes; ++l) dot[l] += h[j + l] * dyi[j + l];
        dq[size_t(c)] = p.scale * lane_sum(dot);
      }
      if (p.l2norm_qk) l2norm_backward(in.row(in.q, i, K), in.q_rstd[size_t(i)], dq.data(), K);
      cpu::store_row(grads.dq, b, t0 + i, n, dq.data(), K);
    }
    for (int i = L - 1; i >= 0; --i) {
      const float* prev = replay + size_t(i) * state;
      const float *q = in.row(in.q, i, K), *k = in.row(in.k, i, K), *bt = in.row(in.bt, i, K);
      const float *ri = r.data() + size_t(i) * Vp, *dyi = in.row(in.dy, i, Vp);
      std::fill(dr.begin(), dr.end(), 0.f);
      for (int c = 0; c < K; ++c) {
        float* d = dH + size_t(c) * Vp;
        const float qc = p.scale * q[c], kc = k[c];
        float dot[kLanes] = {};
        for (int j = 0; j < Vp; j += kLanes)
          for (int l = 0; l < kLanes; ++l) {
            const float x = d[j + l] + qc * dyi[j + l];
            d[j + l] = x;
            dot[l] += x * ri[j + l];
            dr[size_t(j + l)] += kc * x;
          }
        dk[size_t(c)] = lane_sum(dot);
      }
      float scalar_dg = 0.f;
      for (int c = 0; c < K; ++c) {
        float* d = dH + size_t(c) * Vp;
        const float* h = prev + size_t(c) * Vp;
        const float a = in.gate(i, c), e = bt[c];
        float erase_dot[kLanes] = {}, gate_dot[kLanes] = {};
        for (int j = 0; j < Vp; j += kLanes)
          for (int l = 0; l < kLanes; ++l) {
            const float hp = a * h[j + l], dp = d[j + l] - e * dr[size_t(j + l)];
            erase_dot[l] += hp * dr[size_t(j + l)];
            gate_dot[l] += dp * hp;
            d[j + l] = a * dp;
          }
        dbt[size_t(c)] = -lane_sum(erase_dot);
        if (W > 1) dg[size_t(c)] = lane_sum(gate_dot);
        else scalar_dg += lane_sum(gate_dot);
      }
      if (W == 1) dg[0] = scalar_dg;
      // bt = b * k and vt = w * v, with dvt = dr.
      const float *erase = in.row(in.erase, i, K), *write = in.row(in.write, i, Vp), *v = in.row(in.v, i, Vp);
      for (int c = 0; c < K; ++c) {
        dk[size_t(c)] += erase[c] * dbt[size_t(c)];
        db[size_t(c)] = k[c] * dbt[size_t(c)];
      }
      for (int j = 0; j < Vp; ++j) {
        dv[size_t(j)] = write[j] * dr[size_t(j)];
        dw[size_t(j)] = v[j] * dr[size_t(j)];
      }
      if (p.delta == Delta::beta) {
        float dbeta = 0.f;
        for (int c = 0; c < K; ++c) dbeta += db[size_t(c)];
        for (int j = 0; j < V; ++j) dbeta += dw[size_t(j)];
        cpu::store_row(grads.dbeta, b, t0 + i, n, &dbeta, 1);
      } else {
        cpu::store_row(grads.db, b, t0 + i, n, db.data(), K);
        cpu::store_row(grads.dw, b, t0 + i, n, dw.data(), V);
      }
      if (p.l2norm_qk) l2norm_backward(k, in.k_rstd[size_t(i)], dk.data(), K);
      cpu::store_row(grads.dk, b, t0 + i, n, dk.data(), K);
      cpu::store_row(grads.dv, b, t0 + i, n, dv.data(), V);
      if (p.gate != GateKind::none) store_gate_gradient(p, grads, b, t0 + i, n, dg.data());
    }
  }
  store_state(p.dh0, b, n, dH, K, V, Vp);
}

// The walks of one (batch, head), compiled once per instruction-set level with the sequences
// inlined into them; what they call out of line (the standard library's) stays at the baseline
// level, so no copy built for a wider level can reach a CPU without it.
struct Walks {
  void (*forward)(const Params& p, int b, int n, Scratch& w);
  void (*backward)(const Params& p, int b, int n, Scratch& w, const cpu::GradSinks& g);
};
#define FLAT_WALKS(name, level)                                                                    \
  level void forward_walk_##name(const Params& p, int b, int n, Scratch& w) {                      \
    if (p.delta == Delta::none) forward_sequence(p, b, n, w);                                      \
    else delta_forward_sequence(p, b, n, w);                                                       \
  }                                                                                                \
  level void backward_walk_##name(const Params& p, int b, int n, Scratch& w, const cpu::GradSinks& g) { \
    if (p.delta == Delta::none) backward_sequence(p, b, n, w, g);                                  \
    else delta_backward_sequence(p, b, n, w, g);                                                   \
  }                                                                                                \
  constexpr Walks k_##name##_walks{.forward = forward_walk_##name, .backward = backward_walk_##name};

FLAT_WALKS(baseline, )
#if defined(__x86_64__) && defined(__GNUC__)
FLAT_WALKS(x86_64_v3, __attribute__((target("arch=x86-64-v3"))))  // AVX2 + FMA: the avx2 target
FLAT_WALKS(x86_64_v4, __attribute__((target("arch=x86-64-v4"))))  // AVX-512: avx512, avx512_bf16
#endif

// The copy for the call's target: the widest level whose instructions the target itself needs.
const Walks& walks_for(const cpu::Target& target) {
#if defined(__x86_64__) && defined(__GNUC__)
  const auto needs = [&](cpu::CpuFeatures features) { return (target.needs & features) == features; };
  if (needs(cpu::kCpuAvx512)) return k_x86_64_v4_walks;
  if (needs(cpu::kCpuAvx2 | cpu::kCpuFma)) return k_x86_64_v3_walks;
#endif
  return k_baseline_walks;
}

}  // namespace

void recurrent_forward(const Params& p, const cpu::Run& run) {
  const Walks& walks = walks_for(run.target);
  cpu::run_ranges(run, int64_t(p.B) * p.N, [&](int64_t begin, int64_t end) {
    Scratch w(p, 1, 1);
    for (int64_t item = begin; item < end; ++item) walks.forward(p, int(item / p.N), int(item % p.N), w);
  });
}

void recurrent_backward(const Params& p, const cpu::Run& run) {
  // One item per head: the gradient rows are those of heads, not of packs of heads.
  Params per_head = p;
  per_head.pack = 1;
  const cpu::Gradients grads(per_head);
  const int segments = (p.S + kSegment - 1) / kSegment;
  const Walks& walks = walks_for(run.target);
  cpu::run_ranges(run, int64_t(p.B) * p.N, [&](int64_t begin, int64_t end) {
    Scratch w(p, kSegment, 1 + (kSegment + 1) + segments);
    for (int64_t item = begin; item < end; ++item)
      walks.backward(p, int(item / p.N), int(item % p.N), w, grads.sinks);
  });
  grads.finish(run);
}

}  // namespace flat::baseline

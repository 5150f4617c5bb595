// The step-by-step recurrence in fp32, one token at a time, the way CPU inference engines run
// linear attention (llama.cpp's gated-linear-attention and RWKV ops): per token, one pass over the
// state H [K, V] decays it, adds k v^T and reads y off it. The backward walks the tokens in
// reverse, replaying the states of each segment from fp32 checkpoints.
//
// It is what the fused kernels are measured against, so it is written to be a fair one:
// state rows are padded to whole vectors so every inner loop runs over contiguous V without a
// tail, dot products keep their partial sums in vector lanes (the compiler may not reorder a
// scalar sum), and the walks are compiled for AVX-512 as well, chosen at run time like the
// kernels' instruction set.
#include "baseline/baselines.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/isa.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace flat::baseline {
namespace {

constexpr int kLanes = 16;  // fp32 lanes of an AVX-512 vector; state rows are padded to a multiple
constexpr float kL2NormEps = 1e-6f;
// Tokens between checkpoints in the backward. The replayed states of one segment
// (kSegment + 1 states of K x V fp32, 1.1 MiB at K = V = 128) stay in a core's 2 MiB L2 while
// the reverse walk reads them back; at 64 tokens they would spill and every state would make a
// round trip through L3.
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
  float sum = 0.f;
  for (int c = 0; c < K; ++c) sum += dst[c] * dst[c];
  const float rstd = 1.f / std::sqrt(sum + kL2NormEps);
  for (int c = 0; c < K; ++c) dst[c] *= rstd;
  return rstd;
}

// Gradient through x_hat = x * rstd, in place: dx = rstd (dx_hat - x_hat <x_hat, dx_hat>).
void l2norm_backward(const float* x_hat, float rstd, float* d, int K) {
  float dot = 0.f;
  for (int c = 0; c < K; ++c) dot += x_hat[c] * d[c];
  for (int c = 0; c < K; ++c) d[c] = rstd * (d[c] - x_hat[c] * dot);
}

// The fp32 inputs of up to `capacity` consecutive tokens of one (batch, head): q and k
// normalised when asked, v and dy padded to Vp with zeros, the decay a = exp(g) per gate
// channel (1 without a gate).
struct Tokens {
  Tokens(const AdditiveParams& p, int capacity)
      : K(p.K), V(p.V), Vp(padded(p.V)), W(p.gate == GateKind::channel ? p.K : 1) {
    q.resize(size_t(capacity) * K);
    k.resize(size_t(capacity) * K);
    v.assign(size_t(capacity) * Vp, 0.f);
    dy.assign(size_t(capacity) * Vp, 0.f);
    decay.assign(size_t(capacity) * W, 1.f);
    q_rstd.resize(size_t(capacity));
    k_rstd.resize(size_t(capacity));
  }

  const int K, V, Vp, W;
  std::vector<float> q, k, v, dy, decay, q_rstd, k_rstd;

  float* row(std::vector<float>& x, int i, int width) { return x.data() + size_t(i) * width; }
  float gate(int i, int c) const { return decay[size_t(i) * W + size_t(W == 1 ? 0 : c)]; }

  // What the state update needs: k, v, a.
  void load_update(const AdditiveParams& p, int b, int n, int t, int i) {
    k_rstd[size_t(i)] = load_normalised(p.k, b, t, n / p.group_k, p.l2norm_qk, row(k, i, K), K);
    cpu::load_row(p.v, b, t, n / p.group_v, row(v, i, Vp), V);
    if (p.gate == GateKind::none) return;
    float* a = row(decay, i, W);
    cpu::load_row(p.g, b, t, n / p.group_g, a, W);
    for (int c = 0; c < W; ++c) a[c] = std::exp(a[c]);
  }
  void load_query(const AdditiveParams& p, int b, int n, int t, int i) {
    q_rstd[size_t(i)] = load_normalised(p.q, b, t, n / p.group_q, p.l2norm_qk, row(q, i, K), K);
  }
  void load_dy(const AdditiveParams& p, int b, int n, int t, int i) {
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

// Where one head's gradient rows go: straight to the output when no other head reads the same
// input, otherwise to fp32 scratch [B, S, N, width] that `reduce` sums over each group of heads
// in head order, so the result does not depend on the thread count.
class GradientRows {
 public:
  GradientRows(const AdditiveParams& p, const RowView& out, int group, int width)
      : out_(out), group_(group), width_(width) {
    if (group_ == 1) {
      rows_ = out;
      return;
    }
    scratch_.resize(size_t(p.B) * p.S * p.N * width);
    rows_.base = reinterpret_cast<char*>(scratch_.data());
    rows_.dtype = DType::f32;
    rows_.stride0 = int64_t(p.S) * p.N * width;
    rows_.stride1 = int64_t(p.N) * width;
    rows_.stride2 = width;
  }

  void store(int b, int t, int n, const float* row) const { cpu::store_row(rows_, b, t, n, row, width_); }

  void reduce(const AdditiveParams& p) const {
    if (group_ == 1) return;
    cpu::parallel_ranges(int64_t(p.B) * p.S, p.threads, [&](int64_t begin, int64_t end) {
      std::vector<float> sum(static_cast<size_t>(width_)), row(static_cast<size_t>(width_));
      for (int64_t bs = begin; bs < end; ++bs) {
        const int b = int(bs / p.S), t = int(bs % p.S);
        for (int x = 0; x < p.N / group_; ++x) {
          std::fill(sum.begin(), sum.end(), 0.f);
          for (int r = 0; r < group_; ++r) {
            cpu::load_row(rows_, b, t, x * group_ + r, row.data(), width_);
            for (int c = 0; c < width_; ++c) sum[size_t(c)] += row[size_t(c)];
          }
          cpu::store_row(out_, b, t, x, sum.data(), width_);
        }
      }
    });
  }

 private:
  RowView out_, rows_;
  int group_, width_;
  std::vector<float> scratch_;
};

struct Gradients {
  explicit Gradients(const AdditiveParams& p)
      : dq(p, p.dq, p.group_q, p.K),
        dk(p, p.dk, p.group_k, p.K),
        dv(p, p.dv, p.group_v, p.V),
        dg(p, p.dg, p.gate == GateKind::none || p.gate_per_sequence ? 1 : p.group_g,
           p.gate == GateKind::channel ? p.K : 1),
        sequence_dg(p.gate_per_sequence ? size_t(p.B) * p.N : 0) {}

  GradientRows dq, dk, dv, dg;  // dg: per token (mamba2, gla)
  std::vector<double> sequence_dg;  // [B, N] retnet: per (batch, head) sum over its tokens

  void reduce(const AdditiveParams& p) {
    dq.reduce(p);
    dk.reduce(p);
    dv.reduce(p);
    if (p.gate_per_sequence) {
      // One gate per input head for every batch and token: summed over batches, then the
      // heads that read it, in float64, rounded once.
      for (int x = 0; x < p.N / p.group_g; ++x) {
        double sum = 0;
        for (int b = 0; b < p.B; ++b)
          for (int r = 0; r < p.group_g; ++r) sum += sequence_dg[size_t(b) * p.N + size_t(x * p.group_g + r)];
        const float rounded = float(sum);
        cpu::store_row(p.dg, 0, 0, x, &rounded, 1);
      }
    } else if (p.gate != GateKind::none) {
      dg.reduce(p);
    }
  }
};

// fp32 buffers of one thread, reused across its (batch, head) items.
struct Scratch {
  Scratch(const AdditiveParams& p, int tokens, int states)
      : in(p, tokens), H(size_t(states) * p.K * padded(p.V)), y(size_t(padded(p.V))) {}
  Tokens in;
  std::vector<float> H;  // [states, K, Vp]
  std::vector<float> y;  // [Vp]
};

[[gnu::always_inline]] inline void forward_sequence(const AdditiveParams& p, int b, int n, Scratch& w) {
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
[[gnu::always_inline]] inline void backward_sequence(const AdditiveParams& p, int b, int n,
                                                     Scratch& w, Gradients& grads) {
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
  double sequence_dg = 0;
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
      grads.dq.store(b, t0 + i, n, dq.data());
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
      grads.dk.store(b, t0 + i, n, dk.data());
      grads.dv.store(b, t0 + i, n, dv.data());
      if (p.gate_per_sequence) sequence_dg += double(dg[0]);
      else if (p.gate != GateKind::none) grads.dg.store(b, t0 + i, n, dg.data());
    }
  }
  if (p.gate_per_sequence) grads.sequence_dg[size_t(b) * p.N + size_t(n)] = sequence_dg;
  store_state(p.dh0, b, n, dH, K, V, Vp);
}

// The walks compiled twice: for the baseline target, and for AVX-512 where the kernels run on
// it (FLAT_ISA=generic forces the portable walks too).
void forward_portable(const AdditiveParams& p, int b, int n, Scratch& w) { forward_sequence(p, b, n, w); }
void backward_portable(const AdditiveParams& p, int b, int n, Scratch& w, Gradients& g) {
  backward_sequence(p, b, n, w, g);
}

#if defined(__x86_64__)
[[gnu::target("avx512f,avx512vl,avx512bw,fma")]] void forward_avx512(const AdditiveParams& p, int b, int n,
                                                                      Scratch& w) {
  forward_sequence(p, b, n, w);
}
[[gnu::target("avx512f,avx512vl,avx512bw,fma")]] void backward_avx512(const AdditiveParams& p, int b, int n,
                                                                       Scratch& w, Gradients& g) {
  backward_sequence(p, b, n, w, g);
}

bool use_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && cpu::active_isa() != cpu::Isa::generic;
  return yes;
}
#endif

}  // namespace

void recurrent_forward(const AdditiveParams& p) {
  auto walk = forward_portable;
#if defined(__x86_64__)
  if (use_avx512()) walk = forward_avx512;
#endif
  cpu::parallel_ranges(int64_t(p.B) * p.N, p.threads, [&](int64_t begin, int64_t end) {
    Scratch w(p, 1, 1);
    for (int64_t item = begin; item < end; ++item) walk(p, int(item / p.N), int(item % p.N), w);
  });
}

void recurrent_backward(const AdditiveParams& p) {
  auto walk = backward_portable;
#if defined(__x86_64__)
  if (use_avx512()) walk = backward_avx512;
#endif
  Gradients grads(p);
  const int segments = (p.S + kSegment - 1) / kSegment;
  cpu::parallel_ranges(int64_t(p.B) * p.N, p.threads, [&](int64_t begin, int64_t end) {
    Scratch w(p, kSegment, 1 + (kSegment + 1) + segments);
    for (int64_t item = begin; item < end; ++item) walk(p, int(item / p.N), int(item % p.N), w, grads);
  });
  grads.reduce(p);
}

}  // namespace flat::baseline

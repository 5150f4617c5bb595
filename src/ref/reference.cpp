#include "ref/reference.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace flat::ref {

int Problem::N() const { return std::max({Nq, Nk, Nv, has_gate() ? Ng : 1}); }

size_t Problem::gate_size() const {
  switch (variant) {
    case Variant::la: return 0;
    case Variant::retnet: return size_t(Ng);
    case Variant::mamba2: return size_t(B) * S * Ng;
    case Variant::gla: return size_t(B) * S * Ng * K;
  }
  return 0;
}

namespace {

constexpr double kL2NormEps = 1e-6;
constexpr int kCheckpointEvery = 64;  // states kept every this many tokens in the backward

size_t at(int b, int t, int head, int heads, int S, int width) {
  return ((size_t(b) * S + t) * heads + head) * width;
}

// One (batch, head): its inputs read, normalised and scaled, in float64.
struct Sequence {
  const Problem& p;
  const Inputs& in;
  int b, n;

  int head(int count) const { return n / (p.N() / count); }

  // The row of q or k, L2-normalised when asked; returns the reciprocal norm (1 when not).
  double query(int t, double* out) const { return load(in.q, t, p.Nq, p.K, out); }
  double key(int t, double* out) const { return load(in.k, t, p.Nk, p.K, out); }
  double load(const std::vector<double>& x, int t, int heads, int width, double* out) const {
    const double* row = &x[at(b, t, head(heads), heads, p.S, width)];
    double rstd = 1.0;
    if (p.l2norm) {
      double sum = 0;
      for (int c = 0; c < width; ++c) sum += row[c] * row[c];
      rstd = 1.0 / std::sqrt(sum + kL2NormEps);
    }
    for (int c = 0; c < width; ++c) out[c] = rstd * row[c];
    return rstd;
  }
  const double* value(int t) const { return &in.v[at(b, t, head(p.Nv), p.Nv, p.S, p.V)]; }

  // Log-decay of channel c at token t.
  double log_decay(int t, int c) const {
    const int gh = head(p.Ng);
    switch (p.variant) {
      case Variant::la: return 0.0;
      case Variant::retnet: return in.g[size_t(gh)];
      case Variant::mamba2: return in.g[at(b, t, gh, p.Ng, p.S, 1)];
      case Variant::gla: return in.g[at(b, t, gh, p.Ng, p.S, p.K) + size_t(c)];
    }
    return 0.0;
  }

  void initial_state(std::vector<double>& H) const {
    if (in.h0.empty()) {
      std::fill(H.begin(), H.end(), 0.0);
    } else {
      const size_t kv = size_t(p.K) * p.V;
      std::copy_n(&in.h0[(size_t(b) * p.N() + n) * kv], kv, H.begin());
    }
  }

  // H <- Diag(exp(g_t)) H + k_t v_t^T
  void step(int t, std::vector<double>& H, std::vector<double>& k) const {
    key(t, k.data());
    const double* v = value(t);
    for (int c = 0; c < p.K; ++c) {
      const double a = std::exp(log_decay(t, c));
      for (int j = 0; j < p.V; ++j) H[size_t(c) * p.V + j] = a * H[size_t(c) * p.V + j] + k[size_t(c)] * v[j];
    }
  }
};

}  // namespace

Outputs forward(const Problem& p, const Inputs& in) {
  const int N = p.N();
  const size_t kv = size_t(p.K) * p.V;
  Outputs out;
  out.y.assign(size_t(p.B) * p.S * N * p.V, 0.0);
  out.ht.assign(size_t(p.B) * N * kv, 0.0);
  std::vector<double> H(kv), q(size_t(p.K)), k(size_t(p.K));
  for (int b = 0; b < p.B; ++b)
    for (int n = 0; n < N; ++n) {
      const Sequence seq{p, in, b, n};
      seq.initial_state(H);
      for (int t = 0; t < p.S; ++t) {
        seq.step(t, H, k);
        seq.query(t, q.data());
        double* y = &out.y[at(b, t, n, N, p.S, p.V)];
        for (int c = 0; c < p.K; ++c)
          for (int j = 0; j < p.V; ++j) y[j] += p.scale * H[size_t(c) * p.V + j] * q[size_t(c)];
      }
      std::copy(H.begin(), H.end(), &out.ht[(size_t(b) * N + n) * kv]);
    }
  return out;
}

Gradients backward(const Problem& p, const Inputs& in, const std::vector<double>& dy,
                   const std::vector<double>& dht) {
  const int N = p.N();
  const size_t kv = size_t(p.K) * p.V;
  Gradients grads;
  grads.dq.assign(in.q.size(), 0.0);
  grads.dk.assign(in.k.size(), 0.0);
  grads.dv.assign(in.v.size(), 0.0);
  grads.dg.assign(p.gate_size(), 0.0);
  grads.dh0.assign(size_t(p.B) * N * kv, 0.0);

  std::vector<double> q(size_t(p.K)), k(size_t(p.K)), dq(size_t(p.K)), dk(size_t(p.K));
  std::vector<double> dH(kv), H(kv);
  std::vector<double> checkpoints;  // H before token s*kCheckpointEvery
  std::vector<double> segment;      // H after each token of the current segment
  for (int b = 0; b < p.B; ++b)
    for (int n = 0; n < N; ++n) {
      const Sequence seq{p, in, b, n};
      const int segments = (p.S + kCheckpointEvery - 1) / kCheckpointEvery;
      checkpoints.resize(size_t(segments) * kv);
      seq.initial_state(H);
      for (int t = 0; t < p.S; ++t) {
        if (t % kCheckpointEvery == 0) std::copy(H.begin(), H.end(), &checkpoints[size_t(t / kCheckpointEvery) * kv]);
        seq.step(t, H, k);
      }
      if (dht.empty()) std::fill(dH.begin(), dH.end(), 0.0);
      else std::copy_n(&dht[(size_t(b) * N + n) * kv], kv, dH.begin());

      for (int s = segments - 1; s >= 0; --s) {
        const int t0 = s * kCheckpointEvery, t1 = std::min(p.S, t0 + kCheckpointEvery);
        // segment[i] = H after token t0 + i - 1 (segment[0] = checkpoint).
        segment.resize(size_t(t1 - t0 + 1) * kv);
        std::copy_n(&checkpoints[size_t(s) * kv], kv, segment.begin());
        for (int t = t0; t < t1; ++t) {
          std::copy_n(&segment[size_t(t - t0) * kv], kv, H.begin());
          seq.step(t, H, k);
          std::copy(H.begin(), H.end(), &segment[size_t(t - t0 + 1) * kv]);
        }
        for (int t = t1 - 1; t >= t0; --t) {
          const double* Ht = &segment[size_t(t - t0 + 1) * kv];
          const double* Hprev = &segment[size_t(t - t0) * kv];
          const double* dyt = &dy[at(b, t, n, N, p.S, p.V)];
          const double q_rstd = seq.query(t, q.data());
          const double k_rstd = seq.key(t, k.data());
          const double* v = seq.value(t);
          // y_t = scale H_t^T q: dH += scale q dy^T, dq = scale H_t dy.
          for (int c = 0; c < p.K; ++c) {
            double s_dq = 0;
            for (int j = 0; j < p.V; ++j) {
              dH[size_t(c) * p.V + j] += p.scale * q[size_t(c)] * dyt[j];
              s_dq += Ht[size_t(c) * p.V + j] * dyt[j];
            }
            dq[size_t(c)] = p.scale * s_dq;
          }
          // H_t = a * H_{t-1} + k v^T: dk = dH v, dv = dH^T k, dlog a_c = a_c <dH_c, H_{t-1,c}>.
          double* dv = &grads.dv[at(b, t, seq.head(p.Nv), p.Nv, p.S, p.V)];
          double dg_scalar = 0;
          for (int c = 0; c < p.K; ++c) {
            const double a = std::exp(seq.log_decay(t, c));
            double s_dk = 0, s_dg = 0;
            for (int j = 0; j < p.V; ++j) {
              const double d = dH[size_t(c) * p.V + j];
              s_dk += d * v[j];
              dv[j] += d * k[size_t(c)];
              s_dg += d * Hprev[size_t(c) * p.V + j];
              dH[size_t(c) * p.V + j] = a * d;
            }
            dk[size_t(c)] = s_dk;
            if (p.variant == Variant::gla) {
              grads.dg[at(b, t, seq.head(p.Ng), p.Ng, p.S, p.K) + size_t(c)] += a * s_dg;
            } else {
              dg_scalar += a * s_dg;
            }
          }
          if (p.variant == Variant::mamba2) grads.dg[at(b, t, seq.head(p.Ng), p.Ng, p.S, 1)] += dg_scalar;
          if (p.variant == Variant::retnet) grads.dg[size_t(seq.head(p.Ng))] += dg_scalar;
          // Back through the optional L2 normalisation: dx = rstd (dx_hat - x_hat <x_hat, dx_hat>).
          for (auto [grad, x_hat, rstd, heads, dst] :
               {std::tuple{&dq, &q, q_rstd, p.Nq, &grads.dq}, std::tuple{&dk, &k, k_rstd, p.Nk, &grads.dk}}) {
            double* out = &(*dst)[at(b, t, seq.head(heads), heads, p.S, p.K)];
            double dot = 0;
            for (int c = 0; c < p.K; ++c) dot += (*x_hat)[size_t(c)] * (*grad)[size_t(c)];
            for (int c = 0; c < p.K; ++c) {
              const double d = (*grad)[size_t(c)];
              out[c] += p.l2norm ? rstd * (d - (*x_hat)[size_t(c)] * dot) : d;
            }
          }
        }
      }
      std::copy(dH.begin(), dH.end(), &grads.dh0[(size_t(b) * N + n) * kv]);
    }
  return grads;
}

}  // namespace flat::ref

#include "ref/reference.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace flat::ref {

int Problem::N() const {
  int n = std::max({Nq, Nk, Nv});
  if (has_gate()) n = std::max(n, Ng);
  if (has_beta() || has_erase_write()) n = std::max(n, Nb);
  if (has_erase_write()) n = std::max(n, Nw);
  return n;
}

size_t Problem::gate_size() const {
  size_t size = 1;
  for (int64_t axis : info().gate_shape(B, S, Ng, K, G)) size *= size_t(axis);
  return has_gate() ? size : 0;
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

  // Where channel c's log-decay at token t is in g: one value per head (retnet), per head and
  // token, or per group of K / gate_width() channels. The gradient of a value read by several
  // channels is the sum over them.
  size_t gate_index(int t, int c) const {
    if (p.info().gate == Gate::per_sequence) return size_t(head(p.Ng));
    const int width = p.gate_width();
    return at(b, t, head(p.Ng), p.Ng, p.S, width) + size_t(c / (p.K / width));
  }
  double decay(int t, int c) const { return p.has_gate() ? std::exp(in.g[gate_index(t, c)]) : 1.0; }

  // Where the delta rule's strengths are: beta per head and token, or gdn2's b per key channel
  // and w per value channel.
  size_t beta_index(int t) const { return at(b, t, head(p.Nb), p.Nb, p.S, 1); }
  size_t erase_index(int t, int c) const { return at(b, t, head(p.Nb), p.Nb, p.S, p.K) + size_t(c); }
  size_t write_index(int t, int j) const { return at(b, t, head(p.Nw), p.Nw, p.S, p.V) + size_t(j); }
  // The erase strength b_t[c] and write strength w_t[j]; the additive family is b = 0, w = 1.
  double erase(int t, int c) const {
    if (p.has_erase_write()) return in.b[erase_index(t, c)];
    return p.has_beta() ? in.beta[beta_index(t)] : 0.0;
  }
  double write(int t, int j) const {
    if (p.has_erase_write()) return in.w[write_index(t, j)];
    return p.has_beta() ? in.beta[beta_index(t)] : 1.0;
  }

  void initial_state(std::vector<double>& H) const {
    if (in.h0.empty()) {
      std::fill(H.begin(), H.end(), 0.0);
    } else {
      const size_t kv = size_t(p.K) * p.V;
      std::copy_n(&in.h0[(size_t(b) * p.N() + n) * kv], kv, H.begin());
    }
  }
};

// One token's update in the GDN-2 form that every variant takes,
//   H' = Diag(a) H_{t-1},  r = w * v - H'^T (b * k),  H_t = H' + k r^T,
// with b = 0, w = 1 for the additive family (r = v) and b = w = beta for the delta rule but
// gdn2. The backward recomputes it from H_{t-1}.
struct Step {
  explicit Step(const Problem& p)
      : a(size_t(p.K)), k(size_t(p.K)), erase(size_t(p.K)), write(size_t(p.V)), r(size_t(p.V)),
        decayed(size_t(p.K) * p.V) {}

  std::vector<double> a, k, erase;  // [K]: decay, key (normalised when asked), b
  std::vector<double> write, r;     // [V]: w, r
  std::vector<double> decayed;      // H' [K, V]
  const double* v = nullptr;
  double k_rstd = 1.0;

  // Everything but H_t itself from H_{t-1} = prev.
  void prepare(const Sequence& seq, int t, const double* prev) {
    const int K = seq.p.K, V = seq.p.V;
    k_rstd = seq.key(t, k.data());
    v = seq.value(t);
    for (int j = 0; j < V; ++j) {
      write[size_t(j)] = seq.write(t, j);
      r[size_t(j)] = write[size_t(j)] * v[j];
    }
    for (int c = 0; c < K; ++c) {
      a[size_t(c)] = seq.decay(t, c);
      erase[size_t(c)] = seq.erase(t, c);
      const double bk = erase[size_t(c)] * k[size_t(c)];
      for (int j = 0; j < V; ++j) {
        const double h = a[size_t(c)] * prev[size_t(c) * V + j];
        decayed[size_t(c) * V + j] = h;
        r[size_t(j)] -= h * bk;
      }
    }
  }

  // H_t = H' + k r^T; H may be the prev that prepare read.
  void apply(double* H) const {
    const size_t K = k.size(), V = r.size();
    for (size_t c = 0; c < K; ++c)
      for (size_t j = 0; j < V; ++j) H[c * V + j] = decayed[c * V + j] + k[c] * r[j];
  }
};

}  // namespace

Outputs forward(const Problem& p, const Inputs& in) {
  const int N = p.N();
  const size_t kv = size_t(p.K) * p.V;
  Outputs out;
  out.y.assign(size_t(p.B) * p.S * N * p.V, 0.0);
  out.ht.assign(size_t(p.B) * N * kv, 0.0);
  std::vector<double> H(kv), q(size_t(p.K));
  Step step(p);
  for (int b = 0; b < p.B; ++b)
    for (int n = 0; n < N; ++n) {
      const Sequence seq{p, in, b, n};
      seq.initial_state(H);
      for (int t = 0; t < p.S; ++t) {
        step.prepare(seq, t, H.data());
        step.apply(H.data());
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
  grads.dbeta.assign(in.beta.size(), 0.0);
  grads.db.assign(in.b.size(), 0.0);
  grads.dw.assign(in.w.size(), 0.0);

  std::vector<double> q(size_t(p.K)), dq(size_t(p.K)), dk(size_t(p.K)), dr(size_t(p.V));
  std::vector<double> dH(kv), H(kv);
  std::vector<double> checkpoints;  // H before token s*kCheckpointEvery
  std::vector<double> segment;      // H after each token of the current segment
  Step step(p);
  for (int b = 0; b < p.B; ++b)
    for (int n = 0; n < N; ++n) {
      const Sequence seq{p, in, b, n};
      const int segments = (p.S + kCheckpointEvery - 1) / kCheckpointEvery;
      checkpoints.resize(size_t(segments) * kv);
      seq.initial_state(H);
      for (int t = 0; t < p.S; ++t) {
        if (t % kCheckpointEvery == 0) std::copy(H.begin(), H.end(), &checkpoints[size_t(t / kCheckpointEvery) * kv]);
        step.prepare(seq, t, H.data());
        step.apply(H.data());
      }
      if (dht.empty()) std::fill(dH.begin(), dH.end(), 0.0);
      else std::copy_n(&dht[(size_t(b) * N + n) * kv], kv, dH.begin());

      for (int s = segments - 1; s >= 0; --s) {
        const int t0 = s * kCheckpointEvery, t1 = std::min(p.S, t0 + kCheckpointEvery);
        // segment[i] = H after token t0 + i - 1 (segment[0] = checkpoint).
        segment.resize(size_t(t1 - t0 + 1) * kv);
        std::copy_n(&checkpoints[size_t(s) * kv], kv, segment.begin());
        for (int t = t0; t < t1; ++t) {
          step.prepare(seq, t, &segment[size_t(t - t0) * kv]);
          step.apply(&segment[size_t(t - t0 + 1) * kv]);
        }
        for (int t = t1 - 1; t >= t0; --t) {
          const double* Ht = &segment[size_t(t - t0 + 1) * kv];
          step.prepare(seq, t, &segment[size_t(t - t0) * kv]);
          const double* dyt = &dy[at(b, t, n, N, p.S, p.V)];
          const double q_rstd = seq.query(t, q.data());
          // y_t = scale H_t^T q: dH += scale q dy^T, dq = scale H_t dy.
          for (int c = 0; c < p.K; ++c) {
            double s_dq = 0;
            for (int j = 0; j < p.V; ++j) {
              dH[size_t(c) * p.V + j] += p.scale * q[size_t(c)] * dyt[j];
              s_dq += Ht[size_t(c) * p.V + j] * dyt[j];
            }
            dq[size_t(c)] = p.scale * s_dq;
          }
          // H_t = H' + k r^T: dk = dH r, dr = dH^T k.
          std::fill(dr.begin(), dr.end(), 0.0);
          for (int c = 0; c < p.K; ++c) {
            double s_dk = 0;
            for (int j = 0; j < p.V; ++j) {
              const double d = dH[size_t(c) * p.V + j];
              s_dk += d * step.r[size_t(j)];
              dr[size_t(j)] += d * step.k[size_t(c)];
            }
            dk[size_t(c)] = s_dk;
          }
          // r = w * v - H'^T (b * k): dH' = dH - (b * k) dr^T and d(b * k) = -H' dr, split onto
          // b and k. H' = Diag(a) H_{t-1}: dlog a_c = a_c <dH'_c, H_{t-1,c}> = <dH'_c, H'_c> and
          // dH_{t-1} = Diag(a) dH'. The additive family has b = 0: dH' = dH.
          double d_beta = 0;  // b = w = beta: the sum of both strengths' gradients
          for (int c = 0; c < p.K; ++c) {
            const double bk = step.erase[size_t(c)] * step.k[size_t(c)];
            double d_bk = 0, s_dg = 0;
            for (int j = 0; j < p.V; ++j) {
              const double h = step.decayed[size_t(c) * p.V + j];
              const double d = dH[size_t(c) * p.V + j] - bk * dr[size_t(j)];
              d_bk -= h * dr[size_t(j)];
              s_dg += d * h;
              dH[size_t(c) * p.V + j] = step.a[size_t(c)] * d;
            }
            dk[size_t(c)] += step.erase[size_t(c)] * d_bk;
            const double d_erase = step.k[size_t(c)] * d_bk;
            if (p.has_erase_write()) grads.db[seq.erase_index(t, c)] += d_erase;
            else d_beta += d_erase;
            if (p.has_gate()) grads.dg[seq.gate_index(t, c)] += s_dg;
          }
          double* dv = &grads.dv[at(b, t, seq.head(p.Nv), p.Nv, p.S, p.V)];
          for (int j = 0; j < p.V; ++j) {
            dv[j] += step.write[size_t(j)] * dr[size_t(j)];
            const double d_write = step.v[j] * dr[size_t(j)];
            if (p.has_erase_write()) grads.dw[seq.write_index(t, j)] += d_write;
            else d_beta += d_write;
          }
          if (p.has_beta()) grads.dbeta[seq.beta_index(t)] += d_beta;
          // Back through the optional L2 normalisation: dx = rstd (dx_hat - x_hat <x_hat, dx_hat>).
          for (auto [grad, x_hat, rstd, heads, dst] : {std::tuple{&dq, &q, q_rstd, p.Nq, &grads.dq},
                                                       std::tuple{&dk, &step.k, step.k_rstd, p.Nk, &grads.dk}}) {
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

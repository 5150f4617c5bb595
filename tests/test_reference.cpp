// The float64 oracle: its gradients against central finite differences of its own forward, and
// its forward against hand-computed values and the spec's formulas written out directly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "harness.h"
#include "ref/reference.h"

namespace flat::test {
namespace {

// Random inputs for every tensor the problem's variant reads: q, k, v normal, log-gates in
// [-2, 0], write strengths in (0.1, 1.9) (beta up to 2), h0 when `states`.
ref::Inputs draw_inputs(const ref::Problem& p, bool states, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> unit;
  auto draw = [&](size_t n, auto&& sample) {
    std::vector<double> x(n);
    for (auto& e : x) e = sample();
    return x;
  };
  auto gaussian = [&] { return normal(rng); };
  auto strength = [&] { return 0.1 + 1.8 * unit(rng); };
  const size_t tokens = size_t(p.B) * p.S;
  ref::Inputs in;
  in.q = draw(tokens * p.Nq * p.K, gaussian);
  in.k = draw(tokens * p.Nk * p.K, gaussian);
  in.v = draw(tokens * p.Nv * p.V, gaussian);
  in.g = draw(p.gate_size(), [&] { return -2.0 * unit(rng); });
  if (p.has_beta()) in.beta = draw(tokens * p.Nb, strength);
  if (p.has_erase_write()) {
    in.b = draw(tokens * p.Nb * p.K, strength);
    in.w = draw(tokens * p.Nw * p.V, strength);
  }
  if (states) in.h0 = draw(size_t(p.B) * p.N() * p.K * p.V, gaussian);
  return in;
}

struct FdCase {
  Variant variant;
  bool l2norm;
  bool states;
  int G = 1;  // gate group of kda, gdn2, sla

  std::string name() const {
    return std::string(variant_name(variant)) + (l2norm ? "_l2norm" : "") + (states ? "_states" : "") +
           (G > 1 ? "_G" + std::to_string(G) : "");
  }
};

void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name(); }

// L = <y, dy> + <ht, dht>, so dL/dx is exactly what backward(dy, dht) returns.
double loss(const ref::Problem& p, const ref::Inputs& in, const std::vector<double>& dy,
            const std::vector<double>& dht) {
  const ref::Outputs out = ref::forward(p, in);
  double l = 0;
  for (size_t i = 0; i < dy.size(); ++i) l += out.y[i] * dy[i];
  for (size_t i = 0; i < dht.size(); ++i) l += out.ht[i] * dht[i];
  return l;
}

class ReferenceGradients : public ::testing::TestWithParam<FdCase> {};

TEST_P(ReferenceGradients, MatchFiniteDifferences) {
  const FdCase fc = GetParam();
  ref::Problem p;
  p.variant = fc.variant;
  p.B = 2;
  p.S = 7;
  // Head sharing of every input: q, g, beta and b read by both heads, k, v and w per head.
  p.Nq = 1;
  p.Nk = 2;
  p.Nv = 2;
  p.Ng = 1;
  p.Nb = 1;
  p.Nw = 2;
  p.G = fc.G;
  p.K = fc.G == 1 ? 3 : 2 * fc.G;  // grouped gates: two groups
  p.V = 2;
  p.scale = 0.7;
  p.l2norm = fc.l2norm;
  const int N = p.N();
  std::mt19937_64 rng(42);
  ref::Inputs in = draw_inputs(p, fc.states, rng);
  std::normal_distribution<double> normal;
  auto draw = [&](size_t n) {
    std::vector<double> x(n);
    for (auto& e : x) e = normal(rng);
    return x;
  };
  const std::vector<double> dy = draw(size_t(p.B) * p.S * N * p.V);
  const std::vector<double> dht = fc.states ? draw(size_t(p.B) * N * p.K * p.V) : std::vector<double>{};

  const ref::Gradients grads = ref::backward(p, in, dy, dht);
  const double h = 1e-6;
  auto check = [&](std::vector<double>& x, const std::vector<double>& analytic, const char* name) {
    ASSERT_EQ(x.size(), analytic.size()) << name;
    std::vector<double> numeric(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = loss(p, in, dy, dht);
      x[i] = saved - h;
      const double down = loss(p, in, dy, dht);
      x[i] = saved;
      numeric[i] = (up - down) / (2 * h);
    }
    EXPECT_LT(relative_error(analytic, numeric), 1e-7) << name;
  };
  check(in.q, grads.dq, "dq");
  check(in.k, grads.dk, "dk");
  check(in.v, grads.dv, "dv");
  if (p.has_gate()) check(in.g, grads.dg, "dg");
  if (p.has_beta()) check(in.beta, grads.dbeta, "dbeta");
  if (p.has_erase_write()) {
    check(in.b, grads.db, "db");
    check(in.w, grads.dw, "dw");
  }
  if (fc.states) check(in.h0, grads.dh0, "dh0");
}

INSTANTIATE_TEST_SUITE_P(
    Oracle, ReferenceGradients,
    ::testing::Values(FdCase{Variant::la, false, true}, FdCase{Variant::la, true, false},
                      FdCase{Variant::retnet, false, true}, FdCase{Variant::retnet, true, true},
                      FdCase{Variant::mamba2, false, false}, FdCase{Variant::mamba2, true, true},
                      FdCase{Variant::gla, false, true}, FdCase{Variant::gla, true, false},
                      FdCase{Variant::deltanet, false, true}, FdCase{Variant::deltanet, true, false},
                      FdCase{Variant::gated_deltanet, false, false}, FdCase{Variant::gated_deltanet, true, true},
                      FdCase{Variant::kda, false, true}, FdCase{Variant::kda, true, false, 2},
                      FdCase{Variant::gdn2, false, true}, FdCase{Variant::gdn2, true, true, 2},
                      FdCase{Variant::sla, false, true, 2}, FdCase{Variant::sla, true, false, 4}),
    [](const ::testing::TestParamInfo<FdCase>& info) { return info.param.name(); });

// The oracle's forward against a hand-computed two-token example.
TEST(ReferenceForward, TwoTokensByHand) {
  ref::Problem p;
  p.variant = Variant::mamba2;
  p.S = 2;
  p.K = 1;
  p.V = 1;
  p.scale = 1.0;
  ref::Inputs in;
  in.q = {1.0, 2.0};
  in.k = {3.0, 5.0};
  in.v = {7.0, 11.0};
  in.g = {std::log(0.5), std::log(0.25)};
  const ref::Outputs out = ref::forward(p, in);
  // H1 = 3*7 = 21, y1 = 21; H2 = 0.25*21 + 5*11 = 60.25, y2 = 2*60.25 = 120.5.
  ASSERT_EQ(out.y.size(), 2u);
  EXPECT_DOUBLE_EQ(out.y[0], 21.0);
  EXPECT_DOUBLE_EQ(out.y[1], 120.5);
  EXPECT_DOUBLE_EQ(out.ht[0], 60.25);
}

// The oracle computes every delta variant in GDN-2's form; here the spec's formulas of the others
// are written out as matrix products, for one head:
//   deltanet, gated_deltanet  H_t = exp(g_t) (I - beta k k^T) H_{t-1} + beta k v^T  (g = 0 for deltanet)
//   kda, sla                  H_t = (I - beta k k^T) Diag(exp(g_t)) H_{t-1} + beta k v^T
// and gdn2 with b = w = beta must give kda.
TEST(ReferenceForward, DeltaRuleMatchesSpecFormulas) {
  for (Variant variant : {Variant::deltanet, Variant::gated_deltanet, Variant::kda, Variant::sla, Variant::gdn2}) {
    ref::Problem p;
    p.variant = variant;
    p.S = 6;
    p.K = 4;
    p.V = 3;
    p.G = variant == Variant::sla ? 2 : 1;
    p.scale = 0.5;
    std::mt19937_64 rng(7);
    ref::Inputs in = draw_inputs(p, true, rng);
    // gdn2's gates all equal to one beta per token, which the formulas below read.
    std::vector<double> beta = in.beta;
    if (variant == Variant::gdn2) {
      beta.assign(in.b.begin(), in.b.begin() + p.S);
      for (int t = 0; t < p.S; ++t) {
        std::fill_n(&in.b[size_t(t) * p.K], p.K, beta[size_t(t)]);
        std::fill_n(&in.w[size_t(t) * p.V], p.V, beta[size_t(t)]);
      }
    }
    std::vector<double> H = in.h0, y(size_t(p.S) * p.V, 0.0);
    for (int t = 0; t < p.S; ++t) {
      const double* k = &in.k[size_t(t) * p.K];
      const double* v = &in.v[size_t(t) * p.V];
      const double* q = &in.q[size_t(t) * p.K];
      std::vector<double> next(H.size());
      for (int c = 0; c < p.K; ++c)
        for (int j = 0; j < p.V; ++j) {
          double sum = beta[size_t(t)] * k[c] * v[j];
          for (int i = 0; i < p.K; ++i) {
            const double erase = (i == c ? 1.0 : 0.0) - beta[size_t(t)] * k[c] * k[i];
            const double log_a = !p.has_gate() ? 0.0
                                 : p.gate_width() == 1 ? in.g[size_t(t)]
                                                       : in.g[size_t(t) * p.gate_width() + size_t(i / p.G)];
            sum += erase * std::exp(log_a) * H[size_t(i) * p.V + j];
          }
          next[size_t(c) * p.V + j] = sum;
        }
      H = next;
      for (int j = 0; j < p.V; ++j)
        for (int c = 0; c < p.K; ++c) y[size_t(t) * p.V + j] += p.scale * H[size_t(c) * p.V + j] * q[c];
    }
    const ref::Outputs out = ref::forward(p, in);
    EXPECT_LT(relative_error(out.y, y), 1e-13) << variant_name(variant);
    EXPECT_LT(relative_error(out.ht, H), 1e-13) << variant_name(variant);
  }
}

}  // namespace
}  // namespace flat::test

// The float64 oracle's gradients against central finite differences of its own forward.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "harness.h"
#include "ref/reference.h"

namespace flat::test {
namespace {

struct FdCase {
  Variant variant;
  bool l2norm;
  bool states;
};

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
  p.Nq = 1;
  p.Nk = 2;
  p.Nv = 2;
  p.Ng = 1;
  p.K = 3;
  p.V = 2;
  p.scale = 0.7;
  p.l2norm = fc.l2norm;
  const int N = p.N();
  std::mt19937_64 rng(42);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> unit;
  auto draw = [&](size_t n) {
    std::vector<double> x(n);
    for (auto& e : x) e = normal(rng);
    return x;
  };
  ref::Inputs in;
  in.q = draw(size_t(p.B) * p.S * p.Nq * p.K);
  in.k = draw(size_t(p.B) * p.S * p.Nk * p.K);
  in.v = draw(size_t(p.B) * p.S * p.Nv * p.V);
  in.g.resize(p.gate_size());
  for (auto& e : in.g) e = -2.0 * unit(rng);
  const size_t state = size_t(p.B) * N * p.K * p.V;
  if (fc.states) in.h0 = draw(state);
  const std::vector<double> dy = draw(size_t(p.B) * p.S * N * p.V);
  const std::vector<double> dht = fc.states ? draw(state) : std::vector<double>{};

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
  if (fc.states) check(in.h0, grads.dh0, "dh0");
}

INSTANTIATE_TEST_SUITE_P(
    Oracle, ReferenceGradients,
    ::testing::Values(FdCase{Variant::la, false, true}, FdCase{Variant::la, true, false},
                      FdCase{Variant::retnet, false, true}, FdCase{Variant::retnet, true, true},
                      FdCase{Variant::mamba2, false, false}, FdCase{Variant::mamba2, true, true},
                      FdCase{Variant::gla, false, true}, FdCase{Variant::gla, true, false}),
    [](const ::testing::TestParamInfo<FdCase>& info) {
      return std::string(variant_name(info.param.variant)) + (info.param.l2norm ? "_l2norm" : "") +
             (info.param.states ? "_states" : "");
    });

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

}  // namespace
}  // namespace flat::test

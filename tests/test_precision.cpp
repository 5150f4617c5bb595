// Precision::fast, where a target with a bf16 unit (amx, its model, avx512_bf16) rounds every
// product's operands to bf16 once and sums in fp32, as GPU kernels do: every variant against the
// float64 oracle at the bounds FLA's own tests use (tests/harness.h), on every target, over the
// shapes that break chunked code (S = 1, C - 1, C + 1, several chunks; odd K and V; head sharing;
// initial and final states; mild to strong decay and gates down to Kimi Linear's -1736; L2 norm;
// beta up to 2). Precision::exact is every other test of the suite.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "harness.h"

namespace flat::test {
namespace {

std::vector<Case> sweep() {
  return build_sweep(variants_where(any_variant), [](Case& base, const auto& add) {
    base.precision = Precision::fast;
    // The delta family with q and k L2-normalised, as every model of it runs and FLA's tests draw:
    // unnormalised keys make (I - beta k k^T) expand by |k|^2 and a bf16 state's rounding with it.
    base.l2norm = base.is_delta();
    int i = 0;
    for (int S : {1, 63, 65, 200})
      add([&](Case& c) {
        c.S = S;
        c.h0 = i % 2 == 0;
        c.dht = i++ % 3 != 1;
      });
    add([](Case& c) {
      c.S = 100;
      c.K = 33;
      c.V = 17;
      c.Nq = c.Nk = c.Ng = c.Nb = 1;
      c.Nv = c.Nw = 2;
      c.h0 = c.dht = true;
    });
    add([](Case& c) {
      c.S = 130;
      c.decay = Decay::strong;
      c.l2norm = true;
      c.beta_max = c.is_delta() ? 2.0 : 1.0;
    });
    add([](Case& c) {
      c.S = 70;
      c.decay = Decay::mild;
      c.chunk = 16;
      c.h0 = true;
    });
  }, fit_gate_group);
}

class FastPrecision : public ::testing::TestWithParam<Case> {};

TEST_P(FastPrecision, WithinFlaBounds) {
  const Case& c = GetParam();
  expect_within_bounds(compare(c), c.dtype, c.precision);
}

INSTANTIATE_TEST_SUITE_P(Sweep, FastPrecision, ::testing::ValuesIn(sweep()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

// Gates at Kimi Linear's -1736 per token: nothing overflows, no NaN, at fast precision too.
TEST(FastPrecision, ExtremeGatesStayFinite) {
  for (Variant variant : variants_where(gated))
    for (DType dtype : {DType::f32, DType::bf16}) {
      Case c;
      c.variant = variant;
      c.dtype = dtype;
      c.precision = Precision::fast;
      c.S = 150;
      c.K = 48;
      c.V = 32;
      fit_gate_group(c);
      c.h0 = c.dht = true;
      SCOPED_TRACE(c.name());
      Problem problem(c);
      std::fill(problem.in.g.begin(), problem.in.g.end(), -1736.0);
      expect_within_bounds(compare(problem), dtype, c.precision);
    }
}

}  // namespace
}  // namespace flat::test

// NaN and infinities in the activations (q, k, v, dy) are not refused: as in any training
// framework they propagate, so that a diverging model shows it. What must hold on every
// instruction set: nothing is swallowed. Every output that depends on the bad element (the outputs
// the float64 oracle changes when the element changes) is non-finite in the kernel's results; the
// kernel may spread it further inside a chunk (a masked zero times NaN is NaN). Gates, strengths and states are checked instead
// (test_errors.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/targets.h"
#include "harness.h"
#include "tested_targets.h"

namespace flat::test {
namespace {

enum class Activation { q, k, v, dy };
constexpr const char* kActivationNames[] = {"q", "k", "v", "dy"};
void PrintTo(Activation a, std::ostream* os) { *os << kActivationNames[int(a)]; }

class NonFinite : public ::testing::TestWithParam<std::tuple<Variant, Activation, double>> {};

TEST_P(NonFinite, NeverSwallowed) {
  const auto [variant, where, value] = GetParam();
  for (DType dtype : {DType::f32, DType::bf16}) {
    Case c;
    c.variant = variant;
    c.dtype = dtype;
    c.B = 2;
    c.S = 40;
    c.Nq = c.Nk = c.Nv = c.Ng = c.Nb = c.Nw = 2;
    c.K = c.V = 8;
    fit_gate_group(c);
    c.chunk = 16;
    c.h0 = c.dht = true;
    Problem problem(c);
    // Batch 1, token 21 (inside the second chunk), head 1, channel 3.
    const auto element = [&](Problem& p) -> double& {
      const auto at = [&](std::vector<double>& x, int heads, int width) -> double& {
        return x[size_t(((1 * c.S + 21) * heads + 1) * width + 3)];
      };
      switch (where) {
        case Activation::q: return at(p.in.q, c.Nq, c.K);
        case Activation::k: return at(p.in.k, c.Nk, c.K);
        case Activation::v: return at(p.in.v, c.Nv, c.V);
        case Activation::dy: return at(p.dy, p.N, c.V);
      }
      return p.in.q[0];
    };
    // The outputs the element reaches: those the oracle changes when the element does (in the
    // order of kKernelOutputs).
    const auto oracle = [](const Problem& p) {
      const ref::Outputs out = ref::forward(p.ref, p.in);
      const ref::Gradients grad = ref::backward(p.ref, p.in, p.dy, p.dht);
      return std::vector<std::vector<double>>{out.y,   out.ht,   grad.dq,    grad.dk, grad.dv,
                                              grad.dg, grad.dh0, grad.dbeta, grad.db, grad.dw};
    };
    const std::vector<std::vector<double>> clean = oracle(problem);
    Problem moved = problem;
    element(moved) += 7.0;
    const std::vector<std::vector<double>> changed = oracle(moved);

    element(problem) = value;
    int reached = 0;
    for (const cpu::Target* target : test::supported_targets()) {
      const KernelOutputs got = run_kernel(problem, true, 2, *target);
      for (size_t o = 0; o < clean.size(); ++o) {
        const auto& [name, values] = kKernelOutputs[o];
        const std::vector<double>& kernel = got.*values;
        ASSERT_EQ(kernel.size(), clean[o].size()) << name;
        for (size_t i = 0; i < kernel.size(); ++i) {
          if (changed[o][i] == clean[o][i]) continue;
          ++reached;
          ASSERT_FALSE(std::isfinite(kernel[i])) << target->name << " " << dtype_name(dtype) << " " << name << "["
                                                 << i << "] = " << kernel[i] << ", which depends on the input";
        }
      }
    }
    EXPECT_GT(reached, 0) << "the non-finite input reached no output";
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Variant, Activation, double>>& info) {
  return std::string(variant_name(std::get<0>(info.param))) + "_" + kActivationNames[int(std::get<1>(info.param))] + "_" +
         (std::isnan(std::get<2>(info.param)) ? "nan" : "inf");
}

INSTANTIATE_TEST_SUITE_P(
    Activations, NonFinite,
    ::testing::Combine(::testing::ValuesIn(variants_where(any_variant)),
                       ::testing::Values(Activation::q, Activation::k, Activation::v, Activation::dy),
                       ::testing::Values(std::numeric_limits<double>::quiet_NaN(),
                                         std::numeric_limits<double>::infinity())),
    case_name);

}  // namespace
}  // namespace flat::test

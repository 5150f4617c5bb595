// Results are bitwise identical from run to run and for any thread count: each (batch, head) is
// computed by one thread with the same code, and every reduction over heads that share an input
// (and retnet's reduction over the whole sequence) runs in a fixed order.
#include <gtest/gtest.h>

#include "cpu/targets.h"
#include "harness.h"
#include "tested_targets.h"

namespace flat::test {
namespace {

// On every target: the runs on each thread count bitwise equal the one on a single thread (the
// outputs are floats widened exactly to double).
void expect_same_bits(const Problem& problem, std::initializer_list<int> thread_counts) {
  for (const cpu::Target* target : test::supported_targets()) {
    const KernelOutputs reference = run_kernel(problem, true, 1, *target);
    for (int threads : thread_counts) {
      const KernelOutputs other = run_kernel(problem, true, threads, *target);
      for (const auto& [name, values] : kKernelOutputs)
        EXPECT_EQ(reference.*values, other.*values) << name << ", threads " << threads << " on " << target->name;
    }
  }
}

class Determinism : public ::testing::TestWithParam<Variant> {};

TEST_P(Determinism, SameBitsForAnyThreadCountAndRun) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Case c;
    c.variant = GetParam();
    c.dtype = dtype;
    c.B = 3;
    c.S = 70;
    c.Nq = c.Nk = 2;
    c.Nv = c.Ng = 4;
    c.K = 32;
    c.V = 24;
    c.chunk = 32;
    c.h0 = c.dht = true;
    expect_same_bits(Problem(c), {1, 2, 3, 5, 12});
  }
}

// The delta family with every input shared (q, k, g and beta or b by two heads each, w by none):
// the sums of the shared gradients must not depend on which thread ran which head.
class DeltaDeterminism : public ::testing::TestWithParam<Variant> {};

TEST_P(DeltaDeterminism, SameBitsForAnyThreadCount) {
  Case c;
  c.variant = GetParam();
  c.B = 2;
  c.S = 90;
  c.Nq = c.Nk = c.Ng = c.Nb = 2;
  c.Nv = c.Nw = 4;
  c.K = 64;
  c.V = 32;
  c.G = 16;
  c.chunk = 32;
  c.beta_max = 2.0;
  c.h0 = c.dht = true;
  expect_same_bits(Problem(c), {1, 2, 3});
}

INSTANTIATE_TEST_SUITE_P(Delta, DeltaDeterminism, ::testing::Values(Variant::gdn2, Variant::sla),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           return std::string(variant_name(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(AllVariants, Determinism,
                         ::testing::ValuesIn(variants_where(additive)),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           return std::string(variant_name(info.param));
                         });

}  // namespace
}  // namespace flat::test

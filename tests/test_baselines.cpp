// The benchmark's baselines (tools/baseline/baselines.h) against the float64 oracle on the same
// rounded inputs, called as `flat bench` calls them: on the Params that
// describe_forward / describe_backward make of the arguments. Same bounds as the kernels.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "baseline/baselines.h"
#include "harness.h"
#include "cpu/targets.h"
#include "params.h"

namespace flat::test {
namespace {


// Each baseline `flat bench` measures.
const Implementation kBaselines[] = {
    {"recurrent", baseline::recurrent_forward, baseline::recurrent_backward},
    {"unfused", baseline::unfused_forward, baseline::unfused_backward},
};

std::vector<Case> cases() {
  const auto per_variant = [](Case& base, const auto& add) {
    const Variant variant = base.variant;
    base.K = variant == Variant::sla ? 64 : 32;
    base.V = 24;
    base.chunk = 32;
    add([](Case& c) { c.S = 1; });
    // Several checkpoint segments and chunks, the last ones partial; both states.
    add([](Case& c) {
      c.S = 150;
      c.h0 = c.dht = true;
    });
    // Head sharing with two batches, K and V not multiples of a vector (sla: packed heads).
    add([variant](Case& c) {
      c.B = 2;
      c.S = 70;
      c.Nq = c.Nk = c.Nb = 2;
      c.Nv = c.Ng = c.Nw = 4;
      if (variant == Variant::sla) c.Ng = 2;
      else c.K = 17;
      c.V = 33;
      c.h0 = c.dht = true;
    });
    // In-kernel L2 normalisation, with sharing.
    add([](Case& c) {
      c.S = 100;
      c.Nq = 1;
      c.Nk = c.Nv = c.Ng = c.Nb = c.Nw = 2;
      c.l2norm = true;
      c.h0 = true;
    });
    add([](Case& c) {
      c.S = 90;
      c.dht = true;
      c.decay = Decay::strong;
    });
  };
  return build_sweep(variants_where(any_variant), per_variant);
}

class BaselineVsOracle : public ::testing::TestWithParam<std::tuple<Implementation, Case>> {};

TEST_P(BaselineVsOracle, ForwardAndBackward) {
  const auto& [implementation, c] = GetParam();
  // On the library's targets, the bench's: the tile unit's models are the tests' alone.
  expect_within_bounds(compare(Problem(c), implementation, cpu::supported_targets()), c.dtype);
}

// Same bits for any thread count: each (batch, head) is one thread's work and gradients of shared
// inputs are summed in head order.
class BaselineDeterminism : public ::testing::TestWithParam<Implementation> {};

TEST_P(BaselineDeterminism, SameBitsForAnyThreadCount) {
  for (Variant variant : {Variant::la, Variant::retnet, Variant::mamba2, Variant::gla, Variant::kda, Variant::gdn2}) {
    Case c;
    c.variant = variant;
    c.B = 2;
    c.S = 70;
    c.Nq = c.Nk = c.Nb = 2;
    c.Nv = c.Ng = c.Nw = 4;
    c.K = 32;
    c.V = 24;
    c.chunk = 32;
    c.h0 = c.dht = true;
    const Problem pr(c);
    for (const cpu::Target* target : cpu::supported_targets()) {
      const KernelOutputs one = run_kernel(pr, true, 1, *target, GetParam()),
                          three = run_kernel(pr, true, 3, *target, GetParam());
      for (const auto& [name, member] : kKernelOutputs)
        EXPECT_EQ(one.*member, three.*member) << variant_name(variant) << " " << name << " on " << target->name;
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Implementation, Case>>& info) {
  return std::to_string(info.index) + "_" + std::get<0>(info.param).name + "_" + std::get<1>(info.param).name();
}

INSTANTIATE_TEST_SUITE_P(Baselines, BaselineVsOracle,
                         ::testing::Combine(::testing::ValuesIn(kBaselines), ::testing::ValuesIn(cases())), case_name);
INSTANTIATE_TEST_SUITE_P(Baselines, BaselineDeterminism, ::testing::ValuesIn(kBaselines),
                         [](const ::testing::TestParamInfo<Implementation>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace flat::test

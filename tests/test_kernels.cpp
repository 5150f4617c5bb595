// The CPU kernels of the additive family against the float64 oracle on the same rounded inputs,
// over the shapes that break chunked code: S = 1, C-1, C, C+1, 3C+5, 1000; K, V from 16 to 256
// and odd; head sharing; fused-projection strides; initial and final states; mild to very strong
// decay; L2 norm. Extreme decay for every gated variant; the delta family's sweep is in
// test_delta.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "harness.h"

namespace flat::test {
namespace {

std::vector<Case> sweep() {
  return build_sweep({Variant::la, Variant::retnet, Variant::mamba2, Variant::gla}, [](Case&, const auto& add) {
    // Sequence lengths around the chunk, states alternating on and off.
    int i = 0;
    for (int S : {1, 63, 64, 65, 197, 1000})
      add([&](Case& c) {
        c.S = S;
        c.h0 = i % 2 == 0;
        c.dht = i++ % 3 != 1;
      });
    // Head widths.
    for (auto [K, V] : std::vector<std::pair<int, int>>{
             {16, 16}, {64, 64}, {100, 100}, {128, 128}, {256, 256}, {17, 33}, {256, 16}, {16, 256}})
      add([&](Case& c) {
        c.S = 3 * 64 + 5;
        c.K = K;
        c.V = V;
        c.h0 = c.dht = true;
      });
    // Head sharing (GQA/GVA) with two batches, strided fused projection, states on.
    add([&](Case& c) {
      c.B = 2;
      c.S = 100;
      c.Nq = c.Nk = 2;
      c.Nv = c.Ng = 8;
      c.h0 = c.dht = true;
    });
    add([&](Case& c) {
      c.B = 2;
      c.S = 77;
      c.Nq = 4;
      c.Nk = 2;
      c.Nv = 4;
      c.Ng = 1;
      c.strided = true;
      c.h0 = c.dht = true;
    });
    // Decay strengths.
    for (Decay decay : {Decay::mild, Decay::strong})
      add([&](Case& c) {
        c.S = 300;
        c.decay = decay;
        c.h0 = c.dht = true;
      });
    // In-kernel L2 normalisation of q and k, with sharing.
    add([&](Case& c) {
      c.S = 150;
      c.Nq = 1;
      c.Nv = c.Ng = c.Nk = 2;
      c.l2norm = true;
      c.h0 = true;
    });
    // Other chunk sizes around their edges.
    for (auto [C, S] : std::vector<std::pair<int, int>>{{16, 17}, {32, 31}, {128, 129}, {256, 300}})
      add([&](Case& c) {
        c.chunk = C;
        c.S = S;
        c.Nq = c.Nk = c.Nv = c.Ng = 2;
        c.dht = true;
        c.decay = Decay::strong;
      });
  });
}

class KernelVsOracle : public ::testing::TestWithParam<Case> {};

TEST_P(KernelVsOracle, ForwardAndBackward) {
  const Case& c = GetParam();
  expect_within_bounds(compare(c), c.dtype);
}

// Every gate at -60 (pairwise factors below fp32's range), -1000 or Kimi-Linear's -1736 per token: only
// the current token survives in the state, and nothing may overflow on the way there.
class ExtremeDecay : public ::testing::TestWithParam<std::tuple<Variant, DType, double>> {};

TEST_P(ExtremeDecay, FiniteAndCorrect) {
  const auto [variant, dtype, gate] = GetParam();
  Case c;
  c.variant = variant;
  c.dtype = dtype;
  c.S = 150;
  c.Nq = c.Nk = c.Nv = c.Ng = 2;
  c.K = 48;
  c.V = 32;
  if (variant == Variant::sla) c.G = 16;  // 48 channels are no multiple of SLA's default 64
  c.h0 = c.dht = true;
  Problem problem(c);
  std::fill(problem.in.g.begin(), problem.in.g.end(), gate);
  expect_within_bounds(compare(problem), dtype);
}

INSTANTIATE_TEST_SUITE_P(GatesDownTo1736, ExtremeDecay,
                         ::testing::Combine(::testing::Values(Variant::retnet, Variant::mamba2, Variant::gla,
                                                              Variant::gated_deltanet, Variant::kda, Variant::gdn2,
                                                              Variant::sla),
                                            ::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(-60.0, -1000.0, -1736.0)));

INSTANTIATE_TEST_SUITE_P(Sweep, KernelVsOracle, ::testing::ValuesIn(sweep()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::to_string(info.index) + "_" + info.param.name();
                         });

}  // namespace
}  // namespace flat::test

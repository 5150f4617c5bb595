// The CPU kernels of the additive family against the float64 oracle on the same rounded inputs,
// over the shapes that break chunked code: S = 1, C-1, C, C+1, 3C+5, 1000; K, V from 16 to 256
// and odd; head sharing; fused-projection strides; initial and final states; mild to very strong
// decay; L2 norm. Extreme decay for every gated variant; the delta family's sweep is in
// test_delta.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "harness.h"

namespace flat::test {
namespace {

std::vector<Case> sweep() {
  return build_sweep(variants_where(additive), [](Case&, const auto& add) {
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
  fit_gate_group(c);
  c.h0 = c.dht = true;
  Problem problem(c);
  std::fill(problem.in.g.begin(), problem.in.g.end(), gate);
  expect_within_bounds(compare(problem), dtype);
}

INSTANTIATE_TEST_SUITE_P(GatesDownTo1736, ExtremeDecay,
                         ::testing::Combine(::testing::ValuesIn(variants_where(gated)),
                                            ::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(-60.0, -1000.0, -1736.0)));

// Gates just below 1 over long sequences: head n decays by gamma_n = 1 - 2^-(5+n) per token (a
// memory of 32 to 4,096 tokens), constant over batch, tokens and channels. A decay factor off by a
// fraction of an ulp is off the same way at every token, so its error compounds over the memory
// into the outputs; the fp32 bounds must hold at S = 4,096 all the same, at the default chunk and
// the longest.
class NearOneGates : public ::testing::TestWithParam<Variant> {};

TEST_P(NearOneGates, LongSequenceWithinFp32Bounds) {
  for (int chunk : {64, 256}) {
    Case c;
    c.variant = GetParam();
    c.S = 4096;
    c.Nq = c.Nk = c.Nv = c.Ng = c.Nb = c.Nw = 8;
    c.K = c.V = 16;
    fit_gate_group(c);
    c.chunk = chunk;
    c.on_models = chunk == 64;  // the tile unit's model takes minutes at the longest chunk
    c.h0 = c.dht = true;
    Problem problem(c);
    const size_t per_head = problem.ref.gate_width();
    for (size_t e = 0; e < problem.in.g.size(); ++e) {
      const int head = int(e / per_head % size_t(c.Ng));
      problem.in.g[e] = double(float(std::log1p(-std::ldexp(1.0, -(5 + head)))));
    }
    SCOPED_TRACE(c.name());
    expect_within_bounds(compare(problem), c.dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(GatedVariants, NearOneGates,
                         ::testing::ValuesIn(variants_where(gated)),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           return std::string(variant_name(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(Sweep, KernelVsOracle, ::testing::ValuesIn(sweep()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::to_string(info.index) + "_" + info.param.name();
                         });

}  // namespace
}  // namespace flat::test

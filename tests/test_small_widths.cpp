// Narrow heads against every chunk length: K and V from 1 to 24 where the chunk's [C, C] work
// (the delta rule's solves, the scores) outgrows its [C, K] rows, so every workspace array sized
// by K alone is overrun (found by an independent check: the blocked and doubling solves spilled
// into their neighbours when C x K < (C/2)^2). Every variant, both dtypes, every legal chunk,
// every solve of the delta family, against the float64 oracle. The model of the tile unit, whose
// products take no workspace, runs at the lengths that end inside a 32-row tile block (16, 48,
// 144): every length on it would take minutes.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness.h"

namespace flat::test {
namespace {

constexpr std::pair<int, int> kWidths[] = {{1, 1}, {1, 24}, {3, 5}, {7, 16}, {15, 3}, {4, 12}};

class SmallWidths : public ::testing::TestWithParam<std::tuple<Variant, int>> {};

TEST_P(SmallWidths, EveryChunkAndSolveMatchOracle) {
  const auto [variant, chunk] = GetParam();
  Case base;
  base.variant = variant;
  const std::vector<Solve> solves =
      base.is_delta() ? std::vector<Solve>{Solve::substitution, Solve::blocked, Solve::doubling}
                      : std::vector<Solve>{Solve::automatic};
  uint64_t seed = 1;
  for (DType dtype : {DType::f32, DType::bf16})
    for (auto [K, V] : kWidths)
      for (Solve solve : solves) {
        Case c = base;
        c.dtype = dtype;
        c.K = K;
        c.V = V;
        fit_gate_group(c);
        c.chunk = chunk;
        c.on_models = chunk == 16 || chunk == 48 || chunk == 144;
        c.S = chunk + 3;  // a full chunk and a short one
        // Two sequences of two heads: with K = V = 1 and a single head, dh0 is one number, a sum of
        // a hundred terms of both signs or more, and its relative error that of one cancelling sum (a
        // random draw cancelled it 127-fold, putting the fp32 rounding of a correct solve at 2.4e-4).
        c.B = 2;
        c.Nq = c.Nk = c.Nv = c.Ng = c.Nb = c.Nw = 2;
        c.solve = solve;
        c.h0 = c.dht = true;
        c.seed = seed++;
        SCOPED_TRACE(c.name());
        expect_within_bounds(compare(c), dtype);
      }
}

std::vector<int> every_chunk() {
  std::vector<int> chunks;
  for (int C = 16; C <= 256; C += 16) chunks.push_back(C);
  return chunks;
}

INSTANTIATE_TEST_SUITE_P(
    AllVariants, SmallWidths,
    ::testing::Combine(::testing::ValuesIn(variants_where(any_variant)),
                       ::testing::ValuesIn(every_chunk())),
    [](const ::testing::TestParamInfo<std::tuple<Variant, int>>& info) {
      return std::string(variant_name(std::get<0>(info.param))) + "_C" + std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace flat::test

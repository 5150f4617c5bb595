// The decode path (src/cpu/stages/step.h: the recurrence token by token, from a state in memory
// to a state in memory) against the float64 oracle on the same rounded inputs, for every variant
// and both dtypes. The library takes it by itself for sequences of at most a few tokens; here
// every sequence goes through it at any length (as Sequences::token_state_indices makes it), so
// that its chunked loading (S past a chunk), head sharing, odd widths, L2 normalisation, strided
// inputs and strong decay are all checked. Same bounds as the chunkwise kernels.
#include <gtest/gtest.h>

#include <vector>

#include "harness.h"

namespace flat::test {
namespace {

std::vector<Case> cases() {
  const auto per_variant = [](Case& base, const auto& add) {
    const Variant variant = base.variant;
    base.K = variant == Variant::sla ? 64 : 32;
    base.V = 24;
    base.chunk = 16;
    // One decode step of three sequences from their states, two tokens of two with head sharing
    // (the library's own choice of the decode path: a call of B rows); a few speculative tokens.
    add([](Case& c) {
      c.B = 3;
      c.h0 = true;
    });
    add([variant](Case& c) {
      c.B = 2;
      c.S = 2;
      c.Nq = c.Nk = c.Nb = 1;
      c.Nv = c.Ng = c.Nw = 2;
      if (variant == Variant::sla) c.Ng = 1;
      c.h0 = true;
    });
    add([](Case& c) {
      c.S = 5;
      c.h0 = true;
    });
    // Past two chunks of loaded rows, from zero.
    add([](Case& c) { c.S = 37; });
    // Head sharing with two batches, K and V not multiples of a vector (sla: packed heads).
    add([variant](Case& c) {
      c.B = 2;
      c.S = 3;
      c.Nq = c.Nk = c.Nb = 2;
      c.Nv = c.Ng = c.Nw = 4;
      if (variant == Variant::sla) c.Ng = 2;
      else c.K = 17;
      c.V = 33;
      c.h0 = true;
    });
    add([](Case& c) {
      c.S = 4;
      c.l2norm = c.strided = c.h0 = true;
    });
    add([](Case& c) {
      c.S = 20;
      c.h0 = true;
      c.decay = Decay::strong;
    });
  };
  return build_sweep(variants_where(any_variant), per_variant, fit_gate_group);
}

class DecodeVsOracle : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeVsOracle, Forward) { expect_within_bounds(compare(Problem(GetParam()), decode_path()), GetParam().dtype); }

// The library's own path at the same cases: the decode path where a call's rows are 1 or 2 tokens
// long, the chunkwise path beyond.
TEST_P(DecodeVsOracle, LibraryChoice) { expect_within_bounds(compare(GetParam()), GetParam().dtype); }

INSTANTIATE_TEST_SUITE_P(Decode, DecodeVsOracle, ::testing::ValuesIn(cases()));

}  // namespace
}  // namespace flat::test

// The delta-rule family's CPU kernels (deltanet, gated_deltanet, kda, gdn2, sla) against the
// float64 oracle on the same rounded inputs: sequence lengths around the chunk, head widths 16 to
// 256, SLA's wide keys shared by four value heads, head sharing of every input, fused-projection
// strides, states, mild to very strong decay, beta up to 2 with raw and L2-normalised keys,
// grouped gates and each chunk solve; the three solves against each other; and the backward's
// kept solves against solving each chunk again.
#include <gtest/gtest.h>

#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu/buffer.h"
#include "cpu/recurrence.h"
#include "cpu/run.h"
#include "cpu/targets.h"
#include "harness.h"
#include "tested_targets.h"

namespace flat::test {
namespace {

const std::vector<Variant> kDeltaVariants = variants_where(delta_rule);

std::vector<Case> sweep() {
  const auto cases = [](Case& base, const auto& add) {
    const Variant variant = base.variant;
    // Sequence lengths around the chunk, states alternating on and off; the long one narrow, as
    // the oracle's cost grows with S K V.
    int i = 0;
    for (int S : {1, 63, 64, 65, 197, 1000})
      add([&](Case& c) {
        c.S = S;
        if (S == 1000) c.K = c.V = 16;
        c.h0 = i % 2 == 0;
        c.dht = i++ % 3 != 1;
      });
    // Head widths, odd and unequal ones included.
    for (auto [K, V] : std::vector<std::pair<int, int>>{
             {16, 64}, {100, 100}, {128, 128}, {256, 256}, {64, 256}, {256, 16}})
      add([&](Case& c) {
        c.S = 2 * 64 + 5;
        c.K = K;
        c.V = V;
        c.h0 = c.dht = true;
      });
    // SLA-R4's shape, for KDA too: K = 256 with q, k, g and beta shared by four value heads.
    if (variant == Variant::sla || variant == Variant::kda)
      add([&](Case& c) {
        c.S = 133;
        c.K = 256;
        c.Nv = 4;
        c.h0 = c.dht = true;
      });
    // Head sharing of every input, two batches.
    add([&](Case& c) {
      c.B = 2;
      c.S = 100;
      c.Nq = c.Nk = c.Nb = 2;
      c.Nv = c.Nw = 4;
      c.h0 = c.dht = true;
    });
    // One fused projection holding q, k, v and beta (b, w), and a strided y.
    add([&](Case& c) {
      c.B = 2;
      c.S = 77;
      c.Nq = c.Nv = c.Nb = 4;
      c.Nk = c.Nw = 2;
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
    // beta up to 2, with raw (short) and with L2-normalised keys.
    for (bool l2norm : {false, true})
      add([&](Case& c) {
        c.S = 200;
        c.beta_max = 2.0;
        c.l2norm = l2norm;
        c.h0 = c.dht = true;
      });
    // In-kernel L2 normalisation with sharing.
    add([&](Case& c) {
      c.S = 150;
      c.Nq = 1;
      c.Nk = c.Nv = c.Ng = c.Nb = c.Nw = 2;
      c.l2norm = true;
      c.h0 = true;
    });
    // Grouped gates for the variants whose default is one value per channel.
    if (variant == Variant::kda || variant == Variant::gdn2)
      add([&](Case& c) {
        c.S = 150;
        c.G = 8;
        c.decay = Decay::strong;
        c.h0 = c.dht = true;
      });
    // Each solve at the smallest, the default and the largest chunk, on hard chunks.
    for (Solve solve : {Solve::substitution, Solve::blocked, Solve::doubling})
      for (auto [C, S] : std::vector<std::pair<int, int>>{{16, 40}, {64, 130}, {256, 300}})
        add([&](Case& c) {
          c.solve = solve;
          c.chunk = C;
          c.S = S;
          c.Nq = c.Nk = c.Nv = c.Ng = c.Nb = c.Nw = 2;
          c.beta_max = 2.0;
          c.decay = Decay::strong;
          c.dht = true;
        });
    // The other chunk sizes at their edges.
    for (auto [C, S] : std::vector<std::pair<int, int>>{{32, 31}, {128, 129}})
      add([&](Case& c) {
        c.chunk = C;
        c.S = S;
        c.h0 = true;
      });
  };
  return build_sweep(kDeltaVariants, cases, fit_gate_group);
}

class DeltaVsOracle : public ::testing::TestWithParam<Case> {};

TEST_P(DeltaVsOracle, ForwardAndBackward) {
  const Case& c = GetParam();
  expect_within_bounds(compare(c), c.dtype);
}

INSTANTIATE_TEST_SUITE_P(Sweep, DeltaVsOracle, ::testing::ValuesIn(sweep()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::to_string(info.index) + "_" + info.param.name();
                         });

// The three solves are exact, so on well-conditioned chunks (normalised keys, beta below 1, mild
// decay) they agree to fp32 rounding in every output, forward and backward.
class SolvesAgree : public ::testing::TestWithParam<Variant> {};

TEST_P(SolvesAgree, ToFp32Rounding) {
  Case c;
  c.variant = GetParam();
  c.S = 300;
  c.K = c.V = 64;
  c.Nq = c.Nk = c.Nv = c.Ng = c.Nb = c.Nw = 2;
  c.chunk = 128;
  c.l2norm = true;
  c.decay = Decay::mild;
  c.h0 = c.dht = true;
  fit_gate_group(c);
  const Problem problem(c);  // the solve does not change the problem drawn
  for (const cpu::Target* target : test::supported_targets()) {
    auto run = [&](Solve solve) {
      Problem with = problem;
      with.c.solve = solve;
      return run_kernel(with, true, 2, *target);
    };
    const KernelOutputs substitution = run(Solve::substitution);
    for (Solve solve : {Solve::blocked, Solve::doubling}) {
      const KernelOutputs other = run(solve);
      for (const auto& [name, values] : kKernelOutputs) {
        const double difference = relative_error(other.*values, substitution.*values);
        EXPECT_TRUE(difference <= 1e-5) << solve_name(solve) << " vs subst: " << name << " " << difference << " on "
                                        << target->name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Delta, SolvesAgree, ::testing::ValuesIn(kDeltaVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           return std::string(variant_name(info.param));
                         });

// The library's backward keeps each chunk's solve and new values from its state pass for the
// gradient pass (solve_record_floats, src/cpu/sequence_kernels.h). This one runs the same stages
// without the records, so the gradient pass forms each solve again, as it did before.
void backward_forming_each_solve_again(const Params& p, const cpu::Run& run) {
  const cpu::SequenceKernels& kernels = run.target.sequence;
  cpu::Gradients grads(p);
  cpu::run_ranges(run, cpu::item_count(p), [&](int64_t begin, int64_t end) {
    cpu::AlignedBuffer workspace(kernels.workspace_bytes(p)), dH(cpu::state_bytes(p)),
        states(cpu::state_bytes(p) * size_t(cpu::chunk_count(p) + 1));
    for (int64_t item = begin; item < end; ++item) {
      kernels.forward(p, item, 1, workspace.data, states.floats(), true, nullptr, false);
      kernels.backward(p, item, 1, workspace.data, states.floats(), nullptr, dH.floats(), grads.sinks);
    }
  });
  grads.finish(run);
}

// The kept solves give the gradients of the solves formed again, to the bit, on every target:
// partial last chunks, odd widths, packed and shared heads, L2-normalised keys, each solve.
class KeptSolves : public ::testing::TestWithParam<Variant> {};

TEST_P(KeptSolves, SameBitsAsSolvingAgain) {
  const Implementation formed_again{"solves formed again", cpu::recurrence_forward, backward_forming_each_solve_again};
  std::vector<Case> cases(3);
  cases[0].S = 65;
  cases[0].K = 17;
  cases[0].V = 33;
  cases[0].h0 = cases[0].dht = true;
  cases[1].B = 2;
  cases[1].S = 100;
  cases[1].Nq = cases[1].Nk = cases[1].Nb = 2;
  cases[1].Nv = cases[1].Ng = cases[1].Nw = 4;
  cases[1].dht = true;
  cases[2].S = 130;
  cases[2].chunk = 32;
  cases[2].solve = Solve::doubling;
  cases[2].l2norm = true;
  cases[2].beta_max = 2.0;
  cases[2].h0 = true;
  for (Case& c : cases) {
    c.variant = GetParam();
    fit_gate_group(c);
    const Problem problem(c);
    for (const cpu::Target* target : test::supported_targets()) {
      const KernelOutputs kept = run_kernel(problem, true, 2, *target),
                          again = run_kernel(problem, true, 2, *target, formed_again);
      for (const auto& [name, values] : kKernelOutputs)
        EXPECT_EQ(kept.*values, again.*values) << c.name() << ": " << name << " on " << target->name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Delta, KeptSolves, ::testing::ValuesIn(kDeltaVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           return std::string(variant_name(info.param));
                         });

}  // namespace
}  // namespace flat::test

// Single-chunk stages for the unfused baseline (tools/baseline/unfused.cpp), which keeps every
// chunk-start state in memory, and the table of every stage a target provides.
//
// Everything here has internal linkage (an anonymous namespace): each target's translation unit
// (src/cpu/target_<name>.cpp) compiles its own copy with its own flags, so no out-of-line copy
// built for one instruction set is picked by the linker for another. For the same reason it uses
// no standard-library templates but header-only ones that inline.
#pragma once

#include "cpu/stages/backward.h"
#include "cpu/stages/step.h"

namespace flat::cpu::stages {
namespace {

template <class Ops>
void chunk_output(const Params& p, int b, int m, int c, void* workspace, const float* H0) {
  Chunk ch(p, workspace);
  const Item item{p, b, m * p.pack};
  const int t0 = c * ch.C;
  Loader<Ops>{p, item}.chunk(ch, t0, Loader<Ops>::keys_values | Loader<Ops>::with_queries);
  if (ch.delta) {
    prepare_delta<Ops>(p, ch);
    delta_values<Ops>(ch, H0);
  }
  output<Ops>(p, item, t0, ch, H0);
}

// The additive family needs only q, dy and the decays here; the delta rule's state gradient
// also goes through the chunk solve: dz = T^T (A^T dY + (k * R) dH).
template <class Ops>
void chunk_state_gradient(const Params& p, int b, int m, int c, void* workspace, float* dH) {
  Chunk ch(p, workspace);
  const Item item{p, b, m * p.pack};
  const int t0 = c * ch.C;
  Loader<Ops>{p, item}.chunk(ch, t0, (ch.delta ? Loader<Ops>::keys_values : 0) | Loader<Ops>::with_queries | Loader<Ops>::with_output_grads);
  scale_rows(ch.qg, ch.q, ch.prefix, ch.L, ch.K, ch.W);
  if (ch.delta) {
    prepare_delta<Ops>(p, ch);
    scale_rows(ch.kd, ch.k, ch.suffix, ch.L, ch.K, ch.W);
    intra_scores<Ops>(ch, ch.q, ch.k, ch.scores, false, ch.qk);
    gemm_tn<Ops>(ch.L, ch.VW, ch.L, ch.scores, ch.C, ch.dy, ch.VW, ch.drv, ch.VW, false, Triangle::a_upper);
    gemm_nn<Ops>(ch.L, ch.VW, ch.K, ch.kd, ch.K, dH, ch.VW, ch.drv, ch.VW, true);
    gemm_tn<Ops>(ch.L, ch.VW, ch.L, ch.solved, ch.C, ch.drv, ch.VW, ch.dz, ch.VW, false, Triangle::a_upper);
  }
  propagate_state_gradient<Ops>(ch, dH);
}

template <class Ops>
void chunk_gradients(const Params& p, int b, int m, int c, void* workspace, const float* H0,
                     const float* dH_end, const GradSinks& sinks) {
  Chunk ch(p, workspace);
  const Item item{p, b, m * p.pack};
  const int t0 = c * ch.C;
  Loader<Ops>{p, item}.chunk(ch, t0, Loader<Ops>::keys_values | Loader<Ops>::with_queries | Loader<Ops>::with_output_grads);
  gradients<Ops>(p, item, t0, ch, H0, dH_end, sinks);
}


size_t workspace_bytes(const Params& p) { return Chunk(p, nullptr).bytes; }

// The stages instantiated for a target's primitives Ops (src/cpu/target_<name>.cpp).
template <class Ops>
constexpr SequenceKernels make_sequence_kernels() {
  return {.workspace_bytes = workspace_bytes,
          .forward = forward_sequence<Ops>,
          .step = step_sequence<Ops>,
          .backward = backward_sequence<Ops>,
          .initial_state_gradient = initial_state_gradient,
          .final_state_gradient = final_state_gradient,
          .chunk_output = chunk_output<Ops>,
          .chunk_state_gradient = chunk_state_gradient<Ops>,
          .chunk_gradients = chunk_gradients<Ops>};
}

}  // namespace
}  // namespace flat::cpu::stages

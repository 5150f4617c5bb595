// The unfused baseline's single-chunk stages (tools/baseline/unfused.cpp keeps every chunk-start
// state in memory), on the library's chunk stages and a target's microkernels. Compiled once per
// CPU target with the target's flags (CMakeLists.txt generates unfused_<target>.cpp: this header
// and FLAT_UNFUSED_STAGES(<target>)), the way the library compiles its own target units.
//
// Everything here but the table's accessor has internal linkage (an anonymous namespace), and it
// uses no standard-library templates but header-only ones that inline, so no out-of-line copy
// built for one instruction set is picked by the linker for another.
#pragma once

#include "baseline/unfused_stages.h"
#include "cpu/stages/backward.h"
#include "cpu/table_ops.h"

namespace flat::baseline {
namespace {

using namespace cpu;
using namespace cpu::stages;

template <class Ops>
void chunk_output(const Params& p, int b, int m, int c, void* workspace, const float* H0) {
  Chunk ch(p, workspace);
  const Item item{p, b, m * p.pack};
  const int t0 = c * ch.C;
  Loader<Ops>{p, item}.chunk(ch, t0, Loader<Ops>::keys_values | Loader<Ops>::with_queries);
  if (ch.delta) prepare_delta<Ops>(p, ch);
  state_products<Ops>(ch, H0, true);
  if (ch.delta) delta_values<Ops>(p, ch);
  output<Ops>(p, item, t0, ch);
  finish_streamed_stores();
}

// The additive family needs only q, dy and the decays here; the delta rule's state gradient
// also goes through the chunk solve: dz = T^T (A^T dY + (k * R) dH).
template <class Ops>
void chunk_state_gradient(const Params& p, int b, int m, int c, void* workspace, float* dH) {
  Chunk ch(p, workspace);
  const Item item{p, b, m * p.pack};
  const int t0 = c * ch.C;
  Loader<Ops>{p, item}.chunk(ch, t0, (ch.delta ? Loader<Ops>::keys_values : 0) | Loader<Ops>::with_queries | Loader<Ops>::with_output_grads);
  ch.decayed_queries = decayed(ch, ch.queries, ch.q, ch.prefix, ch.qg_factor, ch.qg);
  if (ch.delta) {
    prepare_delta<Ops>(p, ch);
    const ScaledRows kd = decayed(ch, ch.keys, ch.k, ch.suffix, ch.kd_factor, ch.kd);
    intra_scores<Ops>(ch, ch.q, ch.k, ch.queries, ch.keys, ch.scores, false);
    gemm_scaled_nn<Ops>(ch, ch.L, ch.VW, kd, dH, ch.VW, ch.drv);
    gemm_tn<Ops>(ch, ch.L, ch.VW, ch.L, ch.scores, ch.C, ch.dy, ch.VW, ch.drv, ch.VW, true, Triangle::a_upper);
    gemm_tn<Ops>(ch, ch.L, ch.VW, ch.L, ch.solved, ch.C, ch.drv, ch.VW, ch.dz, ch.VW, false, Triangle::a_upper);
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
  gradients<Ops>(p, item, t0, ch, H0, {}, dH_end, nullptr, sinks);
  finish_streamed_stores();
}

// The stages instantiated for a target's primitives Ops.
template <class Ops>
constexpr UnfusedStages make_unfused_stages() {
  return {.workspace_bytes = workspace_bytes,
          .initial_state_gradient = initial_state_gradient,
          .final_state_gradient = final_state_gradient,
          .chunk_output = chunk_output<Ops>,
          .chunk_state_gradient = chunk_state_gradient<Ops>,
          .chunk_gradients = chunk_gradients<Ops>};
}

}  // namespace
}  // namespace flat::baseline

// The accessor of the target's table, on the target's microkernels
// (src/cpu/kernels/micro_kernels__<target>.h).
#define FLAT_UNFUSED_STAGES(target)                                                                  \
  const flat::baseline::UnfusedStages& flat::baseline::unfused_stages_##target() {                  \
    static constexpr UnfusedStages stages = make_unfused_stages<cpu::TableOps<cpu::micro_kernels__##target>>(); \
    return stages;                                                                                   \
  }

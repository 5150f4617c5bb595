// What a target's translation unit (src/cpu/target_<name>.cpp) builds its Target with: the chunk
// stages and the leaves of the convolution and of the output norm, instantiated on the target's
// microkernels. Include only there: everything here has internal linkage, a copy per target
// compiled with its flags.
#pragma once

#include "cpu/conv_leaf.h"
#include "cpu/kernels/any_broken__generic.h"
#include "cpu/norm_leaf.h"
#include "cpu/stages/backward.h"
#include "cpu/stages/step.h"
#include "cpu/table_ops.h"
#include "cpu/targets.h"

namespace flat::cpu {
namespace {

// The chunk stages instantiated for a target's primitives Ops.
template <class Ops>
constexpr SequenceKernels make_sequence_kernels() {
  return {.workspace_bytes = stages::workspace_bytes,
          .forward = stages::forward_sequence<Ops>,
          .step = stages::step_sequence<Ops>,
          .backward = stages::backward_sequence<Ops>};
}

// A target from what its unit says of itself (`target`: every field but the tables, which come
// from its microkernels and its row primitives: the convolution's, which the output norm shares). constexpr, and each target's table a constexpr static: built at compile
// time, so that no code compiled with a target's flags runs before targets.cpp has found the CPU
// runs them (a table built at run time was copied with AVX-512 stores, and the first look at the
// list of targets died of an illegal instruction on a CPU without AVX-512).
template <const MicroKernels& M, class ConvRows>
constexpr Target make_target(Target target) {
  target.sequence = make_sequence_kernels<TableOps<M>>();
  target.conv = make_conv_kernels<ConvRows>();
  target.norm = make_norm_gate_kernels<M, ConvRows>();
  target.micro = M;
  target.values = {.any_broken_f32 = any_broken__generic<float>, .any_broken_bf16 = any_broken__generic<uint16_t>};
  return target;
}

}  // namespace
}  // namespace flat::cpu

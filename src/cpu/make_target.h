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

// What a target's unit says of itself.
struct TargetInfo {
  const char* name;
  const char* products;  // what its chunk products run on, in words
  CpuFeatures needs = 0;
  CpuFeatures preferred_with = 0;
  CpuFeatures replaced_where = 0;         // Target::replaced_where
  const char* only_on_request = nullptr;  // Target::only_on_request
  bool tile_products = false;             // Target::tile_products
  bool software_model = false;            // Target::software_model
  void (*enter_thread)() = nullptr;  // the per-thread scope (Target::enter_thread)
  void (*leave_thread)() = nullptr;
};

// A target from its microkernels and its row primitives (the convolution's, which the output norm
// shares). constexpr, and each target's table a constexpr static: built at compile time, so that
// no code compiled with a target's flags runs before targets.cpp has found the CPU runs them (a
// table built at run time was copied with AVX-512 stores, and the first look at the list of
// targets died of an illegal instruction on a CPU without AVX-512).
template <const MicroKernels& M, class ConvRows>
constexpr Target make_target(const TargetInfo& info) {
  return {.name = info.name,
          .products = info.products,
          .needs = info.needs,
          .preferred_with = info.preferred_with,
          .replaced_where = info.replaced_where,
          .only_on_request = info.only_on_request,
          .tile_products = info.tile_products,
          .software_model = info.software_model,
          .sequence = make_sequence_kernels<TableOps<M>>(),
          .conv = make_conv_kernels<ConvRows>(),
          .norm = make_norm_gate_kernels<M, ConvRows>(),
          .micro = M,
          .values = {.any_broken_f32 = any_broken__generic<float>,
                     .any_broken_bf16 = any_broken__generic<uint16_t>},
          .enter_thread = info.enter_thread,
          .leave_thread = info.leave_thread};
}

}  // namespace
}  // namespace flat::cpu

// The chunk stages with their products taken out, for `flat bench`'s vector work (tools/vector_work.h):
// a target's microkernels but for the product kernel, which only writes zeros where the product
// would write C and leaves C as it is where the product would add to it. Every other primitive (the
// rows' loads and stores, the gates' exp and running products, the diagonal blocks, the
// transposes, the solve by substitution) runs as the target runs it, so the time of a pass on these
// kernels is the time of its work beside the products. A product kernel's own packing (the amx
// kernels' VNNI pairs) goes with the product. The results are wrong: timing only. Compiled once per
// target with the target's flags (CMakeLists.txt generates vector_work_<target>.cpp: this header
// and FLAT_VECTOR_WORK_STAGES(<target>)), in the tool, never in the library.
//
// Everything here but the accessor has internal linkage (an anonymous namespace) and uses no
// standard-library template that may be emitted out of line, so no copy built for one instruction
// set is picked by the linker for another (as tools/baseline/single_chunk.h).
#pragma once

#include "cpu/sequence_kernels.h"
#include "cpu/stages/backward.h"
#include "cpu/stages/step.h"
#include "cpu/table_ops.h"

namespace flat::tool {
namespace {

// C = 0 where C = A B would be written (C[m, n], or its lower triangle j <= i for c_lower); nothing
// where C += A B.
void zero_product(const cpu::GemmDesc& d, int m, int n, int, const float*, int, const float*, int, float* c,
                  int ldc) {
  if (d.accumulate) return;
  for (int i = 0; i < m; ++i) {
    const int written = d.triangle == cpu::Triangle::c_lower && i + 1 < n ? i + 1 : n;
    cpu::stages::zero(c + int64_t(i) * ldc, size_t(written));
  }
}

// The table M with zero_product for every product (no shared-B kernel: TableOps then runs each
// product of a shared-B call alone, on zero_product).
template <const cpu::MicroKernels& M>
constexpr cpu::MicroKernels products_zeroed = [] {
  cpu::MicroKernels kernels = M;
  kernels.gemm = cpu::every_product<zero_product>;
  kernels.gemm_shared_b = nullptr;
  return kernels;
}();

template <const cpu::MicroKernels& M>
constexpr cpu::SequenceKernels vector_work_sequence_kernels() {
  using Ops = cpu::TableOps<products_zeroed<M>>;
  return {.workspace_bytes = cpu::stages::workspace_bytes,
          .forward = cpu::stages::forward_sequence<Ops>,
          .step = cpu::stages::step_sequence<Ops>,
          .backward = cpu::stages::backward_sequence<Ops>};
}

}  // namespace
}  // namespace flat::tool

// The accessor of target `name`'s stages without products (declared by tools/vector_work.cpp).
#define FLAT_VECTOR_WORK_STAGES(name)                                                                  \
  namespace flat::tool {                                                                               \
  const cpu::SequenceKernels& vector_work_kernels__##name() {                                          \
    static constexpr cpu::SequenceKernels kernels = vector_work_sequence_kernels<cpu::micro_kernels__##name>(); \
    return kernels;                                                                                    \
  }                                                                                                    \
  }

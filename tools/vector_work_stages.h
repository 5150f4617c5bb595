// The chunk stages with their products taken out, for `flat bench`'s vector work (tools/vector_work.h):
// a target's microkernels but for the product kernel, which only writes zeros where the product
// would write C and leaves C as it is where the product would add to it. Every other primitive (the
// rows' loads and stores, the gates' exp and running products, the diagonal blocks, the
// transposes, the solve by substitution) runs as the target runs it, so the time of a pass on these
// kernels is the time of its work beside the products. A product kernel's own packing (the amx
// kernels' VNNI pairs) goes with the product. The results are wrong: timing only.
// The same stages again as the bench's product census: each product counted (its multiply-adds, as
// its triangle leaves them) by the unit the target's own table would run it on, then zeroed as
// above; the diagonal blocks' kernels, which run on the vector units, counted as fp32 FMA work.
// Compiled once per target with the target's flags (CMakeLists.txt generates
// vector_work_<target>.cpp: this header and FLAT_VECTOR_WORK_STAGES(<target>)), in the tool, never
// in the library.
//
// Everything here but the accessors has internal linkage (an anonymous namespace) and uses no
// standard-library template that may be emitted out of line, so no copy built for one instruction
// set is picked by the linker for another (as tools/baseline/single_chunk.h).
#pragma once

#include "cpu/sequence_kernels.h"
#include "cpu/stages/backward.h"
#include "cpu/stages/step.h"
#include "cpu/table_ops.h"
#include "vector_work.h"

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
constexpr cpu::SequenceKernels sequence_kernels_on() {
  using Ops = cpu::TableOps<M>;
  return {.workspace_bytes = cpu::stages::workspace_bytes,
          .forward = cpu::stages::forward_sequence<Ops>,
          .step = cpu::stages::step_sequence<Ops>,
          .backward = cpu::stages::backward_sequence<Ops>};
}

// A product counted into the census as work of the target's product unit (`on_unit`) or of its
// fp32 FMA kernel, then zeroed (zero_product).
template <bool on_unit>
void census_product(const cpu::GemmDesc& d, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                    float* c, int ldc) {
  (on_unit ? census_on_unit : census_on_fma) += cpu::product_multiply_adds(d, m, n, k);
  zero_product(d, m, n, k, a, lda, b, ldb, c, ldc);
}

// Where M runs a product so described: on its product unit where it chooses another kernel than
// for the same product of fp32 operands at exact precision (which every target runs on its fp32
// kernel), else on fp32 FMA.
template <const cpu::MicroKernels& M>
cpu::GemmKernel census_choice(const cpu::GemmDesc& d) {
  cpu::GemmDesc fp32 = d;
  fp32.a_values = fp32.b_values = cpu::Operands::f32;
  fp32.precision = Precision::exact;
  return M.gemm(d) != M.gemm(fp32) ? census_product<true> : census_product<false>;
}

// The diagonal blocks' kernels of M, their multiply-adds counted as fp32 FMA work (the formula's
// count, tests/test_product_work.cpp).
template <const cpu::MicroKernels& M>
void census_diagonal_scores(int n, int K, const float* q, const float* k, const float* a, float* A, int lda, float* f) {
  census_on_fma += int64_t(n) * (n + 1) / 2 * K;
  M.diagonal_scores(n, K, q, k, a, A, lda, f);
}
template <const cpu::MicroKernels& M>
void census_diagonal_gradients(int n, int K, const float* q, const float* k, const float* a, const float* dA,
                               int lda, float* dq, float* dk, float* f) {
  census_on_fma += int64_t(n) * (n + 1) * K;
  M.diagonal_gradients(n, K, q, k, a, dA, lda, dq, dk, f);
}

// The table M with its products counted and zeroed, one by one (no shared-B kernel), and its
// diagonal blocks counted.
template <const cpu::MicroKernels& M>
constexpr cpu::MicroKernels products_counted = [] {
  cpu::MicroKernels kernels = M;
  kernels.gemm = census_choice<M>;
  kernels.gemm_shared_b = nullptr;
  kernels.diagonal_scores = census_diagonal_scores<M>;
  kernels.diagonal_gradients = census_diagonal_gradients<M>;
  return kernels;
}();

}  // namespace
}  // namespace flat::tool

// The accessors of target `name`'s stages without products and of its census stages (declared by
// tools/vector_work.cpp).
#define FLAT_VECTOR_WORK_STAGES(name)                                                                           \
  namespace flat::tool {                                                                                        \
  const cpu::SequenceKernels& vector_work_kernels__##name() {                                                   \
    static constexpr cpu::SequenceKernels kernels = sequence_kernels_on<products_zeroed<cpu::micro_kernels__##name>>(); \
    return kernels;                                                                                             \
  }                                                                                                             \
  const cpu::SequenceKernels& census_kernels__##name() {                                                        \
    static constexpr cpu::SequenceKernels kernels = sequence_kernels_on<products_counted<cpu::micro_kernels__##name>>(); \
    return kernels;                                                                                             \
  }                                                                                                             \
  }

// What a target's translation unit (src/cpu/target_<name>.cpp) builds its Target with: the chunk
// stages and the leaves of the convolution and of the output norm, instantiated on the target's
// microkernels. Include only there: everything here has internal linkage, a copy per target
// compiled with its flags.
#pragma once

#include "cpu/conv_leaf.h"
#include "cpu/kernels/any_broken__generic.h"
#include "cpu/norm_leaf.h"
#include "cpu/stages/single_chunk.h"
#include "cpu/targets.h"

namespace flat::cpu {
namespace {

// The chunk stages' primitives (src/cpu/stages/products.h) from a target's constant table of
// microkernels: every call is to a known function, so it inlines as a direct call would.
template <const MicroKernels& M>
struct TableOps {
  static void gemm(const GemmDesc& d, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                   int ldc) {
    M.gemm(d)(d, m, n, k, a, lda, b, ldb, c, ldc);
  }
  static void transpose(int rows, int cols, const float* src, int lds, float* dst, int ldd) {
    M.transpose(rows, cols, src, lds, dst, ldd);
  }
  static void exp(float* x, int n) { M.exp(x, n); }
  static float dot(const float* a, const float* b, int n) { return M.dot(a, b, n); }
  static void diagonal_scores(int n, int K, const float* q, const float* k, const float* a, float* A, int lda,
                              float* f) {
    M.diagonal_scores(n, K, q, k, a, A, lda, f);
  }
  static void diagonal_gradients(int n, int K, const float* q, const float* k, const float* a, const float* dA,
                                 int lda, float* dq, float* dk, float* f) {
    M.diagonal_gradients(n, K, q, k, a, dA, lda, dq, dk, f);
  }
};

// A target from its microkernels and its row primitives (the convolution's, which the output norm
// shares). constexpr, and each target's table a constexpr static: built at compile time, so that
// no code compiled with a target's flags runs before targets.cpp has found the CPU runs them (a
// table built at run time was copied with AVX-512 stores, and the first look at the list of
// targets died of an illegal instruction on a CPU without AVX-512).
// What a target's unit says of itself.
struct TargetInfo {
  const char* name;
  const char* products;  // what its chunk products run on, in words
  CpuFeatures needs = 0;
  CpuFeatures preferred_with = 0;
};

template <const MicroKernels& M, class ConvRows>
constexpr Target make_target(const TargetInfo& info) {
  return {.name = info.name,
          .products = info.products,
          .needs = info.needs,
          .preferred_with = info.preferred_with,
          .sequence = stages::make_sequence_kernels<TableOps<M>>(),
          .conv = make_conv_kernels<ConvRows>(),
          .norm = make_norm_gate_kernels<M, ConvRows>(),
          .micro = M,
          .values = {.any_broken_f32 = any_broken__generic<float>,
                     .any_broken_bf16 = any_broken__generic<uint16_t>}};
}

}  // namespace
}  // namespace flat::cpu

// A target's constant table of microkernels as the chunk stages' primitives (their Ops): for the
// target's own unit (src/cpu/make_target.h) and for any other unit compiled with the target's
// flags that runs the stages on its microkernels (the bench's unfused baseline).
#pragma once

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
  static void gemm_shared_b(const SharedBDesc& d, int count, const SharedBProduct* products, int n, int k,
                            const float* b, int ldb, const Bf16Rows& b_bf16 = {}) {
    if constexpr (M.gemm_shared_b != nullptr) {
      M.gemm_shared_b(d)(d, count, products, n, k, b, ldb, b_bf16);
    } else {
      gemm_each_alone<M.gemm>(d, count, products, n, k, b, ldb, b_bf16);
    }
  }
  static constexpr bool reads_bf16_rows = M.reads_bf16_rows;
  static bool reads_b_by_columns(const SharedBDesc& d) {
    if constexpr (M.reads_b_by_columns != nullptr) {
      return M.reads_b_by_columns(d);
    } else {
      return false;
    }
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

}  // namespace
}  // namespace flat::cpu

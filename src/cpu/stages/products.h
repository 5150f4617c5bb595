// The chunk products in the three layouts the stages need, on a target's gemm (Ops::gemm, or
// Ops::gemm_bf16_values where every operand is a bf16 value). A B^T is a packing step (the
// transpose of B into the chunk's `packed` panel) followed by the product.
//
// Everything here has internal linkage (an anonymous namespace): each target's translation unit
// (src/cpu/target_<name>.cpp) compiles its own copy with its own flags, so no out-of-line copy
// built for one instruction set is picked by the linker for another. For the same reason it uses
// no standard-library templates but header-only ones that inline.
#pragma once

#include "cpu/stages/chunk.h"

namespace flat::cpu::stages {
namespace {

// C[m, n] (+)= A[m, k] B[k, n], A and B row-major.
template <class Ops>
void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
             bool accumulate, Triangle tri = Triangle::none) {
  Ops::gemm(m, n, k, a, lda, 1, b, ldb, c, ldc, accumulate, tri);
}
// C[m, n] (+)= A^T B with A stored [k, m]. bf16_values: every element of A and B is a bf16 value.
template <class Ops>
void gemm_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
             bool accumulate, Triangle tri = Triangle::none, bool bf16_values = false) {
  (bf16_values ? Ops::gemm_bf16_values : Ops::gemm)(m, n, k, a, 1, lda, b, ldb, c, ldc, accumulate, tri);
}
// C[m, n] (+)= A B^T with B stored [n, k]: B^T is packed [k, n] first so the microkernels stream
// contiguous rows.
template <class Ops>
void gemm_nt(Chunk& ch, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate, Triangle tri = Triangle::none, bool bf16_values = false) {
  Ops::transpose(n, k, b, ldb, ch.packed, n);
  (bf16_values ? Ops::gemm_bf16_values : Ops::gemm)(m, n, k, a, lda, 1, ch.packed, n, c, ldc, accumulate, tri);
}

}  // namespace
}  // namespace flat::cpu::stages

// The chunk products in the three layouts the stages need, on a target's gemm (Ops::gemm, or
// Ops::gemm_bf16_values where every operand is a bf16 value). Packing is a step of its own: an
// operand packed once (PackedB) serves any number of products; A B^T packs B^T into the chunk's
// `packed` panel and multiplies.
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
// A B operand as the microkernels stream it: row-major [k, n] rows at `data`, `ld` apart.
struct PackedB {
  const float* data;
  int ld;
};

// The packing step of A B^T, B stored [n, k]: B^T laid out [k, n] in `out` (k * n floats), so the
// microkernels stream contiguous rows, for as many products as read it.
template <class Ops>
PackedB pack_transposed(int n, int k, const float* b, int ldb, float* out) {
  Ops::transpose(n, k, b, ldb, out, n);
  return {out, n};
}

// C[m, n] (+)= A B with B packed.
template <class Ops>
void gemm_packed(int m, int n, int k, const float* a, int lda, PackedB b, float* c, int ldc, bool accumulate,
                 Triangle tri = Triangle::none, bool bf16_values = false) {
  (bf16_values ? Ops::gemm_bf16_values : Ops::gemm)(m, n, k, a, lda, 1, b.data, b.ld, c, ldc, accumulate, tri);
}

// C[m, n] (+)= A B^T with B stored [n, k], packed into the chunk's panel for this one product.
template <class Ops>
void gemm_nt(Chunk& ch, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate, Triangle tri = Triangle::none, bool bf16_values = false) {
  gemm_packed<Ops>(m, n, k, a, lda, pack_transposed<Ops>(n, k, b, ldb, ch.packed), c, ldc, accumulate, tri,
                   bf16_values);
}

}  // namespace
}  // namespace flat::cpu::stages

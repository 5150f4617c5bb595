// fp32 matrix products for the chunk stages. Row-major operands with leading dimensions in
// elements; `accumulate` adds to C instead of overwriting it. The drivers fix the order of every
// sum, so results are bitwise reproducible.
#pragma once

namespace flat::cpu {

// C[m, n] (+)= A[m, k] B[k, n]
void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate);
// C[m, n] (+)= A^T B with A stored [k, m]
void gemm_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate);
// C[m, n] (+)= A B^T with B stored [n, k]
void gemm_nt(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate);

}  // namespace flat::cpu

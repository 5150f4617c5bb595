// The table of a target's microkernels: what a target's unit (src/cpu/target_<name>.cpp) puts in
// its Target (src/cpu/targets.h) and TableOps (src/cpu/table_ops.h) turns into the chunk stages'
// primitives. Each micro_kernels__<name>.h here fills one; a leaf of the include graph, as every
// header of kernels/: nothing here includes from src/cpu/ above it.
#pragma once

#include "cpu/kernels/product.h"

namespace flat::cpu {

// A target's primitives, as the chunk stages call them (its Ops) and the microkernel tests check
// them (contracts in src/cpu/kernels/: gemm_f32_1xn__generic.h, elementwise_f32__generic.h,
// diagonal_f32_1xk__generic.h).
struct MicroKernels {
  // The kernel of a product so described (src/cpu/kernels/product.h): the target's choice by the
  // operands (bf16 values on bf16 dot-product units where it has them, exactly), the layout, the
  // size.
  using ChooseGemm = GemmKernel (*)(const GemmDesc& d);
  ChooseGemm gemm;
  // The kernel of products that share B (SharedBProduct), where the target's packs B: null for a
  // target whose kernels read B as it lies, whose products then run one by one (TableOps).
  using ChooseGemmSharedB = GemmSharedBKernel (*)(const SharedBDesc& d);
  ChooseGemmSharedB gemm_shared_b = nullptr;
  // Whether the kernel the target chooses for products so described takes B stored by columns
  // (GemmDesc::b, B^T's rows [n, k]): then the stages' products A B^T hand it B as it lies, with no
  // transposed copy (the tile targets: their products on the tiles whose B is one part, which the
  // tile kernel packs from its columns). Null where every kernel reads B by rows (the stages then
  // transpose B for them, Ops::transpose).
  using ReadsBByColumns = bool (*)(const SharedBDesc& d);
  ReadsBByColumns reads_b_by_columns = nullptr;
  // Whether every product of an operand of bf16 values runs on a kernel that reads it kept as bf16
  // (Bf16Rows, through gemm_shared_b), so the stages need not widen rows that only products read
  // (the tile targets: each such product has a one-part operand, on the tiles, whose packing takes
  // bf16 pairs as they lie). Such a target's kernels read every one-part B by columns too
  // (reads_b_by_columns), so the stages never transpose a B they keep as bf16.
  bool reads_bf16_rows = false;
  void (*transpose)(int rows, int cols, const float* src, int lds, float* dst, int ldd);
  void (*exp)(float* x, int n);
  float (*dot)(const float* a, const float* b, int n);
  void (*diagonal_scores)(int n, int K, const float* q, const float* k, const float* a, float* A, int lda, float* f);
  void (*diagonal_gradients)(int n, int K, const float* q, const float* k, const float* a, const float* dA, int lda,
                             float* dq, float* dk, float* f);
};


}  // namespace flat::cpu

// The table of microkernels of a target whose chunk products run on a tile unit (any
// implementation of tiles.h): a vector target's table (its transpose, exp, dot, diagonal blocks and
// fp32 product kernel) with the chunk products the tiles take on the tile product
// (gemm_bf16_32x32__amx.h) at the descriptor's precision. micro_kernels__amx.h takes it on the
// instructions over avx512's vector code, micro_kernels__amx_model.h on the model over the same,
// micro_kernels__amx_model_avx2.h on the model over avx2's: each as
// FLAT_AMX_MICRO_KERNELS(<target>, <tiles>, <vector table>).
#pragma once

#include "cpu/kernels/gemm_bf16_32x32__amx.h"
#include "cpu/kernels/micro_kernels.h"

namespace flat::cpu {
namespace {

// Which products go on the tiles: those with an operand the tiles take as one part (bf16 values,
// or any operand at Precision::fast). A product whose operands are both split into parts (fp32
// values on both sides at Precision::exact: three passes over two packed parts of each for bf16
// outputs, six over three for fp32 ones) runs on the vector table's fp32 kernel, as on the vector
// target. Why: on a Sapphire Rapids Xeon (docs/performance.md, "The amx target on an AMX Xeon",
// 2026-12-04) DeltaNet's backward at exact, whose products mostly have fp32 operands on both
// sides, spent as much in the tile products and their packing as avx512 spent in its FMA
// products, and the delta family ran at 0.74-0.99 of avx512's speed; products with a one-part
// operand made la, RetNet and Mamba-2 1.3-1.4x faster. With this choice, on the same kind of Xeon
// (2026-12-07, docs/performance.md, "The amx target as the default"), forward + backward at exact
// ran x1.10-1.51 of avx512's speed where a product has an operand of bf16 values, and x0.98-1.03
// (the same code: within the runs' noise) where none has (kda, gdn2, SLA).
constexpr bool on_tiles(const SharedBDesc& d) {
  return amx_parts_of(d.a_values, d) == 1 || amx_parts_of(d.b_values, d) == 1;
}

// Which products take B by columns (B^T's rows as they lie, GemmDesc::b): those on the tiles whose
// B is one part (bf16 values, or any B at Precision::fast), each column's k converted and 16 columns'
// pair words transposed. A B split into parts is paired from its rows by shifts
// (bf16_part_pairs), less work per part than converting and transposing each: those products take
// B transposed by the stages, by rows (on this Xeon, 2026-12-07, Mamba-2's backward at exact read
// 113-118 ms with every product on the tiles taking B by columns against 113-114 without).
constexpr bool reads_b_by_columns__tiles(const SharedBDesc& d) {
  return on_tiles(d) && amx_parts_of(d.b_values, d) == 1;
}

template <class Tiles, const MicroKernels& vector_kernels>
constexpr GemmKernel choose_gemm__tiles(const GemmDesc& d) {
  return on_tiles(call_desc(d)) ? gemm_bf16_32x32__amx<Tiles> : vector_kernels.gemm(d);
}

template <class Tiles, const MicroKernels& vector_kernels>
constexpr GemmSharedBKernel choose_gemm_shared_b__tiles(const SharedBDesc& d) {
  return on_tiles(d) ? gemm_bf16_shared_b_32x32__amx<Tiles> : gemm_each_alone<vector_kernels.gemm>;
}

template <class Tiles, const MicroKernels& vector_kernels>
constexpr MicroKernels tile_micro_kernels() {
  MicroKernels kernels = vector_kernels;
  kernels.gemm = choose_gemm__tiles<Tiles, vector_kernels>;
  kernels.gemm_shared_b = choose_gemm_shared_b__tiles<Tiles, vector_kernels>;
  kernels.reads_b_by_columns = reads_b_by_columns__tiles;
  kernels.reads_bf16_rows = true;  // every product of a bf16-values operand is on_tiles, its B by columns
  return kernels;
}

}  // namespace
}  // namespace flat::cpu

// The table micro_kernels__<target> of a target whose tile unit is `tiles` and whose other
// microkernels are `vector_kernels`'.
#define FLAT_AMX_MICRO_KERNELS(target, tiles, vector_kernels)                                    \
  namespace flat::cpu {                                                                         \
  namespace {                                                                                   \
  constexpr MicroKernels micro_kernels__##target = tile_micro_kernels<tiles, vector_kernels>(); \
  }                                                                                             \
  }

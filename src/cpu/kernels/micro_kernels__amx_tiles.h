// The table of microkernels of a target whose chunk products run on a tile unit (any
// implementation of tiles.h): a vector target's table (its transpose, exp, dot and diagonal blocks)
// with every chunk product on the tile product (gemm_bf16_32x32__amx.h) at the descriptor's
// precision. micro_kernels__amx.h takes it on the instructions over avx512_bf16's vector code,
// micro_kernels__amx_model.h on the model over the same, micro_kernels__amx_model_avx2.h on the
// model over avx2's: each as FLAT_AMX_MICRO_KERNELS(<target>, <tiles>, <vector table>).
#pragma once

#include "cpu/kernels/gemm_bf16_32x32__amx.h"
#include "cpu/targets.h"

namespace flat::cpu {
namespace {

template <class Tiles>
constexpr MicroKernels tile_micro_kernels(MicroKernels vector_kernels) {
  MicroKernels kernels = vector_kernels;
  kernels.gemm = every_product<gemm_bf16_32x32__amx<Tiles>>;
  kernels.gemm_shared_b = [](const SharedBDesc&) -> GemmSharedBKernel { return gemm_bf16_shared_b_32x32__amx<Tiles>; };
  return kernels;
}

}  // namespace
}  // namespace flat::cpu

// The table micro_kernels__<target> of a target whose tile unit is `tiles` and whose other
// microkernels are `vector_kernels`'.
#define FLAT_AMX_MICRO_KERNELS(target, tiles, vector_kernels)                                    \
  namespace flat::cpu {                                                                         \
  namespace {                                                                                   \
  constexpr MicroKernels micro_kernels__##target = tile_micro_kernels<tiles>(vector_kernels);   \
  }                                                                                             \
  }

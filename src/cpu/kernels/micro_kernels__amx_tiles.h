// The amx target's table of microkernels on any implementation of the tile interface (tiles.h):
// avx512_bf16's, with every chunk product on the tile product (gemm_bf16_32x32__amx.h) at the
// descriptor's precision. micro_kernels__amx.h takes it on the instructions,
// micro_kernels__amx_model.h on the model, each as FLAT_AMX_MICRO_KERNELS(<target>, <tiles>).
#pragma once

#include "cpu/kernels/gemm_bf16_32x32__amx.h"
#include "cpu/kernels/micro_kernels__avx512.h"

namespace flat::cpu {
namespace {

template <class Tiles>
constexpr MicroKernels amx_micro_kernels_with_shared_b() {
  MicroKernels kernels = avx512_micro_kernels_with(every_product<gemm_bf16_32x32__amx<Tiles>>);
  kernels.gemm_shared_b = [](const GemmDesc&) -> GemmSharedBKernel { return gemm_bf16_shared_b_32x32__amx<Tiles>; };
  return kernels;
}
template <class Tiles>
constexpr MicroKernels amx_micro_kernels_on = amx_micro_kernels_with_shared_b<Tiles>();

}  // namespace
}  // namespace flat::cpu

// The table micro_kernels__<target> of a target whose tile unit is `tiles`.
#define FLAT_AMX_MICRO_KERNELS(target, tiles)                                                \
  namespace flat::cpu {                                                                     \
  namespace {                                                                               \
  constexpr MicroKernels micro_kernels__##target = amx_micro_kernels_on<tiles>;             \
  }                                                                                         \
  }

// The amx target's microkernels, as its table (src/cpu/targets.h): avx512_bf16's, with the
// products whose operands are all bf16 values on the tile unit (gemm_bf16_32x32__amx.h), exactly,
// every other on fp32 FMA (gemm_bf16_6x64__avx512bf16.h says why fp32 operands stay there).
#pragma once

#include "cpu/kernels/gemm_bf16_32x32__amx.h"
#include "cpu/kernels/micro_kernels__avx512.h"
#include "cpu/kernels/tiles__amx.h"

namespace flat::cpu {
namespace {

constexpr GemmKernel choose_gemm__amx(const GemmDesc& d) {
  return d.operands == Operands::bf16_values ? gemm_bf16_32x32__amx<AmxTiles> : gemm_f32_6x64__avx512;
}

constexpr MicroKernels micro_kernels__amx = avx512_micro_kernels_with(choose_gemm__amx);

}  // namespace
}  // namespace flat::cpu

// The avx512_bf16 target's microkernels, as its table (micro_kernels.h): avx512's, with the
// products whose operands are all bf16 values on vdpbf16ps, exactly, and under Precision::fast
// every product, its operands rounded to bf16 once; every other on fp32 FMA
// (kernels/gemm_bf16_6x64__avx512bf16.h says why).
#pragma once

#include "cpu/kernels/gemm_bf16_6x64__avx512bf16.h"
#include "cpu/kernels/micro_kernels__avx512.h"

namespace flat::cpu {
namespace {

constexpr GemmKernel choose_gemm__avx512_bf16(const GemmDesc& d) {
  return bf16_operands(d) || d.precision == Precision::fast ? gemm_bf16_6x64__avx512bf16 : gemm_f32_6x64__avx512;
}

constexpr MicroKernels micro_kernels__avx512_bf16 = avx512_micro_kernels_with(choose_gemm__avx512_bf16);

}  // namespace
}  // namespace flat::cpu

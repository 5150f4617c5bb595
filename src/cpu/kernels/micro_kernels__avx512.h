// The avx512 target's microkernels, as its table (micro_kernels.h): every product on the fp32
// FMA tile. avx512_bf16 shares the others (avx512_micro_kernels_with, its own choice of product
// kernel: kernels/micro_kernels__avx512_bf16.h).
#pragma once

#include "cpu/kernels/diagonal_f32_16xk__avx512.h"
#include "cpu/kernels/elementwise_f32_16__avx512.h"
#include "cpu/kernels/gemm_f32_6x64__avx512.h"
#include "cpu/kernels/micro_kernels.h"

namespace flat::cpu {
namespace {

constexpr MicroKernels avx512_micro_kernels_with(MicroKernels::ChooseGemm gemm) {
  return {.gemm = gemm,
          .transpose = transpose_f32_16x16__avx512,
          .exp = exp_f32_16__avx512,
          .dot = dot_f32_16__avx512,
          .diagonal_scores = diagonal_scores_f32_16xk__avx512,
          .diagonal_gradients = diagonal_gradients_f32_16xk__avx512};
}

constexpr MicroKernels micro_kernels__avx512 = avx512_micro_kernels_with(every_product<gemm_f32_6x64__avx512>);

}  // namespace
}  // namespace flat::cpu

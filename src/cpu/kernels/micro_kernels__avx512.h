// The microkernels the AVX-512 targets share, as their table (src/cpu/targets.h), with the
// target's choice of product kernel: the fp32 FMA tile for every product, or the bf16 dot-product
// tile for products of bf16 values where the target has AVX512-BF16.
#pragma once

#include "cpu/kernels/diagonal_f32_16xk__avx512.h"
#include "cpu/kernels/elementwise_f32_16__avx512.h"
#include "cpu/kernels/gemm_f32_6x64__avx512.h"
#include "cpu/targets.h"

namespace flat::cpu {
namespace {

constexpr MicroKernels micro_kernels_avx512(MicroKernels::ChooseGemm gemm) {
  return {.gemm = gemm,
          .transpose = transpose_f32_16x16__avx512,
          .exp = exp_f32_16__avx512,
          .dot = dot_f32_16__avx512,
          .diagonal_scores = diagonal_scores_f32_16xk__avx512,
          .diagonal_gradients = diagonal_gradients_f32_16xk__avx512};
}

}  // namespace
}  // namespace flat::cpu

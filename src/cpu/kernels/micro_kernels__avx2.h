// The avx2 target's microkernels, as its table (micro_kernels.h): every product on the fp32 FMA
// tile, products of bf16 values too (no bf16 dot products without AVX-512); the transpose, exp,
// dot and the diagonal blocks 8 lanes at a time.
#pragma once

#include "cpu/kernels/diagonal_f32_8xk__avx2.h"
#include "cpu/kernels/elementwise_f32_8__avx2.h"
#include "cpu/kernels/gemm_f32_6x16__avx2.h"
#include "cpu/kernels/micro_kernels.h"

namespace flat::cpu {
namespace {

constexpr MicroKernels micro_kernels__avx2{.gemm = every_product<gemm_f32_6x16__avx2>,
                                           .transpose = transpose_f32_8x8__avx2,
                                           .exp = exp_f32_8__avx2,
                                           .dot = dot_f32_8__avx2,
                                           .diagonal_scores = diagonal_scores_f32_8xk__avx2,
                                           .diagonal_gradients = diagonal_gradients_f32_8xk__avx2};

}  // namespace
}  // namespace flat::cpu

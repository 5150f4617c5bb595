// The generic target's microkernels, as its table (micro_kernels.h): portable C++, vectorised by
// the compiler for the instruction set the including unit is compiled for.
#pragma once

#include "cpu/kernels/diagonal_f32_1xk__generic.h"
#include "cpu/kernels/elementwise_f32__generic.h"
#include "cpu/kernels/gemm_f32_1xn__generic.h"
#include "cpu/kernels/micro_kernels.h"

namespace flat::cpu {
namespace {

constexpr MicroKernels micro_kernels__generic{.gemm = every_product<gemm_f32_1xn__generic>,
                                              .transpose = transpose_f32__generic,
                                              .exp = exp_f32__generic,
                                              .dot = dot_f32__generic,
                                              .diagonal_scores = diagonal_scores_f32_1xk__generic,
                                              .diagonal_gradients = diagonal_gradients_f32_1xk__generic};

}  // namespace
}  // namespace flat::cpu

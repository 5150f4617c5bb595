// The portable target: the chunk stages and the convolution's leaves in plain C++, vectorised by
// the compiler for the baseline instruction set. Runs on any CPU.
#include "cpu/kernels/conv_rows__generic.h"
#include "cpu/kernels/diagonal_f32_1xk__generic.h"
#include "cpu/kernels/elementwise_f32__generic.h"
#include "cpu/kernels/gemm_f32_1xn__generic.h"
#include "cpu/make_target.h"

namespace flat::cpu {
namespace {

constexpr MicroKernels kGeneric{.gemm = every_product<gemm_f32_1xn__generic>,
                                .transpose = transpose_f32__generic,
                                .exp = exp_f32__generic,
                                .dot = dot_f32__generic,
                                .diagonal_scores = diagonal_scores_f32_1xk__generic,
                                .diagonal_gradients = diagonal_gradients_f32_1xk__generic};

}  // namespace

const Target& target_generic() {
  static constexpr Target target = make_target<kGeneric, conv_generic::ConvRowsGeneric>(
      {.name = "generic", .products = "chunk products in portable C++"});
  return target;
}

}  // namespace flat::cpu

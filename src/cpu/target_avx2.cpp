// The avx2 target: AVX2 with FMA, for the CPUs that have them without AVX-512 (Haswell to Comet
// Lake, Alder and Raptor Lake, Zen 1 to 3). Every chunk product on the fp32 FMA microkernel
// gemm_f32_6x16__avx2; the transpose, exp, dot and the diagonal blocks 8 lanes at a time. The
// convolution's and output norm's rows are the generic target's portable code, compiled here with
// the AVX2 flags (CMakeLists.txt), which the compiler vectorises 8 lanes wide. Run only where
// targets.cpp found the CPU has them.
#include "cpu/kernels/conv_rows__generic.h"
#include "cpu/kernels/diagonal_f32_8xk__avx2.h"
#include "cpu/kernels/elementwise_f32_8__avx2.h"
#include "cpu/kernels/gemm_f32_6x16__avx2.h"
#include "cpu/make_target.h"

namespace flat::cpu {
namespace {

// Products of bf16 values too on the fp32 FMA tile, as generic's: no bf16 dot products without
// AVX-512.
constexpr MicroKernels kAvx2{.gemm = every_product<gemm_f32_6x16__avx2>,
                             .transpose = transpose_f32_8x8__avx2,
                             .exp = exp_f32_8__avx2,
                             .dot = dot_f32_8__avx2,
                             .diagonal_scores = diagonal_scores_f32_8xk__avx2,
                             .diagonal_gradients = diagonal_gradients_f32_8xk__avx2};

}  // namespace

const Target& target_avx2() {
  static constexpr Target target = make_target<kAvx2, conv_generic::ConvRowsGeneric>(
      {.name = "avx2", .products = "chunk products on fp32 FMA (AVX2)", .needs = kCpuAvx2 | kCpuFma});
  return target;
}

}  // namespace flat::cpu

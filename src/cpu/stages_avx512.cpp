// The chunk stages on AVX-512 with fp32 FMA microkernels for every product.
#define FLAT_ISA avx512
#include "cpu/stages_avx512.inc"

namespace flat::cpu::avx512 {
namespace {

constexpr auto& matmul = matmul_f32;
constexpr auto& matmul_bf16_values = matmul_f32;

}  // namespace
}  // namespace flat::cpu::avx512

#include "cpu/stages.inc"

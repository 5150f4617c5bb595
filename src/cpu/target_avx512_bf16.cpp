// The avx512_bf16 target: avx512 with AVX512-BF16. The products whose operands are all bf16
// values (the scores q k^T and bt k^T of bf16 q and k under a scalar or no gate; linear
// attention's state update k^T v) run on the bf16 dot-product microkernel, exactly, and at
// Precision::fast every product; every other product keeps fp32 operands on the FMA microkernel
// (kernels/gemm_bf16_6x64__avx512bf16.h says why); the convolution rounds to bf16 with
// vcvtne2ps2bf16. Compiled with those flags (CMakeLists.txt) and
// run only where targets.cpp found the CPU has them.
#include "cpu/kernels/conv_rows__avx512.h"
#include "cpu/kernels/micro_kernels__avx512_bf16.h"
#include "cpu/make_target.h"

namespace flat::cpu {

const Target& target_avx512_bf16() {
  // Preferred only where vdpbf16ps outruns the FMA units (kCpuBf16DotOutrunsFma, targets.h): elsewhere
  // avx512, whose products are all on fp32 FMA, is as fast.
  static constexpr Target target = make_target<micro_kernels__avx512_bf16, conv_avx512::ConvRowsAvx512<true>>(
      {.name = "avx512_bf16",
       .needs = kCpuAvx512 | kCpuAvx512Bf16,
       .preferred_with = kCpuBf16DotOutrunsFma});
  return target;
}

}  // namespace flat::cpu

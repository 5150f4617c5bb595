// The avx512 target: AVX-512 F/BW/DQ/VL with FMA, every chunk product on the fp32 FMA
// microkernel. Compiled with those flags (CMakeLists.txt) and run only where targets.cpp found
// the CPU has them.
#include "cpu/kernels/conv_rows__avx512.h"
#include "cpu/kernels/micro_kernels__avx512.h"
#include "cpu/make_target.h"

namespace flat::cpu {

const Target& target_avx512() {
  static constexpr Target target = make_target<micro_kernels__avx512, conv_avx512::ConvRowsAvx512<false>>(
      {.name = "avx512", .needs = kCpuAvx512});
  return target;
}

}  // namespace flat::cpu

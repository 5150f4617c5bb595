// The avx2 target: AVX2 with FMA, for the CPUs that have them without AVX-512 (Haswell to Comet
// Lake, Alder and Raptor Lake, Zen 1 to 3). Every chunk product on the fp32 FMA microkernel
// gemm_f32_6x16__avx2; the transpose, exp, dot and the diagonal blocks 8 lanes at a time. The
// convolution's and output norm's rows are the generic target's portable code, compiled here with
// the AVX2 flags (CMakeLists.txt), which the compiler vectorises 8 lanes wide. Run only where
// targets.cpp found the CPU has them.
#include "cpu/kernels/conv_rows__generic.h"
#include "cpu/kernels/micro_kernels__avx2.h"
#include "cpu/make_target.h"

namespace flat::cpu {

const Target& target_avx2() {
  static constexpr Target target = make_target<micro_kernels__avx2, conv_generic::ConvRowsGeneric>(
      {.name = "avx2", .needs = kCpuAvx2 | kCpuFma});
  return target;
}

}  // namespace flat::cpu

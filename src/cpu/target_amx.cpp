// The amx target: avx512_bf16 with the tile unit (AMX-TILE, AMX-BF16). Every chunk product runs on
// tiles (kernels/gemm_bf16_32x32__amx.h): bf16 operands in one pass, others at the call's precision
// (split into bf16 parts at exact, rounded once at fast); the convolution is avx512_bf16's. Each worker loads
// the tile configuration before its range of work and releases it after (Target::enter_thread).
// Compiled with those flags (CMakeLists.txt) and run only where targets.cpp found the CPU has
// them, the OS saves the tile state and grants this process its use; not the default, only where
// FLAT_ISA=amx asks (and in the tests, which run every target the CPU runs).
#include "cpu/kernels/conv_rows__avx512.h"
#include "cpu/kernels/micro_kernels__amx.h"
#include "cpu/make_target.h"

namespace flat::cpu {

const Target& target_amx() {
  static constexpr Target target = make_target<micro_kernels__amx, conv_avx512::ConvRowsAvx512<true>>(
      {.name = "amx",
       .needs = kCpuAvx512 | kCpuAvx512Bf16 | kCpuAmxBf16,
       // Measured on a Sapphire/Emerald Rapids Xeon: at exact precision, the default, the delta
       // family runs at 0.78-0.96 of avx512's speed (docs/performance.md, "The amx target on an
       // AMX Xeon").
       .only_on_request = "slower than avx512 at exact precision for the delta family on the AMX Xeon measured",
       .tile_products = true,
       .enter_thread = [] { AmxTiles::configure(kGemmTiles); },
       .leave_thread = [] { AmxTiles::release(); }});
  return target;
}

}  // namespace flat::cpu

// The amx target: avx512_bf16 with the tile unit (AMX-TILE, AMX-BF16). Every chunk product with an
// operand of one part runs on tiles (kernels/gemm_bf16_32x32__amx.h): bf16 values in one pass,
// fp32 values split into bf16 parts at exact precision or rounded once at fast; a product of fp32
// operands on both sides at exact runs on avx512's FMA kernel (micro_kernels__amx_tiles.h,
// on_tiles); the convolution is avx512_bf16's. Each worker loads the tile configuration before its
// range of work and releases it after (Target::enter_thread). Compiled with those flags
// (CMakeLists.txt) and run only where targets.cpp found the CPU has them, the OS saves the tile
// state and grants this process its use; there, the default.
#include "cpu/kernels/conv_rows__avx512.h"
#include "cpu/kernels/micro_kernels__amx.h"
#include "cpu/make_target.h"

namespace flat::cpu {

const Target& target_amx() {
  static constexpr Target target = make_target<micro_kernels__amx, conv_avx512::ConvRowsAvx512<true>>(
      {.name = "amx",
       .needs = kCpuAvx512 | kCpuAvx512Bf16 | kCpuAmxBf16,
       // The default where it runs: on a Sapphire/Emerald Rapids Xeon (docs/performance.md, "The amx
       // target as the default", 2026-12-07) forward + backward x1.10-1.51 of avx512's speed at exact
       // precision where a product has an operand of bf16 values (la, RetNet, Mamba-2, gla, the
       // delta rules of scalar gates), the same code and speed as avx512 where none has (kda, gdn2,
       // SLA at exact), and x1.26-1.81 at fast.
       .tile_products = true,
       .enter_thread = [] { AmxTiles::configure(kGemmTiles); },
       .leave_thread = [] { AmxTiles::release(); }});
  return target;
}

}  // namespace flat::cpu

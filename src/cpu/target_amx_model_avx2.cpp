// The amx_model_avx2 target: the amx target's chunk products on the portable model of the tile unit
// (kernels/tiles__model.h), their operands packed by the portable loops, around avx2's vector code,
// so that the tile products and the chunk stages' tile paths (Target::tile_products: the operands'
// bf16 parts, the rows and their factors) are tested on CPUs without AVX-512, where amx_model
// (target_amx_model.cpp, the amx target itself on the model) cannot run; where amx_model runs,
// this one does not (Target::replaced_where). For the tests: compiled
// only with them (FLAT_TILE_MODEL, CMakeLists.txt), never the default, run where
// FLAT_ISA=amx_model_avx2 asks or a test loops over the targets.
#include "cpu/kernels/conv_rows__generic.h"
#include "cpu/kernels/micro_kernels__amx_model_avx2.h"
#include "cpu/tile_model_target.h"

namespace flat::cpu {

const Target& target_amx_model_avx2() {
  static constexpr Target target = make_target<micro_kernels__amx_model_avx2, conv_generic::ConvRowsGeneric>(
      tile_model_info("amx_model_avx2", "every product on the model of AMX tiles, avx2 around them (tests only)",
                      kCpuAvx2 | kCpuFma, kCpuAvx512 | kCpuAvx512Bf16));  // replaced where amx_model runs
  return target;
}

}  // namespace flat::cpu

// The amx_model_avx2 target: the amx target's chunk products on the portable model of the tile unit
// (kernels/tiles__model.h), their operands packed by the portable loops, around avx2's vector code,
// so that the tile products and the chunk stages' tile paths (Target::tile_products: the operands'
// bf16 parts, the rows and their factors) are tested on CPUs without AVX-512, where amx_model
// (target_amx_model.cpp, the amx target itself on the model) cannot run; where amx_model runs,
// this one does not (Target::replaced_where). For the tests: compiled into them alone
// (FLAT_TILE_MODEL_TARGETS, CMakeLists.txt), never into the library; run where a test loops over
// the targets (tests/tested_targets.h).
#include "cpu/kernels/conv_rows__generic.h"
#include "cpu/kernels/micro_kernels__amx_model_avx2.h"
#include "cpu/tile_model_target.h"

namespace flat::cpu {

const Target& target_amx_model_avx2() {
  static constexpr Target target = make_target<micro_kernels__amx_model_avx2, conv_generic::ConvRowsGeneric>(
      tile_model_target("amx_model_avx2", kCpuAvx2 | kCpuFma, kCpuAvx512 | kCpuAvx512Bf16));  // replaced where amx_model runs
  return target;
}

}  // namespace flat::cpu

// The amx_model target: the amx target (target_amx.cpp) with the tile unit replaced by its portable
// model (kernels/tiles__model.h), so that every test runs the amx target's code on any CPU with
// AVX-512 and AVX512-BF16. For the tests: compiled into them alone (FLAT_TILE_MODEL_TARGETS,
// CMakeLists.txt), never into the library; run where a test loops over the targets
// (tests/tested_targets.h).
#include "cpu/kernels/conv_rows__avx512.h"
#include "cpu/kernels/micro_kernels__amx_model.h"
#include "cpu/tile_model_target.h"

namespace flat::cpu {

const Target& target_amx_model() {
  static constexpr Target target = make_target<micro_kernels__amx_model, conv_avx512::ConvRowsAvx512<true>>(
      tile_model_target("amx_model", kCpuAvx512 | kCpuAvx512Bf16));
  return target;
}

}  // namespace flat::cpu

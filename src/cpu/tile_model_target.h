// What a target on the model of the tile unit says of itself (target_amx_model.cpp,
// target_amx_model_avx2.cpp, built into the tests alone: CMakeLists.txt's FLAT_TILE_MODEL_TARGETS):
// never the default, its chunk products on the model's tiles, the tile configuration loaded on the
// model per worker range. Include only in those units
// (internal linkage, a copy per target compiled with its flags).
#pragma once

#include "cpu/kernels/gemm_bf16_32x32__amx.h"
#include "cpu/kernels/tiles__model.h"
#include "cpu/make_target.h"

namespace flat::cpu {
namespace {

constexpr Target tile_model_target(const char* name, CpuFeatures needs, CpuFeatures replaced_where = 0) {
  return {.name = name,
          .needs = needs,
          .replaced_where = replaced_where,
          .only_on_request = "a model of the tile unit, for the tests",
          .tile_products = true,
          .enter_thread = [] { ModelTiles::configure(kGemmTiles); },
          .leave_thread = [] { ModelTiles::release(); }};
}

}  // namespace
}  // namespace flat::cpu

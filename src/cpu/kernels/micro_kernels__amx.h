// The amx target's microkernels, as its table (src/cpu/targets.h): the tile product on the AMX
// instructions (micro_kernels__amx_tiles.h).
#pragma once

#include "cpu/kernels/micro_kernels__amx_tiles.h"
#include "cpu/kernels/tiles__amx.h"

namespace flat::cpu {
namespace {

constexpr MicroKernels micro_kernels__amx = amx_micro_kernels_on<AmxTiles>;

}  // namespace
}  // namespace flat::cpu

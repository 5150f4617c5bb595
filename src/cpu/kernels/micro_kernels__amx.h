// The amx target's microkernels, as its table (src/cpu/targets.h): the tile product on the AMX
// instructions (micro_kernels__amx_tiles.h).
#pragma once

#include "cpu/kernels/micro_kernels__amx_tiles.h"
#include "cpu/kernels/tiles__amx.h"

FLAT_AMX_MICRO_KERNELS(amx, AmxTiles)

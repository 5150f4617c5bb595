// The amx target's microkernels, as its table (micro_kernels.h): the tile product on the AMX
// instructions (micro_kernels__amx_tiles.h), the rest avx512's (avx512_bf16's too).
#pragma once

#include "cpu/kernels/micro_kernels__amx_tiles.h"
#include "cpu/kernels/micro_kernels__avx512.h"
#include "cpu/kernels/tiles__amx.h"

FLAT_AMX_MICRO_KERNELS(amx, AmxTiles, micro_kernels__avx512)

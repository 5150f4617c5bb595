// The amx_model target's microkernels: the amx target's table (micro_kernels__amx.h) with the
// tile product on the portable model of the tile unit (tiles__model.h), for the tests.
#pragma once

#include "cpu/kernels/micro_kernels__amx_tiles.h"
#include "cpu/kernels/micro_kernels__avx512.h"
#include "cpu/kernels/tiles__model.h"

FLAT_AMX_MICRO_KERNELS(amx_model, ModelTiles, micro_kernels__avx512)

// The amx_model_avx2 target's microkernels: the tile product on the portable model of the tile
// unit (tiles__model.h), its operands packed by the portable loops (gemm_bf16_32x32__amx.h without
// AVX512-BF16), the rest avx2's; for the tests on CPUs without AVX-512.
#pragma once

#include "cpu/kernels/micro_kernels__amx_tiles.h"
#include "cpu/kernels/micro_kernels__avx2.h"
#include "cpu/kernels/tiles__model.h"

FLAT_AMX_MICRO_KERNELS(amx_model_avx2, ModelTiles, micro_kernels__avx2)

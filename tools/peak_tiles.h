// The tile unit's bf16 peak loop (AMX-BF16 tdpbf16ps), one of flat bench's ceilings
// (tools/ceilings.cpp). Compiled with the amx target's flags where that target is built
// (CMakeLists.txt: FLAT_TOOL_TILE_PEAK); run only where the amx target runs.
#pragma once

#include <cstdint>

namespace flat::tool {

// FLOPs of one iteration: four tdpbf16ps of 16 x 16 outputs, each the sum of 32 bf16 products
// (a multiply-add counted as 2 FLOPs).
inline constexpr double kTilePeakFlopsPerIteration = 4 * 16 * 16 * 32 * 2.0;

// Runs `iterations` iterations on this thread's tiles (configured and released inside) and
// returns a sum of the accumulators, so that none can be dropped.
float tile_bf16_peak(int64_t iterations);

}  // namespace flat::tool

#include "peak_tiles.h"

#include <cstdint>

#include "cpu/kernels/gemm_bf16_32x32__amx.h"
#include "cpu/kernels/tiles__amx.h"

namespace flat::tool {

// The product kernel's own blocking (kernels/gemm_bf16_32x32__amx.h): four accumulator tiles fed
// by two tiles of A and two of B, so that the peak is the one its register blocking can reach.
// The operands are loaded once and stay in the tiles: no memory in the loop. Every operand is
// 1e-3 (bf16 0x3A83): each tdpbf16ps adds 32 products of 1e-6 to an element, which stays normal
// and far from overflow for any run.
float tile_bf16_peak(int64_t iterations) {
  using cpu::AmxTiles;
  constexpr uint32_t kPair = 0x3A833A83u;  // two bf16 1e-3
  alignas(64) uint32_t operand[cpu::kTileMaxRows * cpu::kTileRowBytes / sizeof(uint32_t)];
  for (uint32_t& word : operand) word = kPair;
  alignas(64) float accumulators[4][cpu::kTileMaxRows * cpu::kTileRowBytes / sizeof(float)];
  AmxTiles::configure(cpu::kGemmTiles);
  AmxTiles::zero<0>();
  AmxTiles::zero<1>();
  AmxTiles::zero<2>();
  AmxTiles::zero<3>();
  AmxTiles::load<4>(operand, cpu::kTileRowBytes);
  AmxTiles::load<5>(operand, cpu::kTileRowBytes);
  AmxTiles::load<6>(operand, cpu::kTileRowBytes);
  AmxTiles::load<7>(operand, cpu::kTileRowBytes);
  for (int64_t it = 0; it < iterations; ++it) {
    AmxTiles::dpbf16ps<0, 4, 6>();
    AmxTiles::dpbf16ps<1, 4, 7>();
    AmxTiles::dpbf16ps<2, 5, 6>();
    AmxTiles::dpbf16ps<3, 5, 7>();
  }
  AmxTiles::store<0>(accumulators[0], cpu::kTileRowBytes);
  AmxTiles::store<1>(accumulators[1], cpu::kTileRowBytes);
  AmxTiles::store<2>(accumulators[2], cpu::kTileRowBytes);
  AmxTiles::store<3>(accumulators[3], cpu::kTileRowBytes);
  AmxTiles::release();
  return accumulators[0][0] + accumulators[1][0] + accumulators[2][0] + accumulators[3][0];
}

}  // namespace flat::tool

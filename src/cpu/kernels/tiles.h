// The tile unit (Intel AMX) as the kernels use it: a configuration and the six operations, behind
// one interface with two implementations,
//
//   tiles__amx.h    AmxTiles: the AMX instructions (the amx target, compiled with -mamx-tile
//                   -mamx-bf16; runs only where targets.cpp found the CPU and the OS allow them),
//   tiles__model.h  ModelTiles: portable C++ with the instructions' documented semantics (the
//                   tests, on every machine; never picked for speed),
//
// so that a kernel written once over a `Tiles` parameter (gemm_bf16_32x32__amx.h) is built and
// tested everywhere and runs on the hardware where there is one. The interface, every function
// static, tile numbers T, C, A, B compile-time constants in [0, 8) (the instructions encode them):
//
//   configure(const TileConfig&)    ldtilecfg: shapes every tile, zeroes them all
//   release()                       tilerelease: back to the initial state
//   zero<T>()                       tilezero
//   load<T>(base, stride_bytes)     tileloadd: rows[T] rows of colsb[T] bytes, row r at base + r * stride
//   store<T>(base, stride_bytes)    tilestored: the same rows out
//   dpbf16ps<C, A, B>()             tdpbf16ps: C[m, n] += sum over pairs p of A's pair (m, p) with
//                                   B's pair (p, n), bf16 pairs in 32-bit words
//
// The caller owns the configuration (oneDNN's brgemm does the same): the target loads it once per
// worker range (Target::enter_thread) and releases it after; a kernel assumes the one its table
// was built for (kGemmTiles in gemm_bf16_32x32__amx.h).
#pragma once

#include <cstdint>

namespace flat::cpu {

constexpr int kTileCount = 8;     // tmm0..tmm7
constexpr int kTileMaxRows = 16;  // rows of a tile
constexpr int kTileRowBytes = 64; // bytes of a row: 16 fp32, 32 bf16 (16 pairs)

// The 64-byte operand of ldtilecfg (palette 1): each tile's rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile t (entries past kTileCount reserved, zero)
  uint8_t rows[16] = {};    // rows of tile t
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

}  // namespace flat::cpu

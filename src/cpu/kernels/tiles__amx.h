// The tile interface (tiles.h) on the AMX instructions. Include only in translation units
// compiled with -mamx-tile -mamx-bf16 (the amx target); run only where targets.cpp found AMX-TILE
// and AMX-BF16, the OS saving their state (XCR0) and its permission granted (arch_prctl).
//
// GCC's tile intrinsics are macros that paste the tile number into the instruction's text, so it
// must be a literal: each operation is specialised per literal tile number below, and only the
// (C, A, B) triples the kernels use exist as dpbf16ps (a fifth is a compile error, not a slow path).
// Their tileloadd also declares no memory input: the compiler could keep the rows a kernel packed
// in registers, or drop them as never read. An empty asm that takes the address and clobbers
// memory goes before each load, so every store before it is in memory when the tile reads it.
#pragma once

#include <immintrin.h>

#include <cstddef>

#include "cpu/kernels/tiles.h"

namespace flat::cpu {
namespace {

struct AmxTiles {
  static void configure(const TileConfig& config) { _tile_loadconfig(&config); }
  static void release() { _tile_release(); }
  template <int T>
  static void zero();
  template <int T>
  static void load(const void* base, size_t stride_bytes);
  template <int T>
  static void store(void* base, size_t stride_bytes);
  template <int C, int A, int B>
  static void dpbf16ps();
};

#define FLAT_AMX_TILE(t)                                                                  \
  template <>                                                                             \
  inline void AmxTiles::zero<t>() {                                                       \
    _tile_zero(t);                                                                        \
  }                                                                                       \
  template <>                                                                             \
  inline void AmxTiles::load<t>(const void* base, size_t stride_bytes) {                  \
    __asm__ volatile("" : : "r"(base) : "memory");                                        \
    _tile_loadd(t, base, stride_bytes);                                                   \
  }                                                                                       \
  template <>                                                                             \
  inline void AmxTiles::store<t>(void* base, size_t stride_bytes) {                       \
    _tile_stored(t, base, stride_bytes);                                                  \
  }
FLAT_AMX_TILE(0)
FLAT_AMX_TILE(1)
FLAT_AMX_TILE(2)
FLAT_AMX_TILE(3)
FLAT_AMX_TILE(4)
FLAT_AMX_TILE(5)
FLAT_AMX_TILE(6)
FLAT_AMX_TILE(7)
#undef FLAT_AMX_TILE

#define FLAT_AMX_DPBF16PS(c, a, b)           \
  template <>                                \
  inline void AmxTiles::dpbf16ps<c, a, b>() { \
    _tile_dpbf16ps(c, a, b);                 \
  }
// gemm_bf16_32x32__amx's four: C tiles 0-3 from A tiles 4, 5 and B tiles 6, 7.
FLAT_AMX_DPBF16PS(0, 4, 6)
FLAT_AMX_DPBF16PS(1, 4, 7)
FLAT_AMX_DPBF16PS(2, 5, 6)
FLAT_AMX_DPBF16PS(3, 5, 7)
#undef FLAT_AMX_DPBF16PS

}  // namespace
}  // namespace flat::cpu

// The tile interface (tiles.h) in portable C++: a model of the AMX tile unit with the semantics
// Intel's SDM documents, so that every kernel written over `Tiles` runs and is tested on any CPU.
// For the tests and the oracle's side, never picked for speed.
//
// State per thread, as the hardware's: 8 tiles of 16 rows x 64 bytes and the configuration, one
// per thread for the whole process (src/cpu/tile_model.cpp), as the tile registers are: a target's
// unit configures it in enter_thread and the kernels of any other unit (the bench's unfused
// baseline on the same target) see that configuration.
// What the model checks where the hardware would fault (#UD, #GP), it throws std::logic_error for:
// an operation before configure, a tile shape past 16 rows or 64 bytes, palette other than 1,
// and tdpbf16ps's shape rules (C.rows = A.rows, C.colsb = B.colsb, A.colsb / 4 = B.rows, all
// multiples of 4 bytes).
//
// tdpbf16ps, per the SDM's operation (DAZ = FTZ = 1, round to nearest even, MXCSR ignored): for
// each row m of C, two fp32 accumulators per column n start at zero; for each pair p in order,
// the even one takes fma(A(m, 2p), B(p, 2n)) and the odd one fma(A(m, 2p+1), B(p, 2n+1)); then
// C(m, n) += (even + odd). bf16 inputs that are denormal read as zero, as does a denormal C;
// every denormal result is flushed to zero (its sign kept).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "bf16.h"
#include "cpu/kernels/tiles.h"

namespace flat::cpu {

struct TileModelState {
  TileConfig config;
  bool configured = false;
  alignas(64) uint8_t tiles[kTileCount][kTileMaxRows * kTileRowBytes] = {};
};
// This thread's (src/cpu/tile_model.cpp, built with the tests).
TileModelState& tile_model_state();

namespace {

class ModelTiles {
 public:
  static void configure(const TileConfig& config) {
    if (config.palette != 1)
      fail("ldtilecfg: palette " + std::to_string(config.palette) + ", the model has palette 1 only");
    for (int t = 0; t < kTileCount; ++t)
      if (config.rows[t] > kTileMaxRows || config.colsb[t] > kTileRowBytes)
        fail("ldtilecfg: tile " + std::to_string(t) + " of " + std::to_string(config.rows[t]) + " rows x " +
             std::to_string(config.colsb[t]) + " bytes, past 16 x 64");
    TileModelState& s = tile_model_state();
    s.config = config;
    s.configured = true;
    std::memset(s.tiles, 0, sizeof(s.tiles));
  }

  static void release() {
    TileModelState& s = tile_model_state();
    s.configured = false;
    std::memset(s.tiles, 0, sizeof(s.tiles));
  }

  template <int T>
  static void zero() {
    std::memset(tile<T>("tilezero"), 0, kTileBytes);
  }

  template <int T>
  static void load(const void* base, size_t stride_bytes) {
    uint8_t* dst = tile<T>("tileloadd");
    const TileModelState& s = tile_model_state();
    std::memset(dst, 0, kTileBytes);  // rows and bytes past the shape read as zero
    for (int r = 0; r < s.config.rows[T]; ++r)
      std::memcpy(dst + r * kTileRowBytes, static_cast<const uint8_t*>(base) + r * stride_bytes, s.config.colsb[T]);
  }

  template <int T>
  static void store(void* base, size_t stride_bytes) {
    const uint8_t* src = tile<T>("tilestored");
    const TileModelState& s = tile_model_state();
    for (int r = 0; r < s.config.rows[T]; ++r)
      std::memcpy(static_cast<uint8_t*>(base) + r * stride_bytes, src + r * kTileRowBytes, s.config.colsb[T]);
  }

  template <int C, int A, int B>
  static void dpbf16ps() {
    static_assert(C != A && C != B && A != B, "tdpbf16ps: three distinct tiles");
    uint8_t* c = tile<C>("tdpbf16ps");
    const uint8_t* a = tile<A>("tdpbf16ps");
    const uint8_t* b = tile<B>("tdpbf16ps");
    const TileConfig& cfg = tile_model_state().config;
    if (cfg.rows[C] != cfg.rows[A] || cfg.colsb[C] != cfg.colsb[B] || cfg.colsb[A] != 4 * cfg.rows[B] ||
        cfg.colsb[A] % 4 || cfg.colsb[C] % 4)
      fail("tdpbf16ps: shapes C " + shape(C) + ", A " + shape(A) + ", B " + shape(B) +
           " (C.rows = A.rows, C.colsb = B.colsb, A.colsb = 4 B.rows)");
    const int pairs = cfg.colsb[A] / 4, columns = cfg.colsb[C] / 4;
    // B's elements as fp32, denormals read as zero, [pair][even, odd][column], and the rows'
    // accumulators side by side: the loops run 16 columns wide (the model is compiled with its
    // target's vector flags) over independent rows, not along one row's chain of dependent fmas.
    constexpr int kColumns = kTileRowBytes / 4;
    float bv[kTileMaxRows][2][kColumns] = {};
    for (int p = 0; p < pairs; ++p)
      for (int n = 0; n < columns; ++n) {
        bv[p][0][n] = bf16_at(b, p, 2 * n);
        bv[p][1][n] = bf16_at(b, p, 2 * n + 1);
      }
    const int rows = cfg.rows[C];
    float even[kTileMaxRows][kColumns] = {}, odd[kTileMaxRows][kColumns] = {};
    for (int p = 0; p < pairs; ++p)
      for (int m = 0; m < rows; ++m) {
        const float a0 = bf16_at(a, m, 2 * p), a1 = bf16_at(a, m, 2 * p + 1);
        for (int n = 0; n < kColumns; ++n) {
          even[m][n] = flush(std::fma(a0, bv[p][0][n], even[m][n]));
          odd[m][n] = flush(std::fma(a1, bv[p][1][n], odd[m][n]));
        }
      }
    for (int m = 0; m < rows; ++m) {
      float row[kColumns];
      std::memcpy(row, c + m * kTileRowBytes, kTileRowBytes);
      for (int n = 0; n < columns; ++n) row[n] = flush(flush(row[n]) + flush(even[m][n] + odd[m][n]));
      std::memcpy(c + m * kTileRowBytes, row, kTileRowBytes);
    }
  }

 private:
  static constexpr int kTileBytes = kTileMaxRows * kTileRowBytes;

  [[noreturn]] static void fail(const std::string& what) { throw std::logic_error("tile model: " + what); }

  static std::string shape(int t) {
    const TileConfig& cfg = tile_model_state().config;
    return std::to_string(cfg.rows[t]) + "x" + std::to_string(cfg.colsb[t]) + "B";
  }

  template <int T>
  static uint8_t* tile(const char* instruction) {
    static_assert(T >= 0 && T < kTileCount, "tiles tmm0..tmm7");
    TileModelState& s = tile_model_state();
    if (!s.configured) fail(std::string(instruction) + " before ldtilecfg");
    return s.tiles[T];
  }

  // Denormals to zero of the same sign (DAZ on inputs, FTZ on results).
  static float flush(float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    return std::bit_cast<float>((bits & 0x7f800000u) == 0 ? bits & 0x80000000u : bits);
  }

  // The bf16 at element e of row r (a bf16 in the upper half of an fp32 word), denormals as zero.
  static float bf16_at(const uint8_t* tile, int r, int e) {
    uint16_t h;
    std::memcpy(&h, tile + r * kTileRowBytes + 2 * e, 2);
    return flush(bf16_to_f32(h));
  }
};

}  // namespace
}  // namespace flat::cpu

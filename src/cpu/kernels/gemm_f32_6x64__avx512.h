// C[m, n] (+)= A[m, k] B[k, n] in fp32 on AVX-512 with FMA: a register-blocked tile of 6 rows by
// 64 columns (gemm_f32_tile__avx512<MR, NV>), and the loop over tiles that covers a product
// (gemm_f32_6x64__avx512). A(i, p) = a[i*a_rs + p*a_cs] (row- or column-major), B row-major.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <utility>

#include "cpu/kernels/lanes__avx512.h"
#include "cpu/kernels/product.h"

namespace flat::cpu {
namespace {

constexpr int kTileRows = 6;     // MR
constexpr int kTileVectors = 4;  // NR = 16 * kTileVectors = 64 columns


// The MR x NV accumulators of a tile of C in zmm registers: loaded from C (accumulate) or zero,
// and stored back, the last column vector masked by `tail` for widths that are not multiples of
// 16. Inlined into the tile kernels, so the array lives in registers.
template <int MR, int NV>
struct TileAccumulators {
  __m512 acc[MR][NV];
  __mmask16 mask[NV];

  [[gnu::always_inline]] TileAccumulators(const float* c, int ldc, __mmask16 tail, bool accumulate) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) mask[v] = v == NV - 1 ? tail : __mmask16(0xffff);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v)
        acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(mask[v], c + size_t(i) * ldc + 16 * v) : _mm512_setzero_ps();
  }
  // The k loop: per step p, the NV vectors of B's row (load_b(p, v)), and for each row i of the
  // tile its operand broadcast once (broadcast(p, i)) and multiplied into all NV accumulators:
  // acc[i][v] = multiply_add(acc[i][v], a_i, b_v).
  template <class LoadB, class Broadcast, class MultiplyAdd>
  [[gnu::always_inline]] void run(int steps, LoadB&& load_b, Broadcast&& broadcast, MultiplyAdd&& multiply_add) {
    for (int p = 0; p < steps; ++p) {
      decltype(load_b(p, 0)) b[NV];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) b[v] = load_b(p, v);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const auto ai = broadcast(p, i);
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[i][v] = multiply_add(acc[i][v], ai, b[v]);
      }
    }
  }
  [[gnu::always_inline]] void store(float* c, int ldc) const {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(c + size_t(i) * ldc + 16 * v, mask[v], acc[i][v]);
  }
};

// C[MR, 16*NV] (+)= A[MR, k] B[k, 16*NV]. The MR x NV accumulators stay in zmm registers for the
// whole k loop: at 6 x 4 that is 24 accumulators + 4 B vectors + 1 broadcast of the 32 registers,
// and 24 independent FMAs cover the 2 FMA ports x 4-cycle latency = 8 needed in flight. Per k
// step: 4 B loads and 6 broadcasts feed 24 FMAs (12 cycles of FMA for 10 loads, well inside the
// 2 loads per cycle); measured 5-10% ahead of 8 x 2 on the chunk products.
template <int MR, int NV>
void gemm_f32_tile__avx512(int k, const float* a, int a_rs, int a_cs, const float* b, int ldb, float* c, int ldc,
                           __mmask16 tail, bool accumulate) {
  TileAccumulators<MR, NV> t(c, ldc, tail, accumulate);
  t.run(
      k, [&](int p, int v) { return _mm512_maskz_loadu_ps(t.mask[v], b + size_t(p) * ldb + 16 * v); },
      [&](int p, int i) { return _mm512_set1_ps(a[size_t(p) * a_cs + size_t(i) * a_rs]); },
      [](__m512 acc, __m512 ai, __m512 bv) { return _mm512_fmadd_ps(ai, bv, acc); });
  t.store(c, ldc);
}

using Tile = void (*)(int, const float*, int, int, const float*, int, float*, int, __mmask16, bool);

template <int... MR>
constexpr auto make_tiles(std::integer_sequence<int, MR...>) {
  struct Table {
    Tile t[sizeof...(MR)][kTileVectors];
  };
  return Table{{{gemm_f32_tile__avx512<MR + 1, 1>, gemm_f32_tile__avx512<MR + 1, 2>, gemm_f32_tile__avx512<MR + 1, 3>,
                  gemm_f32_tile__avx512<MR + 1, 4>}...}};
}
constexpr auto kTiles = make_tiles(std::make_integer_sequence<int, kTileRows>{});

// C[m, n] (+)= A B tile by tile.
// Tiles in zero regions of A (per d.triangle) contribute nothing and are skipped along k; tiles
// of C entirely above the diagonal are skipped for c_lower.
inline void gemm_f32_6x64__avx512(const GemmDesc& d, int m, int n, int k, const float* a, int lda, const float* b,
                                  int ldb, float* c, int ldc) {
  const auto [a_rs, a_cs] = a_strides(d, lda);
  const Triangle tri = d.triangle;
  for (int i0 = 0; i0 < m; i0 += kTileRows) {
    const int mr = m - i0 < kTileRows ? m - i0 : kTileRows;
    int p0 = 0, p1 = k;
    if (tri == Triangle::a_lower && i0 + mr < k) p1 = i0 + mr;
    if (tri == Triangle::a_upper) p0 = i0 < k ? i0 : k;
    const int n_end = tri == Triangle::c_lower && i0 + mr < n ? i0 + mr : n;
    for (int j0 = 0; j0 < n_end; j0 += 16 * kTileVectors) {
      const int nr = n_end - j0 < 16 * kTileVectors ? n_end - j0 : 16 * kTileVectors;
      const int vectors = (nr + 15) / 16;
      const __mmask16 tail = first_lanes(nr - 16 * (vectors - 1));
      kTiles.t[mr - 1][vectors - 1](p1 - p0, a + size_t(i0) * a_rs + size_t(p0) * a_cs, a_rs, a_cs,
                                    b + size_t(p0) * ldb + j0, ldb, c + size_t(i0) * ldc + j0, ldc, tail, d.accumulate);
    }
  }
}

}  // namespace
}  // namespace flat::cpu

// C[m, n] (+)= A[m, k] B[k, n] in fp32 on AVX2 with FMA: a register-blocked tile of 6 rows by 16
// columns (gemm_f32_tile__avx2<MR, NV, Tail>, BLIS' Haswell shape), and the loop over tiles that
// covers a product (gemm_f32_6x16__avx2). A(i, p) = a[i*a_rs + p*a_cs] (row- or column-major),
// B row-major. Include only in translation units compiled with -mavx2 -mfma.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <utility>

#include "cpu/kernels/lanes__avx2.h"
#include "cpu/kernels/product.h"

namespace flat::cpu {
namespace {

constexpr int kTileRowsAvx2 = 6;     // MR
constexpr int kTileVectorsAvx2 = 2;  // NR = 8 * kTileVectorsAvx2 = 16 columns

// C[MR, 8*NV] (+)= A[MR, k] B[k, 8*NV], the last column vector masked by `tail` when Tail (widths
// that are not multiples of 8; vmaskmovps only there, it is slower than a plain load or store).
// The MR x NV accumulators stay in ymm registers for the whole k loop: at 6 x 2 that is 12
// accumulators + 2 B vectors + 1 broadcast of the 16 registers. Haswell to Raptor Lake and Zen 2/3
// issue 2 FMAs per cycle at 4-5 cycles latency, so 8-10 independent FMAs must be in flight to
// keep both ports busy; 12 cover that. Per k step: 2 B loads and 6 broadcasts (loads, no shuffle
// uop) feed 12 FMAs: 6 cycles of FMA for 8 loads, inside the 2 loads per cycle.
template <int MR, int NV, bool Tail>
void gemm_f32_tile__avx2(int k, const float* a, int a_rs, int a_cs, const float* b, int ldb, float* c, int ldc,
                         __m256i tail, bool accumulate) {
  const auto load = [&](const float* p, int v) {
    return Tail && v == NV - 1 ? _mm256_maskload_ps(p, tail) : _mm256_loadu_ps(p);
  };
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[i][v] = accumulate ? load(c + size_t(i) * ldc + 8 * v, v) : _mm256_setzero_ps();
  for (int p = 0; p < k; ++p) {
    __m256 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = load(b + size_t(p) * ldb + 8 * v, v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + size_t(p) * a_cs + size_t(i) * a_rs);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      float* out = c + size_t(i) * ldc + 8 * v;
      if (Tail && v == NV - 1)
        _mm256_maskstore_ps(out, tail, acc[i][v]);
      else
        _mm256_storeu_ps(out, acc[i][v]);
    }
}

using TileAvx2 = void (*)(int, const float*, int, int, const float*, int, float*, int, __m256i, bool);

// Per row count (1..6), vector count (1, 2) and masked last vector or not.
template <int... MR>
constexpr auto make_tiles_avx2(std::integer_sequence<int, MR...>) {
  struct Table {
    TileAvx2 t[sizeof...(MR)][kTileVectorsAvx2][2];
  };
  return Table{{{{gemm_f32_tile__avx2<MR + 1, 1, false>, gemm_f32_tile__avx2<MR + 1, 1, true>},
                 {gemm_f32_tile__avx2<MR + 1, 2, false>, gemm_f32_tile__avx2<MR + 1, 2, true>}}...}};
}
constexpr auto kTilesAvx2 = make_tiles_avx2(std::make_integer_sequence<int, kTileRowsAvx2>{});

// Above this many bytes of B (k x n floats) the tiles walk B's column panels outermost, each panel
// ([k, 16], 32 KiB at k = 512) reused from L1 by every row strip of A, A from L2; up to it the row
// strips of A go outermost, each reused from L1 across the panels, B from L2. A B of 512 KiB (sla's
// [256, 512] states) streamed again for every strip of A comes back from L3 on a core of 512 KiB
// L2 (AMD Zen 3; Intel's AVX2 cores have 256 KiB). On an EPYC Zen 3, the two walks alternated in
// one process (2026-12-06), panels first against strips first: x1.07 at 64 x 256 x 512 (m x n x
// k), x1.19 at 64 x 512 x 256 (B 512 KiB); x0.95-1.02 at B of 256 KiB; x0.98 at the K = 128
// products (B of 32-64 KiB, both at 94-97% of the FMA peak) and x0.90 at the state update of
// 256 x 512 x 64 (A by columns, B 128 KiB).
constexpr size_t kStripsFirstBytesAvx2 = size_t(256) << 10;

// C[m, n] (+)= A B tile by tile.
// Tiles in zero regions of A (per d.triangle) contribute nothing and are skipped along k; tiles
// of C entirely above the diagonal are skipped for c_lower. Either walk runs the same tiles on the
// same operands, so the results do not depend on it.
inline void gemm_f32_6x16__avx2(const GemmDesc& d, int m, int n, int k, const float* a, int lda, const float* b,
                                int ldb, float* c, int ldc) {
  const auto [a_rs, a_cs] = a_strides(d, lda);
  const Triangle tri = d.triangle;
  constexpr int kWidth = 8 * kTileVectorsAvx2;
  const auto tile = [&](int i0, int j0) {
    const int mr = m - i0 < kTileRowsAvx2 ? m - i0 : kTileRowsAvx2;
    const int n_end = tri == Triangle::c_lower && i0 + mr < n ? i0 + mr : n;
    if (j0 >= n_end) return;
    int p0 = 0, p1 = k;
    if (tri == Triangle::a_lower && i0 + mr < k) p1 = i0 + mr;
    if (tri == Triangle::a_upper) p0 = i0 < k ? i0 : k;
    const int nr = n_end - j0 < kWidth ? n_end - j0 : kWidth;
    const int vectors = (nr + 7) / 8;
    const int last = nr - 8 * (vectors - 1);
    kTilesAvx2.t[mr - 1][vectors - 1][last < 8](p1 - p0, a + size_t(i0) * a_rs + size_t(p0) * a_cs, a_rs, a_cs,
                                                b + size_t(p0) * ldb + j0, ldb, c + size_t(i0) * ldc + j0, ldc,
                                                first_lanes_avx2(last), d.accumulate);
  };
  if (size_t(k) * size_t(n) * sizeof(float) > kStripsFirstBytesAvx2) {
    for (int j0 = 0; j0 < n; j0 += kWidth)
      for (int i0 = 0; i0 < m; i0 += kTileRowsAvx2) tile(i0, j0);
  } else {
    for (int i0 = 0; i0 < m; i0 += kTileRowsAvx2)
      for (int j0 = 0; j0 < n; j0 += kWidth) tile(i0, j0);
  }
}

}  // namespace
}  // namespace flat::cpu

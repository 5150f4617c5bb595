// C[m, n] (+)= A B on the bf16 dot-product units (AVX512-BF16, vdpbf16ps), for the chunk products
// whose operands are bf16 values (the scores q k^T of bf16 queries and keys where the gate is
// scalar or absent; linear attention's state update k^T v): the packing
// to bf16 loses nothing and vdpbf16ps accumulates the exact products in fp32. Every other product
// (of decayed rows, scores, states, gradients) keeps fp32 operands on the FMA microkernels:
// rounding those to bf16 breaks the bf16 tolerance wherever a result cancels (measured: a
// single-token gdn2 gradient, 2.2 relative error in dS_00 = <dy, r>, 4.9 in dq). Picked on CPUs
// where vdpbf16ps outruns the FMA ports (src/cpu/targets.cpp).
//
// vdpbf16ps multiplies pairs: each 32-bit lane of its operands holds two bf16 values, two
// consecutive k, and the lane's fp32 accumulator gains both products. So B is packed as
// [k/2, n] words (a pair of rows interleaved column by column) and A as words of two consecutive
// k of one row, broadcast one word per row of the tile. Packing happens per panel of kPanelDepth
// k by kBlockRows rows of A and 64 columns of B, in stack buffers that stay in L1 (24 + 16 KiB).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cpu/kernels/gemm_f32_6x64__avx512.h"
#include "cpu/kernels/lanes__avx512.h"
#include "cpu/kernels/pack_bf16_pairs__avx512bf16.h"
#include "cpu/kernels/product.h"

namespace flat::cpu {
namespace {

// C[MR, 16*NV] (+)= A[MR, 2*pairs] B[2*pairs, 16*NV] with A's pair p of row i at
// a[i*a_rs + p*a_ps] and B's pair row p at b + p * kStripColumns. The same register blocking as
// gemm_f32_tile__avx512: 24 accumulators + 4 B vectors + 1 broadcast; per pair step 4 B loads and
// 6 broadcasts feed 24 vdpbf16ps (each 32 multiply-adds).
template <int MR, int NV>
void gemm_bf16_tile__avx512bf16(int pairs, const uint32_t* a, int a_rs, int a_ps, const uint32_t* b, float* c, int ldc,
                                __mmask16 tail, bool accumulate) {
  TileAccumulators<MR, NV> t(c, ldc, tail, accumulate);
  t.run(
      pairs,
      [&](int p, int v) {
        return reinterpret_cast<__m512bh>(_mm512_load_si512(b + size_t(p) * kStripColumns + 16 * v));
      },
      [&](int p, int i) {
        return reinterpret_cast<__m512bh>(_mm512_set1_epi32(int(a[size_t(p) * a_ps + size_t(i) * a_rs])));
      },
      [](__m512 acc, __m512bh ai, __m512bh bv) { return _mm512_dpbf16_ps(acc, ai, bv); });
  t.store(c, ldc);
}

using PairTile = void (*)(int, const uint32_t*, int, int, const uint32_t*, float*, int, __mmask16, bool);

template <int... MR>
constexpr auto make_pair_tiles(std::integer_sequence<int, MR...>) {
  struct Table {
    PairTile t[sizeof...(MR)][kTileVectors];
  };
  return Table{{{gemm_bf16_tile__avx512bf16<MR + 1, 1>, gemm_bf16_tile__avx512bf16<MR + 1, 2>,
                 gemm_bf16_tile__avx512bf16<MR + 1, 3>, gemm_bf16_tile__avx512bf16<MR + 1, 4>}...}};
}
constexpr auto kPairTiles = make_pair_tiles(std::make_integer_sequence<int, kTileRows>{});
static_assert(kStripColumns == 16 * kTileVectors && kBlockRows % kTileRows == 0, "packs of whole tiles");

// C[m, n] (+)= A B as gemm_f32_6x64__avx512 (the same operands, layouts and triangles) with A and
// B rounded to bf16 (to nearest even; exact for Operands::bf16_values). Loops: panels of k, blocks
// of rows of A, strips of columns of B, tiles. A tile reads only the pairs of its nonzero range of
// A (per d.triangle), rounded out to whole pairs: the extra element is a stored zero of the
// triangle.
inline void gemm_bf16_6x64__avx512bf16(const GemmDesc& d, int m, int n, int k, const float* a, int lda,
                                       const float* b, int ldb, float* c, int ldc) {
  const auto [a_rs, a_cs] = a_strides(d, lda);
  const Triangle tri = d.triangle;
  alignas(64) uint32_t a_pack[kBlockRows * kPanelPairs];
  alignas(64) uint32_t b_pack[kPanelPairs * kStripColumns];
  for (int k0 = 0; k0 < k || k0 == 0; k0 += kPanelDepth) {
    const int depth = k - k0 < kPanelDepth ? k - k0 : kPanelDepth;
    const bool into = d.accumulate || k0 > 0;
    for (int r0 = 0; r0 < m; r0 += kBlockRows) {
      const int rows = m - r0 < kBlockRows ? m - r0 : kBlockRows;
      const PackedA pa = pack_bf16_pairs_a(rows, depth, a + size_t(r0) * a_rs + size_t(k0) * a_cs, a_rs, a_cs, a_pack);
      const int block_end = tri == Triangle::c_lower && r0 + rows < n ? r0 + rows : n;
      for (int j0 = 0; j0 < block_end; j0 += kStripColumns) {
        const int cols = block_end - j0 < kStripColumns ? block_end - j0 : kStripColumns;
        pack_bf16_pairs_b(depth, cols, b + size_t(k0) * ldb + j0, ldb, b_pack);
        for (int i0 = r0; i0 < r0 + rows; i0 += kTileRows) {
          const int mr = r0 + rows - i0 < kTileRows ? r0 + rows - i0 : kTileRows;
          const int n_end = tri == Triangle::c_lower && i0 + mr < n ? i0 + mr : n;
          if (j0 >= n_end) continue;
          // The tile's nonzero k range [p0, p1) within this panel, in pairs [q0, q1).
          int p0 = 0, p1 = k;
          if (tri == Triangle::a_lower && i0 + mr < k) p1 = i0 + mr;
          if (tri == Triangle::a_upper) p0 = i0 < k ? i0 : k;
          p0 = p0 > k0 ? p0 - k0 : 0;
          p1 = p1 < k0 + depth ? p1 - k0 : depth;
          const int q0 = p0 / 2, q1 = p1 > p0 ? (p1 + 1) / 2 : q0;
          if (q1 == q0 && into) continue;
          const int nr = n_end - j0 < kStripColumns ? n_end - j0 : kStripColumns;
          const int vectors = (nr + 15) / 16;
          kPairTiles.t[mr - 1][vectors - 1](q1 - q0, a_pack + size_t(i0 - r0) * pa.row_stride + size_t(q0) * pa.pair_stride,
                                            pa.row_stride, pa.pair_stride, b_pack + size_t(q0) * kStripColumns,
                                            c + size_t(i0) * ldc + j0, ldc, first_lanes(nr - 16 * (vectors - 1)), into);
        }
      }
    }
  }
}

}  // namespace
}  // namespace flat::cpu

// Packing for the bf16 dot-product microkernel (gemm_bf16_6x64__avx512bf16.h): fp32 operands
// rounded to bf16 (to nearest even; exact for bf16 values) and laid out in the pairs vdpbf16ps
// multiplies. A packed operand is read by every tile of its panel. Include only in translation
// units compiled with AVX-512 and AVX512-BF16.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu/kernels/lanes__avx512.h"

namespace flat::cpu {
namespace {

constexpr int kPanelDepth = 128;                  // KC: k per packed panel, even
constexpr int kPanelPairs = kPanelDepth / 2;      // words per packed row of A or column of B
constexpr int kStripColumns = 64;                 // NR: columns of a B strip, one tile wide
constexpr int kBlockRows = 96;                    // MC: rows of A packed at once, 16 tiles of 6

// 16 words (x0[j], x1[j]) from two rows of 16 floats, rounded to bf16: x0 in the low half.
inline __m512i interleave_pairs(__m512 x0, __m512 x1) {
  const __m512i halves = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x1, x0));  // x0 low, x1 high
  const __m512i index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(index, halves);
}

// A packed panel: rows [0, rows) and k [0, depth) of A (A(i, p) = a[i*a_rs + p*a_cs]), pairs past
// `depth` zero. Row-major A (a_cs = 1) packs row by row ([rows, kPanelPairs] words: its pairs are
// adjacent floats); column-major A (a_rs = 1) packs pair row by pair row ([kPanelPairs,
// kBlockRows] words, 16 rows per vector). Returns the word strides (row, pair).
struct PackedA {
  int row_stride, pair_stride;
};
inline PackedA pack_bf16_pairs_a(int rows, int depth, const float* a, int a_rs, int a_cs, uint32_t* out) {
  const int pairs = (depth + 1) / 2;
  if (a_cs == 1) {
    for (int i = 0; i < rows; ++i) {
      const float* row = a + size_t(i) * a_rs;
      for (int p = 0; p < depth; p += 32) {
        const __mmask16 lo = first_lanes(depth - p), hi = first_lanes(depth - p - 16 < 0 ? 0 : depth - p - 16);
        const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, row + p + 16), _mm512_maskz_loadu_ps(lo, row + p));
        _mm512_mask_storeu_epi32(out + size_t(i) * kPanelPairs + p / 2, first_lanes(pairs - p / 2),
                                 reinterpret_cast<__m512i>(both));
      }
    }
    return {kPanelPairs, 1};
  }
  for (int p = 0; p < pairs; ++p) {
    const float* row0 = a + size_t(2 * p) * a_cs;
    const bool second = 2 * p + 1 < depth;
    for (int i = 0; i < rows; i += 16) {
      const __mmask16 m = first_lanes(rows - i);
      const __m512 x0 = _mm512_maskz_loadu_ps(m, row0 + i);
      const __m512 x1 = second ? _mm512_maskz_loadu_ps(m, row0 + a_cs + i) : _mm512_setzero_ps();
      _mm512_mask_storeu_epi32(out + size_t(p) * kBlockRows + i, m, interleave_pairs(x0, x1));
    }
  }
  return {1, kBlockRows};
}

// A packed strip of B: k [0, depth) of columns [0, cols) (cols <= kStripColumns), as
// [kPanelPairs, kStripColumns] words; pairs past `depth` and columns past `cols` zero.
inline void pack_bf16_pairs_b(int depth, int cols, const float* b, int ldb, uint32_t* out) {
  for (int p = 0; p < (depth + 1) / 2; ++p) {
    const float* row0 = b + size_t(2 * p) * ldb;
    const bool second = 2 * p + 1 < depth;
    for (int j = 0; j < kStripColumns; j += 16) {
      const __mmask16 m = first_lanes(cols - j < 0 ? 0 : cols - j);
      const __m512 x0 = _mm512_maskz_loadu_ps(m, row0 + j);
      const __m512 x1 = second ? _mm512_maskz_loadu_ps(m, row0 + ldb + j) : _mm512_setzero_ps();
      _mm512_store_si512(out + size_t(p) * kStripColumns + j, interleave_pairs(x0, x1));
    }
  }
}


}  // namespace
}  // namespace flat::cpu

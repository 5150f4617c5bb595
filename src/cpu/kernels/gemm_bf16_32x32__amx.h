// C[m, n] (+)= A B on the tile unit (tdpbf16ps): the amx target's chunk products with an operand of
// one part (micro_kernels__amx_tiles.h, on_tiles), and any product the tests give it. An operand
// that holds bf16 values (GemmDesc::a_values, b_values: bf16 q, k, v as loaded) is packed without
// loss as one part, from its fp32 copy or, where the stages keep it as bf16 (Bf16Rows), from its
// bits, and the tiles sum exact products in fp32 (in the order tiles__model.h gives).
// Any other operand is split into bf16 parts x = x0 + x1 (+ x2), each the rounding of what the
// parts before it leave, and the product is the passes A_i B_j with i + j < the parts of either
// over the parts each operand has, the smallest first (docs/algorithm.md, "Precision"):
// Precision::exact splits into three parts (six passes), or two (three passes) where the call's
// outputs are bf16; Precision::fast rounds once. An operand of one part makes the passes with its
// missing parts (zero) none: three passes instead of six.
// Written once over `Tiles`: AmxTiles in the amx target, ModelTiles in the tests (tiles.h).
//
// Register blocking: a 32 x 32 block of C in four accumulator tiles (0-3, 16 x 16 fp32 each), fed
// per 32 k by two tiles of A (4, 5: 16 rows x 16 pairs) and two of B (6, 7: 16 pairs x 16
// columns), four tdpbf16ps per four tile loads and pass. Operands are packed per panel of 256 k
// into the layout the tiles read, every part at once: A by rows of pair words, B by pair rows of
// 32 columns (each word two consecutive k of one column), zero past m, n and k, so edge blocks
// need no other shape; C tiles at the edges (and across the diagonal of a c_lower product) go
// through a 16 x 16 scratch. A is packed once per panel in groups of kAmxGroupRows rows, B once
// per strip for every kAmxHeldGroups groups (once per product for m <= 192), and once for
// products that share it where the stages say so (MicroKernels::gemm_shared_b).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "bf16.h"
#include "cpu/kernels/product.h"
#include "cpu/kernels/tiles.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "cpu/kernels/lanes__avx512.h"
#include "cpu/kernels/pack_bf16_pairs__avx512bf16.h"
#endif

namespace flat::cpu {
namespace {

// The configuration the kernel assumes, every tile 16 rows x 64 bytes; the target loads it once
// per worker range (Target::enter_thread).
constexpr TileConfig gemm_tiles_config() {
  TileConfig config;
  for (int t = 0; t < kTileCount; ++t) {
    config.rows[t] = kTileMaxRows;
    config.colsb[t] = kTileRowBytes;
  }
  return config;
}
constexpr TileConfig kGemmTiles = gemm_tiles_config();

constexpr int kAmxTile = 16;                       // rows and columns of a C tile, pairs of an A or B tile
constexpr int kAmxBlock = 2 * kAmxTile;            // rows of a block of A, columns of a strip of B
constexpr int kAmxStepDepth = 2 * kAmxTile;        // k per tdpbf16ps
constexpr int kAmxPanelDepth = 256;                // k per packed panel
constexpr int kAmxPanelPairs = kAmxPanelDepth / 2; // words per packed row of A
// Rows of A packed together per panel, each block of them reused by every strip of B: a chunk of
// 64 rows (the default) packed once per product; a group's pack 98 KiB at three parts.
constexpr int kAmxGroupRows = 2 * kAmxBlock;
static_assert(kAmxPanelDepth % kAmxStepDepth == 0, "whole steps per panel");

// The bf16 parts of an operand that is not a bf16 value under Precision::exact: three parts of 8
// significant bits hold an fp32 value's 24 exactly, and the passes dropped (x1 y2 + x2 y1 + x2 y2)
// are below 2^-23 of each product. Two parts (3 passes) leave the delta rule's outputs at 3e-5
// where the suite's fp32 bound is 1e-5 (tests/harness.h), so fp32 outputs take three; bf16 outputs
// (GemmDesc::bf16_outputs), which round at 2^-9, take two: what two parts drop (x1 y1 and what
// each operand's two parts leave, each at most 2^-16 of its value) is under 2^-14 of each product.
constexpr int kExactParts = 3;
constexpr int kExactPartsForBf16Outputs = 2;

// The bf16 parts of an operand holding `values` in a product so described.
constexpr int amx_parts_of(Operands values, const SharedBDesc& d) {
  if (values == Operands::bf16_values || d.precision == Precision::fast) return 1;
  return d.bf16_outputs ? kExactPartsForBf16Outputs : kExactParts;
}
// The tile passes A_i B_j (i < a_parts, j < b_parts, i + j < the most parts of either) of a
// product of operands of so many parts, each pass index counted once.
constexpr int amx_passes(int a_parts, int b_parts) {
  const int most = a_parts > b_parts ? a_parts : b_parts;
  int passes = 0;
  for (int i = 0; i < a_parts; ++i)
    for (int j = 0; j < b_parts; ++j) passes += i + j < most;
  return passes;
}
// The tile passes of a product so described.
constexpr int amx_passes_of(const SharedBDesc& d) {
  return amx_passes(amx_parts_of(d.a_values, d), amx_parts_of(d.b_values, d));
}

// A's rows [0, rows) (at most kAmxGroupRows) and k [0, depth) (A(i, p) = a[i*a_rs + p*a_cs]) as
// Parts bf16 parts, part t at out + t * kAmxGroupRows * kAmxPanelPairs as [kAmxGroupRows,
// kAmxPanelPairs] words (k 2q in the low half of word q), zero past them up to `pairs` and up to
// whole blocks of rows. B's k [0, depth) of columns [0, cols) as Parts bf16 parts, part t at out +
// t * kAmxPanelPairs * kAmxBlock as [pairs, kAmxBlock] words (column j's k 2q and 2q + 1 in word
// (q, j)), zero past them. Each part of x is the rounding (to nearest even) of what the parts
// before it leave (exact in fp32: x less its leading parts fits in x's significand); past fp32's
// range (x within half a bf16 step of the largest float rounds to infinity) the first part stands
// alone. On AVX512-BF16 (the amx and amx_model targets) 16 lanes at a time, where a subnormal
// input part is rounded to zero (vcvtneps2bf16 reads subnormals as zero) rather than to a
// subnormal bf16: the tiles read both as zero, so the products are the same. Elsewhere (the
// amx_model_avx2 target, the tests' own unit) element by element.
#if defined(__AVX512BF16__)

// x's bf16 parts, each but the last as the fp32 value it holds, the last as what the others leave:
// the packing's conversion rounds it (one part: x itself).
template <int Parts>
inline void bf16_parts(__m512 x, __m512 (&parts)[Parts]) {
  constexpr int kNotFinite = 0x01 | 0x08 | 0x10 | 0x80;  // vfpclassps: quiet NaN, +inf, -inf, signalling NaN
  __m512 rest = x;
  for (int t = 0; t + 1 < Parts; ++t) {
    const __m256i rounded = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(rest));
    parts[t] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));
    rest = _mm512_maskz_sub_ps(~_mm512_fpclass_ps_mask(parts[t], kNotFinite), rest, parts[t]);
  }
  parts[Parts - 1] = rest;
}

// The pair words (x0's lane in the low half, x1's in the high) of x0's and x1's bf16 parts, as
// bf16_parts makes them, for B and the columns of A. The parts but the last are paired from the
// rounding's own bits by a shift, not converted again and permuted (interleave_pairs): on
// Sapphire Rapids, where 512-bit vector work runs on two ports, 16 operations per 32 elements at
// two parts instead of 22.
template <int Parts>
inline void bf16_part_pairs(__m512 x0, __m512 x1, __m512i (&words)[Parts]) {
  constexpr int kNotFinite = 0x01 | 0x08 | 0x10 | 0x80;  // vfpclassps: quiet NaN, +inf, -inf, signalling NaN
  __m512 rest0 = x0, rest1 = x1;
  for (int t = 0; t + 1 < Parts; ++t) {
    const __m512i low = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(rest0)));
    const __m512i high = _mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(rest1))), 16);
    words[t] = _mm512_or_si512(low, high);
    const __m512 part0 = _mm512_castsi512_ps(_mm512_slli_epi32(low, 16)), part1 = _mm512_castsi512_ps(high);
    rest0 = _mm512_maskz_sub_ps(~_mm512_fpclass_ps_mask(part0, kNotFinite), rest0, part0);
    rest1 = _mm512_maskz_sub_ps(~_mm512_fpclass_ps_mask(part1, kNotFinite), rest1, part1);
  }
  words[Parts - 1] = interleave_pairs(rest0, rest1);
}

inline __mmask16 lanes_from(int first, int count) { return first_lanes(count > first ? count - first : 0); }

template <int Parts>
void pack_amx_a(int rows, int depth, int pairs, const float* a, int a_rs, int a_cs, uint32_t* out) {
  constexpr size_t part_words = size_t(kAmxGroupRows) * kAmxPanelPairs;
  const int stored = std::min(rows, kAmxGroupRows);
  const int padded = std::min(kAmxGroupRows, (rows + kAmxBlock - 1) / kAmxBlock * kAmxBlock);
  __m512 x0[Parts], x1[Parts];
  if (a_cs == 1) {  // rows of A: a row's 32 k are 16 words as they lie
    for (int i = 0; i < padded; ++i)
      for (int q0 = 0; q0 < pairs; q0 += kAmxTile) {
        const float* row = a + size_t(i) * a_rs + 2 * q0;
        const bool inside = i < stored;
        bf16_parts(_mm512_maskz_loadu_ps(inside ? lanes_from(2 * q0, depth) : 0, row), x0);
        bf16_parts(_mm512_maskz_loadu_ps(inside ? lanes_from(2 * q0 + 16, depth) : 0, row + 16), x1);
        for (int t = 0; t < Parts; ++t)
          _mm512_store_si512(out + t * part_words + size_t(i) * kAmxPanelPairs + q0,
                             reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x1[t], x0[t])));
      }
    return;
  }
  // Columns of A: 16 rows' words of one pair per vector, 16 pairs transposed into 16 rows.
  __m512 words[Parts][16];
  __m512i pair[Parts];
  for (int i0 = 0; i0 < padded; i0 += kAmxTile) {
    const __mmask16 lanes = lanes_from(i0, stored);
    for (int q0 = 0; q0 < pairs; q0 += kAmxTile) {
      for (int q = 0; q < kAmxTile; ++q) {
        const int p = 2 * (q0 + q);
        const float* column = a + i0 + size_t(p) * a_cs;
        bf16_part_pairs(_mm512_maskz_loadu_ps(p < depth ? lanes : 0, p < depth ? column : a),
                        _mm512_maskz_loadu_ps(p + 1 < depth ? lanes : 0, p + 1 < depth ? column + a_cs : a), pair);
        for (int t = 0; t < Parts; ++t) words[t][q] = _mm512_castsi512_ps(pair[t]);
      }
      for (int t = 0; t < Parts; ++t) {
        transpose16(words[t]);
        for (int r = 0; r < kAmxTile; ++r)
          _mm512_store_ps(out + t * part_words + size_t(i0 + r) * kAmxPanelPairs + q0, words[t][r]);
      }
    }
  }
}

template <int Parts>
void pack_amx_b(int depth, int cols, int pairs, const float* b, int ldb, uint32_t* out) {
  constexpr size_t part_words = size_t(kAmxPanelPairs) * kAmxBlock;
  __m512i pair[Parts];
  for (int q = 0; q < pairs; ++q) {
    const int p = 2 * q;
    for (int j = 0; j < kAmxBlock; j += 16) {
      const float* row = b + size_t(p) * ldb + j;
      const __mmask16 lanes = lanes_from(j, cols);
      bf16_part_pairs(_mm512_maskz_loadu_ps(p < depth ? lanes : 0, p < depth ? row : b),
                      _mm512_maskz_loadu_ps(p + 1 < depth ? lanes : 0, p + 1 < depth ? row + ldb : b), pair);
      for (int t = 0; t < Parts; ++t) _mm512_store_si512(out + t * part_words + size_t(q) * kAmxBlock + j, pair[t]);
    }
  }
}

// B stored by columns (GemmDesc::b: column j's k at b + j * ldb, consecutive) packed as pack_amx_b
// lays B out: each column's 32 k of a step as 16 pair words (as pack_amx_a packs a row of A), and
// each 16 columns' words transposed, word (q, j) then column j's k 2q and 2q + 1. The words are
// those pack_amx_b makes of the same values by rows.
template <int Parts>
void pack_amx_b_columns(int depth, int cols, int pairs, const float* b, int ldb, uint32_t* out) {
  constexpr size_t part_words = size_t(kAmxPanelPairs) * kAmxBlock;
  __m512 words[Parts][16];
  __m512 x0[Parts], x1[Parts];
  for (int j0 = 0; j0 < kAmxBlock; j0 += kAmxTile)
    for (int q0 = 0; q0 < pairs; q0 += kAmxTile) {
      for (int j = 0; j < kAmxTile; ++j) {
        const bool inside = j0 + j < cols;
        const float* column = inside ? b + size_t(j0 + j) * ldb + 2 * q0 : b;
        bf16_parts(_mm512_maskz_loadu_ps(inside ? lanes_from(2 * q0, depth) : 0, column), x0);
        bf16_parts(_mm512_maskz_loadu_ps(inside ? lanes_from(2 * q0 + 16, depth) : 0, inside ? column + 16 : b), x1);
        for (int t = 0; t < Parts; ++t)
          words[t][j] = _mm512_castsi512_ps(reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x1[t], x0[t])));
      }
      for (int t = 0; t < Parts; ++t) {
        transpose16(words[t]);
        for (int q = 0; q < kAmxTile; ++q)
          _mm512_store_ps(out + t * part_words + size_t(q0 + q) * kAmxBlock + j0, words[t][q]);
      }
    }
}

// The packs above from an operand kept as bf16 (Bf16Rows: no conversion, the pair words as they lie
// or two rows' bf16 interleaved), part 0 as the one part of a bf16 value and the others zero (what
// splitting it leaves). `first`: the operand's first storage row or column in the pack (A's group,
// B's strip), `k0`: the panel's first k.

// 16 bf16 of storage row i from column j, zero past `count`.
inline __m256i load_bf16_16(const Bf16Rows& x, int i, int j, int count) {
  return count > 0 ? _mm256_maskz_loadu_epi16(first_lanes(count), x.at(i, j)) : _mm256_setzero_si256();
}
// 32 bf16 of storage row i from column j (16 pair words as they lie), zero past `count`.
inline __m512i load_bf16_32(const Bf16Rows& x, int i, int j, int count) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load_bf16_16(x, i, j, count)),
                            load_bf16_16(x, i, j + 16, count - 16), 1);
}
// Pair words (lo's lane in the low half) of two tokens' 16 bf16.
inline __m512i pair_words(__m256i lo, __m256i hi) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
}
template <int Parts>
void zero_other_parts(uint32_t* out, size_t part_words) {
  for (int t = 1; t < Parts; ++t) std::memset(out + t * part_words, 0, sizeof(uint32_t) * part_words);
}

template <int Parts>
void pack_amx_a_bf16(int rows, int depth, int pairs, const Bf16Rows& a, Layout layout, int first, int k0,
                     uint32_t* out) {
  constexpr size_t part_words = size_t(kAmxGroupRows) * kAmxPanelPairs;
  const int stored = std::min(rows, kAmxGroupRows);
  const int padded = std::min(kAmxGroupRows, (rows + kAmxBlock - 1) / kAmxBlock * kAmxBlock);
  zero_other_parts<Parts>(out, part_words);
  if (layout == Layout::rows) {  // row i's 32 k: 16 pair words as they lie
    for (int i = 0; i < padded; ++i)
      for (int q0 = 0; q0 < pairs; q0 += kAmxTile) {
        const int p = 2 * q0;
        _mm512_store_si512(out + size_t(i) * kAmxPanelPairs + q0,
                           load_bf16_32(a, first + i, k0 + p, i < stored ? depth - p : 0));
      }
    return;
  }
  // By columns (A(i, p) at storage (p, i)): 16 rows' words of one pair from two tokens' rows,
  // 16 pairs transposed into 16 rows.
  __m512 words[16];
  for (int i0 = 0; i0 < padded; i0 += kAmxTile) {
    const int count = stored - i0;
    for (int q0 = 0; q0 < pairs; q0 += kAmxTile) {
      for (int q = 0; q < kAmxTile; ++q) {
        const int p = 2 * (q0 + q);
        words[q] = _mm512_castsi512_ps(pair_words(load_bf16_16(a, k0 + p, first + i0, p < depth ? count : 0),
                                                  load_bf16_16(a, k0 + p + 1, first + i0, p + 1 < depth ? count : 0)));
      }
      transpose16(words);
      for (int r = 0; r < kAmxTile; ++r) _mm512_store_ps(out + size_t(i0 + r) * kAmxPanelPairs + q0, words[r]);
    }
  }
}

template <int Parts>
void pack_amx_b_bf16(int depth, int cols, int pairs, const Bf16Rows& b, Layout layout, int first, int k0,
                     uint32_t* out) {
  constexpr size_t part_words = size_t(kAmxPanelPairs) * kAmxBlock;
  zero_other_parts<Parts>(out, part_words);
  if (layout == Layout::rows) {  // B(p, j) at storage (p, j): two tokens' rows interleaved
    for (int q = 0; q < pairs; ++q) {
      const int p = 2 * q;
      for (int j = 0; j < kAmxBlock; j += 16) {
        const int count = cols - j;
        _mm512_store_si512(out + size_t(q) * kAmxBlock + j,
                           pair_words(load_bf16_16(b, k0 + p, first + j, p < depth ? count : 0),
                                      load_bf16_16(b, k0 + p + 1, first + j, p + 1 < depth ? count : 0)));
      }
    }
    return;
  }
  // By columns (B(p, j) at storage (j, p)): each column's 32 k are 16 pair words as they lie, 16
  // columns' words transposed.
  __m512 words[16];
  for (int j0 = 0; j0 < kAmxBlock; j0 += kAmxTile)
    for (int q0 = 0; q0 < pairs; q0 += kAmxTile) {
      for (int j = 0; j < kAmxTile; ++j) {
        const int p = 2 * q0;
        words[j] = _mm512_castsi512_ps(load_bf16_32(b, first + j0 + j, k0 + p, j0 + j < cols ? depth - p : 0));
      }
      transpose16(words);
      for (int q = 0; q < kAmxTile; ++q) _mm512_store_ps(out + size_t(q0 + q) * kAmxBlock + j0, words[q]);
    }
}

#else

// x's bf16 parts, as the contract above says. A compile-time count: one part is a single rounding,
// the rest's arithmetic gone.
template <int Parts>
inline void bf16_parts(float x, uint16_t* out) {
  float rest = x;
  for (int i = 0; i < Parts; ++i) {
    out[i] = f32_to_bf16(rest);
    const float part = bf16_to_f32(out[i]);
    rest = std::isfinite(part) ? rest - part : 0.0f;
  }
}

template <int Parts>
void pack_amx_a(int rows, int depth, int pairs, const float* a, int a_rs, int a_cs, uint32_t* out) {
  constexpr size_t part_words = size_t(kAmxGroupRows) * kAmxPanelPairs;
  const int padded = std::min(kAmxGroupRows, (rows + kAmxBlock - 1) / kAmxBlock * kAmxBlock);
  for (int t = 0; t < Parts; ++t)
    for (int i = 0; i < padded; ++i) std::fill_n(out + t * part_words + size_t(i) * kAmxPanelPairs, pairs, 0u);
  uint16_t x[Parts];
  for (int i = 0; i < rows && i < kAmxGroupRows; ++i)
    for (int p = 0; p < depth; ++p) {
      bf16_parts<Parts>(a[size_t(i) * a_rs + size_t(p) * a_cs], x);
      for (int t = 0; t < Parts; ++t)
        out[t * part_words + size_t(i) * kAmxPanelPairs + p / 2] |= uint32_t(x[t]) << (16 * (p & 1));
    }
}

// B(p, j) = b[p * p_stride + j * j_stride], packed as pack_amx_b lays B out.
template <int Parts>
void pack_amx_b_strided(int depth, int cols, int pairs, const float* b, size_t p_stride, size_t j_stride,
                        uint32_t* out) {
  constexpr size_t part_words = size_t(kAmxPanelPairs) * kAmxBlock;
  for (int t = 0; t < Parts; ++t) std::fill_n(out + t * part_words, size_t(pairs) * kAmxBlock, 0u);
  const int width = std::min(cols, kAmxBlock);
  uint16_t x[Parts];
  for (int p = 0; p < depth; ++p)
    for (int j = 0; j < width; ++j) {
      bf16_parts<Parts>(b[size_t(p) * p_stride + size_t(j) * j_stride], x);
      for (int t = 0; t < Parts; ++t)
        out[t * part_words + size_t(p / 2) * kAmxBlock + j] |= uint32_t(x[t]) << (16 * (p & 1));
    }
}

template <int Parts>
void pack_amx_b(int depth, int cols, int pairs, const float* b, int ldb, uint32_t* out) {
  pack_amx_b_strided<Parts>(depth, cols, pairs, b, size_t(ldb), 1, out);
}

template <int Parts>
void pack_amx_b_columns(int depth, int cols, int pairs, const float* b, int ldb, uint32_t* out) {
  pack_amx_b_strided<Parts>(depth, cols, pairs, b, 1, size_t(ldb), out);
}

// From an operand kept as bf16 (Bf16Rows), as the AVX512-BF16 path above says: the same words.
template <int Parts>
void pack_amx_a_bf16(int rows, int depth, int pairs, const Bf16Rows& a, Layout layout, int first, int k0,
                     uint32_t* out) {
  constexpr size_t part_words = size_t(kAmxGroupRows) * kAmxPanelPairs;
  const int padded = std::min(kAmxGroupRows, (rows + kAmxBlock - 1) / kAmxBlock * kAmxBlock);
  for (int t = 0; t < Parts; ++t)
    for (int i = 0; i < padded; ++i) std::fill_n(out + t * part_words + size_t(i) * kAmxPanelPairs, pairs, 0u);
  for (int i = 0; i < rows && i < kAmxGroupRows; ++i)
    for (int p = 0; p < depth; ++p) {
      const uint16_t x = layout == Layout::rows ? *a.at(first + i, k0 + p) : *a.at(k0 + p, first + i);
      out[size_t(i) * kAmxPanelPairs + p / 2] |= uint32_t(x) << (16 * (p & 1));
    }
}

template <int Parts>
void pack_amx_b_bf16(int depth, int cols, int pairs, const Bf16Rows& b, Layout layout, int first, int k0,
                     uint32_t* out) {
  constexpr size_t part_words = size_t(kAmxPanelPairs) * kAmxBlock;
  for (int t = 0; t < Parts; ++t) std::fill_n(out + t * part_words, size_t(pairs) * kAmxBlock, 0u);
  const int width = std::min(cols, kAmxBlock);
  for (int p = 0; p < depth; ++p)
    for (int j = 0; j < width; ++j) {
      const uint16_t x = layout == Layout::rows ? *b.at(k0 + p, first + j) : *b.at(first + j, k0 + p);
      out[size_t(p / 2) * kAmxBlock + j] |= uint32_t(x) << (16 * (p & 1));
    }
}

#endif

// One accumulator tile's place in C: its corner, the rows and columns of it inside C (at most 16;
// none past C's edge), and whether its elements are written whole (else only j <= i, for c_lower).
struct CTile {
  float* c;
  int ldc, rows, cols;
  int diagonal;  // column of C's diagonal at the tile's first row, relative to its first column
  bool lower;    // c_lower: write only elements on or below the diagonal

  bool empty() const { return rows <= 0 || cols <= 0 || (lower && diagonal + rows - 1 < 0); }
  bool whole() const { return rows == kAmxTile && cols == kAmxTile && !(lower && diagonal < kAmxTile - 1); }
  bool wanted(int r, int j) const { return r < rows && j < cols && (!lower || j <= diagonal + r); }
};

template <class Tiles, int T>
void begin_c_tile(const CTile& t, bool into, float* scratch) {
  if (!into || t.empty()) {
    Tiles::template zero<T>();
  } else if (t.whole()) {
    Tiles::template load<T>(t.c, size_t(t.ldc) * sizeof(float));
  } else {
    for (int r = 0; r < kAmxTile; ++r)
      for (int j = 0; j < kAmxTile; ++j)
        scratch[r * kAmxTile + j] = r < t.rows && j < t.cols ? t.c[size_t(r) * t.ldc + j] : 0.0f;
    Tiles::template load<T>(scratch, kTileRowBytes);
  }
}

template <class Tiles, int T>
void end_c_tile(const CTile& t, float* scratch) {
  if (t.empty()) return;
  if (t.whole()) {
    Tiles::template store<T>(t.c, size_t(t.ldc) * sizeof(float));
    return;
  }
  Tiles::template store<T>(scratch, kTileRowBytes);
  for (int r = 0; r < t.rows; ++r)
    for (int j = 0; j < t.cols; ++j)
      if (t.wanted(r, j)) t.c[size_t(r) * t.ldc + j] = scratch[r * kAmxTile + j];
}

// The k steps [first, last) of a panel (from k0, `steps` of them) at which A's rows [r0, r0 + 32)
// can be nonzero, per `tri`.
struct StepRange {
  int first, last;
};
inline StepRange nonzero_steps(Triangle tri, int r0, int k0, int steps) {
  StepRange range{0, steps};
  if (tri == Triangle::a_lower)  // k <= r0 + 31
    range.last = std::min(steps, std::max(0, r0 + kAmxBlock - 1 - k0 + kAmxStepDepth) / kAmxStepDepth);
  if (tri == Triangle::a_upper)  // k >= r0
    range.first = std::min(range.last, std::max(0, r0 - k0) / kAmxStepDepth);
  return range;
}

// One 32 x 32 block of C, its four tiles `c` (rows 0-15: c[0], c[1]; rows 16-31: c[2], c[3])
// begun as zero or as C, then every pass of `steps` on A's packed rows (a_block, its 32 rows of the
// group's pack, AParts parts) and B's packed strip (BParts parts), stored back.
template <class Tiles, int AParts, int BParts>
void block_32x32__amx(const uint32_t* a_block, const uint32_t* b_strip, StepRange steps, const CTile (&c)[4],
                      bool into, float* scratch) {
  constexpr size_t a_part_words = size_t(kAmxGroupRows) * kAmxPanelPairs;
  constexpr size_t b_part_words = size_t(kAmxPanelPairs) * kAmxBlock;
  constexpr size_t stride_a = kAmxPanelPairs * sizeof(uint32_t), stride_b = kAmxBlock * sizeof(uint32_t);
  begin_c_tile<Tiles, 0>(c[0], into, scratch);
  begin_c_tile<Tiles, 1>(c[1], into, scratch);
  begin_c_tile<Tiles, 2>(c[2], into, scratch);
  begin_c_tile<Tiles, 3>(c[3], into, scratch);
  constexpr int most = AParts > BParts ? AParts : BParts;
  for (int s = steps.first; s < steps.last; ++s)
    for (int order = most - 1; order >= 0; --order)  // the passes A_i B_j, i + j = order
      for (int i = order < BParts ? 0 : order - BParts + 1; i <= order && i < AParts; ++i) {
        const uint32_t* a_part = a_block + i * a_part_words + size_t(s) * kAmxTile;
        const uint32_t* b_part = b_strip + (order - i) * b_part_words + size_t(s) * kAmxTile * kAmxBlock;
        Tiles::template load<4>(a_part, stride_a);
        Tiles::template load<5>(a_part + size_t(kAmxTile) * kAmxPanelPairs, stride_a);
        Tiles::template load<6>(b_part, stride_b);
        Tiles::template load<7>(b_part + kAmxTile, stride_b);
        Tiles::template dpbf16ps<0, 4, 6>();
        Tiles::template dpbf16ps<1, 4, 7>();
        Tiles::template dpbf16ps<2, 5, 6>();
        Tiles::template dpbf16ps<3, 5, 7>();
      }
  end_c_tile<Tiles, 0>(c[0], scratch);
  end_c_tile<Tiles, 1>(c[1], scratch);
  end_c_tile<Tiles, 2>(c[2], scratch);
  end_c_tile<Tiles, 3>(c[3], scratch);
}

// Groups of A's rows (of one product or several that share B) packed and held at once, each strip
// of B packed once for all of them: three, so the forward's scores of a chunk of 64 and the state
// update's (k * R)^T of K = 128 rows, which read the same values, pack them once (as do two
// products of 64 rows, or one of 128). Their packs, 96-288 KiB on the stack (1 to 3 parts), stay
// in L2.
constexpr int kAmxHeldGroups = 3;

// C_p (+)= A_p B for every product p (SharedBProduct, each with its own layout and triangle; one
// for a lone product) with A as AParts and B as BParts bf16 parts (gemm_bf16_32x32__amx): per
// panel of k, A packed per group of rows, up to kAmxHeldGroups groups held, B per strip of 32
// columns for them, each block of each held group on that strip. Every product's passes and sums
// are those it would make alone.
template <class Tiles, int AParts, int BParts>
void gemm_bf16_parts_32x32__amx(const SharedBDesc& d, int count, const SharedBProduct* products, int n, int k,
                                const float* b, int ldb, const Bf16Rows& b_bf16) {
  constexpr size_t a_pack_words = size_t(AParts) * kAmxGroupRows * kAmxPanelPairs;
  alignas(64) uint32_t a_pack[kAmxHeldGroups * a_pack_words];
  alignas(64) uint32_t b_pack[BParts * kAmxPanelPairs * kAmxBlock];
  alignas(64) float scratch[kAmxTile * kAmxTile];
  struct Group {
    const SharedBProduct* product;
    int first, end;  // its rows of the product
  };
  Group held[kAmxHeldGroups];
  int held_count = 0;
  for (int k0 = 0; k0 < k || k0 == 0; k0 += kAmxPanelDepth) {
    const int depth = k - k0 < kAmxPanelDepth ? k - k0 : kAmxPanelDepth;
    const int steps = (depth + kAmxStepDepth - 1) / kAmxStepDepth, pairs = steps * kAmxTile;
    const bool into = d.accumulate || k0 > 0;
    if (steps == 0 && into) break;  // k = 0 and C += nothing
    const auto run_held = [&] {
      // The columns any held group writes: a c_lower group's end up to its last row's diagonal.
      int columns = 0;
      for (int h = 0; h < held_count; ++h) {
        const SharedBProduct& product = *held[h].product;
        const auto [a_rs, a_cs] = a_strides(product_desc(d, product), product.lda);
        if (product.a_bf16.present())
          pack_amx_a_bf16<AParts>(product.m - held[h].first, depth, pairs, product.a_bf16, product.layout,
                                  held[h].first, k0, a_pack + h * a_pack_words);
        else
          pack_amx_a<AParts>(product.m - held[h].first, depth, pairs,
                             product.a + size_t(held[h].first) * a_rs + size_t(k0) * a_cs, a_rs, a_cs,
                             a_pack + h * a_pack_words);
        columns = std::max(columns, product.triangle == Triangle::c_lower ? std::min(n, held[h].end) : n);
      }
      for (int j0 = 0; j0 < columns; j0 += kAmxBlock) {
        if (b_bf16.present())
          pack_amx_b_bf16<BParts>(depth, n - j0, pairs, b_bf16, d.b, j0, k0, b_pack);
        else if (d.b == Layout::rows)
          pack_amx_b<BParts>(depth, n - j0, pairs, b + size_t(k0) * ldb + j0, ldb, b_pack);
        else
          pack_amx_b_columns<BParts>(depth, n - j0, pairs, b + size_t(j0) * ldb + k0, ldb, b_pack);
        for (int h = 0; h < held_count; ++h) {
          const SharedBProduct& product = *held[h].product;
          const Triangle tri = product.triangle;
          const auto c_tile = [&](int i0, int c0) {
            return CTile{product.c + size_t(i0) * product.ldc + c0, product.ldc, std::min(product.m - i0, kAmxTile),
                         std::min(n - c0, kAmxTile), i0 - c0, tri == Triangle::c_lower};
          };
          for (int r0 = held[h].first; r0 < held[h].end; r0 += kAmxBlock) {
            if (tri == Triangle::c_lower && j0 > r0 + kAmxBlock - 1) continue;  // the block is above the diagonal
            const StepRange range = nonzero_steps(tri, r0, k0, steps);
            if (range.first == range.last && into) continue;
            const CTile tiles[4] = {c_tile(r0, j0), c_tile(r0, j0 + kAmxTile), c_tile(r0 + kAmxTile, j0),
                                    c_tile(r0 + kAmxTile, j0 + kAmxTile)};
            block_32x32__amx<Tiles, AParts, BParts>(a_pack + h * a_pack_words + size_t(r0 - held[h].first) * kAmxPanelPairs,
                                                    b_pack, range, tiles, into, scratch);
          }
        }
      }
      held_count = 0;
    };
    for (int p = 0; p < count; ++p)
      for (int g0 = 0; g0 < products[p].m; g0 += kAmxGroupRows) {
        held[held_count++] = {&products[p], g0, std::min(products[p].m, g0 + kAmxGroupRows)};
        if (held_count == kAmxHeldGroups) run_held();
      }
    if (held_count > 0) run_held();
  }
}

// Products sharing B as gemm_f32_1xn__generic describes each (both layouts of A, the triangles,
// only C(i, j <= i) written for c_lower), each operand as amx_parts_of its values bf16 parts: as
// one part or, where amx_parts_of splits it, as Split parts. Needs kGemmTiles loaded.
template <class Tiles, int Split>
void gemm_bf16_split_32x32__amx(const SharedBDesc& d, int count, const SharedBProduct* products, int n, int k,
                                const float* b, int ldb, const Bf16Rows& b_bf16) {
  const bool a_split = amx_parts_of(d.a_values, d) > 1, b_split = amx_parts_of(d.b_values, d) > 1;
  const auto run = [&](auto product) { product(d, count, products, n, k, b, ldb, b_bf16); };
  if (a_split && b_split)
    run(gemm_bf16_parts_32x32__amx<Tiles, Split, Split>);
  else if (a_split)
    run(gemm_bf16_parts_32x32__amx<Tiles, Split, 1>);
  else if (b_split)
    run(gemm_bf16_parts_32x32__amx<Tiles, 1, Split>);
  else
    run(gemm_bf16_parts_32x32__amx<Tiles, 1, 1>);
}

// Products sharing B on the tiles (MicroKernels::gemm_shared_b), at the description's precision.
template <class Tiles>
void gemm_bf16_shared_b_32x32__amx(const SharedBDesc& d, int count, const SharedBProduct* products, int n, int k,
                                   const float* b, int ldb, const Bf16Rows& b_bf16) {
  const GemmSharedBKernel split = d.bf16_outputs ? gemm_bf16_split_32x32__amx<Tiles, kExactPartsForBf16Outputs>
                                                 : gemm_bf16_split_32x32__amx<Tiles, kExactParts>;
  split(d, count, products, n, k, b, ldb, b_bf16);
}

// One product on the tiles (MicroKernels::gemm).
template <class Tiles>
void gemm_bf16_32x32__amx(const GemmDesc& d, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                          float* c, int ldc) {
  const SharedBProduct product{m, a, lda, c, ldc, d.a, d.triangle};
  gemm_bf16_shared_b_32x32__amx<Tiles>(call_desc(d), 1, &product, n, k, b, ldb, {});
}

}  // namespace
}  // namespace flat::cpu

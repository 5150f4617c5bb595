// The chunk stages on AVX-512 (F, BW, DQ, VL) with FMA: register-blocked fp32 microkernels for
// the chunk products, a vector exp for the gates, and the elementwise stages vectorised 16 wide.
// Compiled with those target flags; only called after the CPU has been checked for them.
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "cpu/rows.h"
#include "cpu/stages.h"
#include "cpu/vector_math_avx512.h"

#define FLAT_ISA avx512

namespace flat::cpu::avx512 {
namespace {

// The first `count` of 16 lanes.
__mmask16 first_lanes(int count) { return count >= 16 ? __mmask16(0xffff) : __mmask16((1u << count) - 1u); }

constexpr int kTileRows = 6;      // MR
constexpr int kTileVectors = 4;   // NR = 16 * kTileVectors = 64 columns

// C[MR, 16*NV] (+)= A[MR, k] B[k, 16*NV]. The MR x NV accumulators stay in zmm registers for the
// whole k loop: at 6 x 4 that is 24 accumulators + 4 B vectors + 1 broadcast of the 32 registers,
// and 24 independent FMAs cover the 2 FMA ports x 4-cycle latency = 8 needed in flight. Per k
// step: 4 B loads and 6 broadcasts feed 24 FMAs (12 cycles of FMA for 10 loads, well inside the
// 2 loads per cycle); measured 5-10% ahead of 8 x 2 on the chunk products.
// The last column vector is masked (`tail`) for widths that are not multiples of 16.
template <int MR, int NV>
void gemm_f32_tile__avx512(int k, const float* a, int a_rs, int a_cs, const float* b, int ldb, float* c, int ldc,
                           __mmask16 tail, bool accumulate) {
  __mmask16 mask[NV];
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) mask[v] = v == NV - 1 ? tail : __mmask16(0xffff);
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v)
      acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(mask[v], c + size_t(i) * ldc + 16 * v) : _mm512_setzero_ps();
  for (int p = 0; p < k; ++p) {
    const float* bp = b + size_t(p) * ldb;
    __m512 bv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(mask[v], bp + 16 * v);
    const float* ap = a + size_t(p) * a_cs;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(ap[size_t(i) * a_rs]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(c + size_t(i) * ldc + 16 * v, mask[v], acc[i][v]);
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

// C[m, n] (+)= A B with A(i, p) = a[i*a_rs + p*a_cs] and B row-major [k, n], tile by tile.
// Tiles in zero regions of A (per `tri`) contribute nothing and are skipped along k; tiles of C
// entirely above the diagonal are skipped for c_lower.
void matmul(int m, int n, int k, const float* a, int a_rs, int a_cs, const float* b, int ldb, float* c, int ldc,
            bool accumulate, Triangle tri) {
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
                                    b + size_t(p0) * ldb + j0, ldb, c + size_t(i0) * ldc + j0, ldc, tail, accumulate);
    }
  }
}

// In-register transpose of 16 rows of 16 floats: 32-bit, then 64-bit interleaves of row pairs,
// then 128-bit lane shuffles across row octets and halves. 64 shuffles for 256 elements.
void transpose16(__m512* x) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
  }
  auto lo = [](__m512 a, __m512 b) { return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))); };
  auto hi = [](__m512 a, __m512 b) { return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))); };
  for (int i = 0; i < 4; ++i) {
    x[4 * i + 0] = lo(t[4 * i], t[4 * i + 2]);
    x[4 * i + 1] = hi(t[4 * i], t[4 * i + 2]);
    x[4 * i + 2] = lo(t[4 * i + 1], t[4 * i + 3]);
    x[4 * i + 3] = hi(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(x[8 * i + j], x[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(x[8 * i + j], x[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    x[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    x[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
}

// dst[c, r] = src[r, c] for r < rows, c < cols, in 16 x 16 blocks (masked at the edges).
void transpose(int rows, int cols, const float* src, int lds, float* dst, int ldd) {
  for (int r0 = 0; r0 < rows; r0 += 16) {
    const int nr = rows - r0 < 16 ? rows - r0 : 16;
    for (int c0 = 0; c0 < cols; c0 += 16) {
      const int nc = cols - c0 < 16 ? cols - c0 : 16;
      __m512 x[16];
      for (int i = 0; i < 16; ++i)
        x[i] = i < nr ? _mm512_maskz_loadu_ps(first_lanes(nc), src + size_t(r0 + i) * lds + c0) : _mm512_setzero_ps();
      transpose16(x);
      for (int j = 0; j < nc; ++j) _mm512_mask_storeu_ps(dst + size_t(c0 + j) * ldd + r0, first_lanes(nr), x[j]);
    }
  }
}

void exp_inplace(float* x, int n) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(n - i);
    _mm512_mask_storeu_ps(x + i, m, exp_ps(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// Rows of K channels as 16-lane vectors: the last one masked.
struct Lanes {
  explicit Lanes(int K) : vectors((K + 15) / 16), tail(first_lanes(K - 16 * (vectors - 1))) {}
  __mmask16 mask(int v) const { return v == vectors - 1 ? tail : __mmask16(0xffff); }
  int vectors;
  __mmask16 tail;
};

float dot(const float* a, const float* b, int n) {
  const Lanes lanes(n);
  __m512 acc = _mm512_setzero_ps();
  for (int v = 0; v < lanes.vectors; ++v)
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes.mask(v), a + 16 * v), _mm512_maskz_loadu_ps(lanes.mask(v), b + 16 * v), acc);
  return _mm512_reduce_add_ps(acc);
}

// Contracts in stages_generic.cpp. Channels run 16 to a vector. For a query i, g = q_i * F_ij
// walks down the keys j in registers (NV vectors: K <= 16 * NV): one FMA into the score and one
// multiply by a_j per vector and key, no loads but k_j's and a_j's.
template <int NV>
void diagonal_scores_in_registers(int n, int K, const float* q, const float* k, const float* a, float* A, int lda) {
  const Lanes lanes(K);
  for (int i = 0; i < n; ++i) {
    __m512 g[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) g[v] = _mm512_maskz_loadu_ps(lanes.mask(v), q + size_t(i) * K + 16 * v);
    for (int j = i; j >= 0; --j) {
      const float *kj = k + size_t(j) * K, *aj = a + size_t(j) * K;
      __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) {
        acc = _mm512_fmadd_ps(g[v], _mm512_maskz_loadu_ps(lanes.mask(v), kj + 16 * v), acc);
        g[v] = _mm512_mul_ps(g[v], _mm512_maskz_loadu_ps(lanes.mask(v), aj + 16 * v));
      }
      A[size_t(i) * lda + j] = _mm512_reduce_add_ps(acc);
    }
  }
}

void diagonal_scores(int n, int K, const float* q, const float* k, const float* a, float* A, int lda, float*) {
  using Kernel = void (*)(int, int, const float*, const float*, const float*, float*, int);
  static constexpr Kernel kByVectors[16] = {
      diagonal_scores_in_registers<1>,  diagonal_scores_in_registers<2>,  diagonal_scores_in_registers<3>,
      diagonal_scores_in_registers<4>,  diagonal_scores_in_registers<5>,  diagonal_scores_in_registers<6>,
      diagonal_scores_in_registers<7>,  diagonal_scores_in_registers<8>,  diagonal_scores_in_registers<9>,
      diagonal_scores_in_registers<10>, diagonal_scores_in_registers<11>, diagonal_scores_in_registers<12>,
      diagonal_scores_in_registers<13>, diagonal_scores_in_registers<14>, diagonal_scores_in_registers<15>,
      diagonal_scores_in_registers<16>};
  kByVectors[Lanes(K).vectors - 1](n, K, q, k, a, A, lda);
}

void diagonal_gradients(int n, int K, const float* q, const float* k, const float* a, const float* dA, int lda,
                        float* dq, float* dk, float* f) {
  const Lanes lanes(K);
  for (int i = 1; i < n; ++i) {
    for (int v = 0; v < lanes.vectors; ++v) _mm512_storeu_ps(f + 16 * v, _mm512_set1_ps(1.0f));
    const float* qi = q + size_t(i) * K;
    float* dqi = dq + size_t(i) * K;
    for (int j = i - 1; j >= 0; --j) {
      const __m512 w = _mm512_set1_ps(dA[size_t(i) * lda + j]);
      const float *kj = k + size_t(j) * K, *a_next = a + size_t(j + 1) * K;
      float* dkj = dk + size_t(j) * K;
      for (int v = 0; v < lanes.vectors; ++v) {
        const __mmask16 m = lanes.mask(v);
        const __m512 fv = _mm512_mul_ps(_mm512_loadu_ps(f + 16 * v), _mm512_maskz_loadu_ps(m, a_next + 16 * v));
        _mm512_storeu_ps(f + 16 * v, fv);
        const __m512 wf = _mm512_mul_ps(w, fv);
        _mm512_mask_storeu_ps(dqi + 16 * v, m,
                              _mm512_fmadd_ps(wf, _mm512_maskz_loadu_ps(m, kj + 16 * v), _mm512_maskz_loadu_ps(m, dqi + 16 * v)));
        _mm512_mask_storeu_ps(dkj + 16 * v, m,
                              _mm512_fmadd_ps(wf, _mm512_maskz_loadu_ps(m, qi + 16 * v), _mm512_maskz_loadu_ps(m, dkj + 16 * v)));
      }
    }
  }
}

}  // namespace
}  // namespace flat::cpu::avx512

#include "cpu/stages.inc"

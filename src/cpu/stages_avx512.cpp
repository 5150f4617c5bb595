// The chunk stages on AVX-512 (F, BW, DQ, VL) with FMA: register-blocked fp32 microkernels for
// the chunk products, a vector exp for the gates, and the elementwise stages vectorised 16 wide.
// Compiled with those target flags; only called after the CPU has been checked for them.
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "cpu/rows.h"
#include "cpu/stages.h"

#define FLAT_ISA avx512

namespace flat::cpu::avx512 {
namespace {

constexpr int kTileRows = 8;      // MR
constexpr int kTileVectors = 2;   // NR = 16 * kTileVectors = 32 columns

// C[MR, 16*NV] (+)= A[MR, k] B[k, 16*NV]. The MR x NV accumulators stay in zmm registers for the
// whole k loop: at 8 x 2 that is 16 accumulators + 2 B vectors + 1 broadcast of the 32 registers,
// and 16 independent FMAs cover the 2 FMA ports x 4-cycle latency = 8 needed in flight. Per k
// step: 2 B loads and 8 broadcasts feed 16 FMAs, inside the 2-3 loads per cycle the core issues.
// The last column vector is masked (`tail`) for widths that are not multiples of 16.
template <int MR, int NV>
void gemm_f32_tile__avx512(int k, const float* a, int a_rs, int a_cs, const float* b, int ldb, float* c, int ldc,
                           __mmask16 tail, bool accumulate) {
  __mmask16 mask[NV];
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v) mask[v] = v == NV - 1 ? tail : __mmask16(0xffff);
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(mask[v], c + size_t(i) * ldc + 16 * v) : _mm512_setzero_ps();
  for (int p = 0; p < k; ++p) {
    const float* bp = b + size_t(p) * ldb;
    __m512 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(mask[v], bp + 16 * v);
    const float* ap = a + size_t(p) * a_cs;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(ap[size_t(i) * a_rs]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(c + size_t(i) * ldc + 16 * v, mask[v], acc[i][v]);
}

using Tile = void (*)(int, const float*, int, int, const float*, int, float*, int, __mmask16, bool);

template <int... MR>
constexpr auto make_tiles(std::integer_sequence<int, MR...>) {
  struct Table {
    Tile t[sizeof...(MR)][kTileVectors];
  };
  return Table{{{gemm_f32_tile__avx512<MR + 1, 1>, gemm_f32_tile__avx512<MR + 1, 2>}...}};
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
      const __mmask16 tail = __mmask16((1u << (nr - 16 * (vectors - 1))) - 1u);
      kTiles.t[mr - 1][vectors - 1](p1 - p0, a + size_t(i0) * a_rs + size_t(p0) * a_cs, a_rs, a_cs,
                                    b + size_t(p0) * ldb + j0, ldb, c + size_t(i0) * ldc + j0, ldc, tail, accumulate);
    }
  }
}

// exp(x) = 2^n exp(r) with n = round(x log2 e) and r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split
// in two so n ln 2 is exact), exp(r) by its degree-6 minimax polynomial (Cephes' expf, within
// 2 ulp), and 2^n applied by vscalefps, which flushes gracefully to 0 for very negative n.
// Gates are clamped to [-150, 88]: exp is already 0 (or the largest float) beyond.
__m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-150.f)), _mm512_set1_ps(88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

void exp_inplace(float* x, int n) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(x + i, m, exp_ps(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

}  // namespace
}  // namespace flat::cpu::avx512

#include "cpu/stages.inc"

// Helpers of the AVX-512 microkernels: lane masks for row tails, the sum of each of 8 or 16
// vectors' lanes, and an in-register 16 x 16 transpose. Include only in translation units compiled
// with AVX-512 F/BW/DQ/VL (their target's flags); internal linkage, a copy per unit.
#pragma once

#include <immintrin.h>

namespace flat::cpu {
namespace {

// The first `count` of 16 lanes.
inline __mmask16 first_lanes(int count) { return count >= 16 ? __mmask16(0xffff) : __mmask16((1u << count) - 1u); }

// Rows of K channels as 16-lane vectors: the last one masked.
struct Lanes {
  explicit Lanes(int K) : vectors((K + 15) / 16), tail(first_lanes(K - 16 * (vectors - 1))) {}
  __mmask16 mask(int v) const { return v == vectors - 1 ? tail : __mmask16(0xffff); }
  int vectors;
  __mmask16 tail;
};

// Lane j of the result: the sum of the 16 lanes of x[j], for N = 8 or 16 vectors (lanes N and up
// unspecified). Pairs interleaved and added, 32-bit then 64-bit, then 128-bit blocks across
// vectors: 45 instructions for 16 sums, where 16 separate reductions take about 130.
template <int N>
__m512 sum_lanes(const __m512* x) {
  static_assert(N == 8 || N == 16);
  auto lo64 = [](__m512 u, __m512 w) { return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u), _mm512_castps_pd(w))); };
  auto hi64 = [](__m512 u, __m512 w) { return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u), _mm512_castps_pd(w))); };
  // Per 128-bit block b of a vector: lane 4b + m of z[c] holds block b's sum of x[4c + m].
  __m512 y[N / 2], z[N / 4];
#pragma GCC unroll 8
  for (int p = 0; p < N / 2; ++p)
    y[p] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * p], x[2 * p + 1]), _mm512_unpackhi_ps(x[2 * p], x[2 * p + 1]));
#pragma GCC unroll 4
  for (int c = 0; c < N / 4; ++c) z[c] = _mm512_add_ps(lo64(y[2 * c], y[2 * c + 1]), hi64(y[2 * c], y[2 * c + 1]));
  // Blocks (0, 1) and (2, 3) added: s = [z0 b01, z0 b23, z1 b01, z1 b23], then the halves.
  const __m512 s0 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xdd));
  const __m512 s1 =
      N == 16 ? _mm512_add_ps(_mm512_shuffle_f32x4(z[N / 4 - 2], z[N / 4 - 1], 0x88),
                              _mm512_shuffle_f32x4(z[N / 4 - 2], z[N / 4 - 1], 0xdd))
              : s0;
  return _mm512_add_ps(_mm512_shuffle_f32x4(s0, s1, 0x88), _mm512_shuffle_f32x4(s0, s1, 0xdd));
}

// In-register transpose of 16 rows of 16 floats: 32-bit, then 64-bit interleaves of row pairs,
// then 128-bit lane shuffles across row octets and halves. 64 shuffles for 256 elements.
inline void transpose16(__m512* x) {
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


}  // namespace
}  // namespace flat::cpu

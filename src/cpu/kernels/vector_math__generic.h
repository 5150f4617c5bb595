// Vector math in portable C++ (exp), one element at a time in plain arithmetic the compiler
// vectorises: no libm call, no branch (selects only), so a loop of it under `omp simd` becomes
// vector code with the target's flags (SSE2 for the generic target, AVX2 with FMA where the
// portable rows are compiled so). Internal linkage: each translation unit keeps its own copy,
// built with its own flags.
#pragma once

#include <bit>
#include <cstdint>

namespace flat::cpu {
namespace {

// a b + c: fused where the flags give FMA (one rounding, as the AVX-512 and AVX2 kernels),
// else a product and a sum (the compiler does not contract them in ISO C++ mode).
[[gnu::always_inline]] inline float mul_add(float a, float b, float c) {
#if defined(__FMA__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// c ? a : b on the bits, with a mask made from c: the compiler keeps it a select. Written as
// `c ? a : b` on floats, GCC makes a branch of it (a float select is not a min or max to it while
// NaN and -0 are honoured), then specialises what follows on each side (a clamped argument is a
// constant there) and leaves float operations on one side only, which it does not turn back into
// vector selects (they may trap, in the default floating-point environment): the loop is not
// vectorised.
[[gnu::always_inline]] inline float select_f32(bool c, float a, float b) {
  const uint32_t m = uint32_t(0) - uint32_t(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// -|x|: the sign bit set.
[[gnu::always_inline]] inline float minus_abs_f32(float x) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(x) | 0x80000000u);
}

// Arguments below kExpLow give 0: kExpLow is ln 2^-126 = -87.3365447 rounded up to a float, the
// least float whose exp is in fp32's normal range (and whose result computed here is too).
// Above kExpHigh the result is already +inf.
constexpr float kExpLow = -87.33654f;
constexpr float kExpHigh = 89.0f;

// exp(x) = 2^n exp(r), the function of vector_math__avx512.h's exp_ps: n = round(x log2 e) and
// r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split in two, Cody-Waite, so n ln 2 is exact), exp(r) =
// 1 + (r + r^2 p(r)) with p Cephes' degree-5 minimax polynomial, the small part summed first and
// 1 added last (rounded once). n is rounded to nearest even by adding 1.5 2^23 (its integer is
// then the low bits of the sum), and 2^n is applied as two exact powers of two 2^(n >> 1) and
// 2^(n - (n >> 1)), normal floats built in the exponent field for every n of the clamped range
// ([-126, 128]): the first product is exact, the second rounds once, overflowing to +inf above
// ln(FLT_MAX) = 88.72.
// Edges: x < kExpLow (-87.33654, where exp(x) leaves fp32's normal range) gives 0, never a
// subnormal (neither the result nor an intermediate: a subnormal costs a microcode assist on
// Intel cores; exp_ps gives the same under flat's flush-to-zero mode, src/cpu/float_mode.h);
// x > 88.72 gives +inf (exp_ps clamps its argument to 88 instead and saturates at exp(88));
// a NaN stays NaN (the clamps are selects that keep it, and the arithmetic carries it); exp(+-0)
// = 1 exactly.
// Accuracy, measured on every float of [-88, 89] against float64 exp: within 0.992 ulp without FMA
// (the generic target's flags), within 1.024 ulp with it (AVX2 with FMA; the worst near x = 26.7,
// 1.016 ulp for x <= 0, the gates); tests/test_microkernels.cpp, PortableExp*.
[[gnu::always_inline]] inline float exp_f32(float x) {
  const bool low = x < kExpLow;  // a NaN compares false: kept
  float v = select_f32(low, kExpLow, x);
  v = select_f32(v > kExpHigh, kExpHigh, v);
  constexpr float kRound = 12582912.0f;  // 1.5 2^23: v log2 e + kRound rounds to an integer
  const float shifted = v * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const int32_t ni = int32_t(std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(kRound));
  float r = mul_add(-n, 0.693359375f, v);  // exact: 0.693359375 has 9 significant bits
  r = mul_add(-n, -2.12194440e-4f, r);
  float y = 1.9875691500e-4f;
  y = mul_add(y, r, 1.3981999507e-3f);
  y = mul_add(y, r, 8.3334519073e-3f);
  y = mul_add(y, r, 4.1665795894e-2f);
  y = mul_add(y, r, 1.6666665459e-1f);
  y = mul_add(y, r, 5.0000001201e-1f);
  y = mul_add(y * r, r, r);
  y = y + 1.0f;
  const int32_t n1 = ni >> 1, n2 = ni - n1;  // NaN: any bits, the product stays NaN
  const float p1 = std::bit_cast<float>(uint32_t(n1 + 127) << 23);
  const float p2 = std::bit_cast<float>(uint32_t(n2 + 127) << 23);
  return select_f32(low, 0.0f, (y * p1) * p2);
}

}  // namespace
}  // namespace flat::cpu

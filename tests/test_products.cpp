// The chunk products of bf16 values on every instruction set this CPU has (the bf16 dot-product
// microkernels where it has AVX512-BF16) against a float64 product of the same operands: shapes
// around the tile (6 x 64), the vector (16), the packed panel (128 k, 96 rows) and odd k (pairs),
// both layouts of A, the triangles, accumulation, and C written nowhere outside what is asked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/stages.h"

namespace flat::test {
namespace {

using cpu::Triangle;

float to_bf16_value(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

bool is_zero(Triangle tri, int i, int p) {
  return (tri == Triangle::a_lower && p > i) || (tri == Triangle::a_upper && p < i);
}

struct Shape {
  int m, n, k;
};

void check_products(cpu::Isa isa) {
  const cpu::SequenceKernels& kernels = cpu::sequence_kernels(isa);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const float poison = std::nanf("");
  const std::vector<int> ms{1, 6, 7, 97};                    // tile rows 6, row block 96
  const std::vector<int> ns{1, 15, 17, 64, 65};               // vectors of 16, tiles of 64
  const std::vector<int> ks{0, 1, 2, 3, 31, 128, 129, 257};   // pairs, panels of 128
  int cases = 0;
  for (int m : ms)
    for (int n : ns)
      for (int k : ks)
        for (Triangle tri : {Triangle::none, Triangle::a_lower, Triangle::a_upper, Triangle::c_lower})
          for (bool a_transposed : {false, true})
            for (bool accumulate : {false, true}) {
              // A(i, p) at a[i*a_rs + p*a_cs]; padded leading dimensions, so strides are not widths.
              const int lda = a_transposed ? m + 3 : k + 5, ldb = n + 2, ldc = n + 1;
              const int a_rs = a_transposed ? 1 : lda, a_cs = a_transposed ? lda : 1;
              std::vector<float> a(size_t(a_transposed ? k : m) * lda + 1), b(size_t(k) * ldb + 1);
              for (float& x : a) x = to_bf16_value(uniform(rng));
              for (float& x : b) x = to_bf16_value(uniform(rng));
              for (int i = 0; i < m; ++i)
                for (int p = 0; p < k; ++p)
                  if (is_zero(tri, i, p)) a[size_t(i) * a_rs + size_t(p) * a_cs] = 0.0f;
              std::vector<float> c(size_t(m) * ldc);
              for (int i = 0; i < m; ++i)
                for (int j = 0; j < ldc; ++j) c[size_t(i) * ldc + j] = j < n ? uniform(rng) : poison;
              const std::vector<float> c0 = c;
              kernels.product_of_bf16_values(m, n, k, a.data(), a_rs, a_cs, b.data(), ldb, c.data(), ldc, accumulate,
                                             tri);
              const std::string what = std::string(cpu::isa_name(isa)) + " m=" + std::to_string(m) +
                                       " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                       " tri=" + std::to_string(int(tri)) + (a_transposed ? " A^T" : " A") +
                                       (accumulate ? " +=" : " =");
              for (int i = 0; i < m; ++i) {
                for (int j = 0; j < n; ++j) {
                  if (tri == Triangle::c_lower && j > i) continue;
                  const double start = accumulate ? c0[size_t(i) * ldc + j] : 0.0;
                  double want = start, magnitude = std::abs(start);
                  for (int p = 0; p < k; ++p) {
                    const double term = double(a[size_t(i) * a_rs + size_t(p) * a_cs]) * double(b[size_t(p) * ldb + j]);
                    want += term;
                    magnitude += std::abs(term);
                  }
                  // The products of bf16 values are exact in fp32; k + 1 additions in fp32, in any
                  // order, are within (k + 1) u of the sum of magnitudes (u = 2^-24).
                  const double bound = (k + 1) * std::ldexp(magnitude, -24);
                  ASSERT_LE(std::abs(double(c[size_t(i) * ldc + j]) - want), bound)
                      << what << " at (" << i << ", " << j << ")";
                }
                for (int j = n; j < ldc; ++j) ASSERT_TRUE(std::isnan(c[size_t(i) * ldc + j])) << what << ": padding written";
              }
              ++cases;
            }
  EXPECT_EQ(cases, int(ms.size() * ns.size() * ks.size()) * 16);
}

TEST(Products, OfBf16ValuesMatchFloat64OnEveryInstructionSet) {
  for (cpu::Isa isa : {cpu::Isa::generic, cpu::Isa::avx512, cpu::Isa::avx512_bf16}) {
    if (!cpu::isa_supported(isa)) continue;
    SCOPED_TRACE(cpu::isa_name(isa));
    check_products(isa);
  }
}

// The tests registered with FLAT_ISA (CMakeLists.txt) do run on the instruction set they name.
TEST(Products, RequestedInstructionSetIsActive) {
  cpu::Isa requested;
  if (!cpu::isa_requested(&requested)) GTEST_SKIP() << "FLAT_ISA not set";
  EXPECT_EQ(cpu::active_isa(), requested);
}

}  // namespace
}  // namespace flat::test

// Every microkernel of every target this CPU supports (src/cpu/targets.h, MicroKernels) against
// float64 on the same fp32 operands, sweeping sizes around their edges: the gemm tile (6 x 64),
// the vector (16), the bf16 packed panel (128 k, 96 rows) and odd k (pairs); both layouts of A,
// the triangles, accumulation; and nothing written outside what is asked (poisoned padding).
// The amx target's tile product runs on the model of the tile unit here on every machine, and
// where the CPU has AMX, on the hardware too, bitwise equal to the model.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels/gemm_bf16_32x32__amx.h"
#include "cpu/kernels/tiles__model.h"
#include "cpu/kernels/vector_math__generic.h"
#include "cpu/targets.h"
#include "tested_targets.h"

namespace flat::test {
namespace {

using cpu::GemmDesc;
using cpu::Layout;
using cpu::Operands;
using cpu::Triangle;

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
constexpr double kUnit = 1.0 / (1 << 24);  // fp32's unit roundoff, 2^-24

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

// Runs each supported target through `check`, with the target's name traced, inside the
// target's per-thread scope (the amx target's tile configuration), as the drivers do.
template <class Check>
void on_every_target(Check&& check) {
  for (const cpu::Target* target : test::supported_targets()) {
    SCOPED_TRACE(std::string("target ") + target->name);
    const cpu::ThreadScope scope(*target, false);
    check(*target);
  }
}

// The tile product on the model of the tile unit, configured as the amx target configures it.
class OnTheTileModel {
 public:
  OnTheTileModel() { cpu::ModelTiles::configure(cpu::kGemmTiles); }
  ~OnTheTileModel() { cpu::ModelTiles::release(); }
  static cpu::GemmKernel choose(const GemmDesc&) { return cpu::gemm_bf16_32x32__amx<cpu::ModelTiles>; }
};

// One product to check: its description and operands, A (stored by rows or columns, zero where
// the triangle says) and B (by rows or columns) with padded leading dimensions, so strides are not
// widths.
struct GemmCase {
  int m, n, k;
  GemmDesc d;
  int lda, ldb, ldc, a_rs, a_cs, b_rs, b_cs;
  std::vector<float> a, b;

  float a_at(int i, int p) const { return a[size_t(i) * a_rs + size_t(p) * a_cs]; }
  float b_at(int p, int j) const { return b[size_t(p) * b_rs + size_t(j) * b_cs]; }
  void run(cpu::GemmKernel kernel, float* c) const { kernel(d, m, n, k, a.data(), lda, b.data(), ldb, c, ldc); }
  // C [m, ldc] as a product starts from: its n columns drawn, the column past them poisoned.
  template <class Draw>
  std::vector<float> c_start(Draw&& draw) const {
    std::vector<float> c(size_t(m) * ldc);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < ldc; ++j) c[size_t(i) * ldc + j] = j < n ? draw() : kPoison;
    return c;
  }
  std::string name() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           " tri=" + std::to_string(int(d.triangle)) + (d.a == Layout::columns ? " A^T" : " A") +
           (d.b == Layout::columns ? " B^T" : " B") +
           (d.accumulate ? " +=" : " =") + (d.a_values == Operands::f32 ? " A f32" : " A bf16") +
           (d.b_values == Operands::f32 ? " B f32 " : " B bf16 ") + std::string(precision_name(d.precision)) +
           (d.bf16_outputs ? " for bf16 outputs" : "");
  }
};

// A's elements from draw_a, B's from draw_b.
template <class DrawA, class DrawB>
GemmCase gemm_case(int m, int n, int k, const GemmDesc& d, DrawA&& draw_a, DrawB&& draw_b) {
  const bool a_transposed = d.a == Layout::columns, b_transposed = d.b == Layout::columns;
  const int lda = a_transposed ? m + 3 : k + 5, ldb = b_transposed ? k + 4 : n + 2;
  GemmCase g{m,   n,   k,   d,  lda, ldb, n + 1, a_transposed ? 1 : lda, a_transposed ? lda : 1, b_transposed ? 1 : ldb,
             b_transposed ? ldb : 1, {}, {}};
  g.a.resize(size_t(a_transposed ? k : m) * lda + 1);
  g.b.resize(size_t(b_transposed ? n : k) * ldb + 1);
  for (float& x : g.a) x = draw_a();
  for (float& x : g.b) x = draw_b();
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p)
      if (is_zero(d.triangle, i, p)) g.a[size_t(i) * g.a_rs + size_t(p) * g.a_cs] = 0.0f;
  return g;
}

// How far a kernel's products may stand from float64 before they are summed: each enters C's fp32
// sum as `terms` terms (one on fp32 FMA and for bf16 values; the tile unit's passes over the bf16
// parts of fp32 operands at exact precision), all of them together off by at most `relative` of the
// product: at exact precision the passes dropped (x1 y2 + x2 y1 + x2 y2, the parts summing to x
// exactly: 2^-23 + 2^-32, docs/algorithm.md); for bf16 outputs, of two parts, x1 y1 and what each
// operand's parts leave (at most 2^-16 of it): under 2^-14; at fast precision both operands
// rounded to bf16 once, each by at most 2^-8 (2^-7 + 2^-16).
struct ProductError {
  int terms;
  double relative;
};

ProductError product_error(bool on_tiles, const GemmDesc& d) {
  if (cpu::bf16_operands(d)) return {1, 0.0};
  if (d.precision == Precision::fast) return {1, std::ldexp(1.0, -7) + std::ldexp(1.0, -16)};
  if (!on_tiles) return {1, 0.0};
  return {cpu::amx_passes_of(cpu::call_desc(d)),
          d.bf16_outputs ? std::ldexp(1.0, -14) : std::ldexp(1.0, -23) + std::ldexp(1.0, -32)};
}

// C (+)= A B on the kernel the target chooses for each description against float64, every
// element within the fp32 summation bound of its terms, in any order, plus the products' own
// error (ProductError).
// The sizes a product is checked at: every kernel's blocking (tile rows 6, row block 96, vectors
// of 16, tiles of 64, k in pairs and panels of 128).
struct GemmSizes {
  std::vector<int> m = {1, 6, 7, 97}, n = {1, 15, 17, 64, 65}, k = {0, 1, 2, 3, 31, 128, 129, 257};
};

// What a product is checked for: what its operands hold, its precision and its outputs' dtype
// (GemmDesc::a_values, b_values, precision, bf16_outputs); check_gemm sweeps the rest.
constexpr GemmDesc kF32Exact{}, kF32Fast{.precision = Precision::fast}, kF32ForBf16Outputs{.bf16_outputs = true};
constexpr GemmDesc kBf16Values{.a_values = Operands::bf16_values, .b_values = Operands::bf16_values};
constexpr GemmDesc kBf16A{.a_values = Operands::bf16_values}, kBf16B{.b_values = Operands::bf16_values};
constexpr GemmDesc kBf16AForBf16Outputs{.a_values = Operands::bf16_values, .bf16_outputs = true};

// B stored by columns too where `reads_b_by_columns` (the target's, MicroKernels) says the kernel
// reads it so.
void check_gemm(cpu::MicroKernels::ChooseGemm choose, const GemmDesc& kind, bool on_tiles = false,
                const GemmSizes& sizes = {}, cpu::MicroKernels::ReadsBByColumns reads_b_by_columns = nullptr) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const auto draw_as = [&](Operands held) {
    return [&, held] { return held == Operands::bf16_values ? to_bf16_value(uniform(rng)) : uniform(rng); };
  };
  for (int m : sizes.m)
    for (int n : sizes.n)
      for (int k : sizes.k)
        for (Triangle tri : {Triangle::none, Triangle::a_lower, Triangle::a_upper, Triangle::c_lower})
          for (bool a_transposed : {false, true})
            for (bool b_transposed : {false, true})
              for (bool accumulate : {false, true}) {
                const GemmDesc d{.a_values = kind.a_values,
                                 .b_values = kind.b_values,
                                 .precision = kind.precision,
                                 .bf16_outputs = kind.bf16_outputs,
                                 .a = a_transposed ? Layout::columns : Layout::rows,
                                 .b = b_transposed ? Layout::columns : Layout::rows,
                                 .accumulate = accumulate,
                                 .triangle = tri};
                if (b_transposed && !(reads_b_by_columns && reads_b_by_columns(cpu::call_desc(d)))) continue;
                const GemmCase g = gemm_case(m, n, k, d, draw_as(kind.a_values), draw_as(kind.b_values));
                const ProductError error = product_error(on_tiles, g.d);
                const int ldc = g.ldc;
                std::vector<float> c = g.c_start([&] { return uniform(rng); });
                const std::vector<float> c0 = c;
                g.run(choose(g.d), c.data());
                const std::string what = g.name();
                for (int i = 0; i < m; ++i) {
                  for (int j = 0; j < n; ++j) {
                    if (tri == Triangle::c_lower && j > i) continue;
                    const double start = accumulate ? c0[size_t(i) * ldc + j] : 0.0;
                    double want = start, magnitude = std::abs(start);
                    for (int p = 0; p < k; ++p) {
                      const double term = double(g.a_at(i, p)) * double(g.b_at(p, j));
                      want += term;
                      magnitude += std::abs(term);
                    }
                    const double bound = ((k * error.terms + 2) * kUnit + error.relative) * magnitude;
                    ASSERT_LE(std::abs(double(c[size_t(i) * ldc + j]) - want), bound)
                        << what << " at (" << i << ", " << j << ")";
                  }
                  for (int j = n; j < ldc; ++j) ASSERT_TRUE(std::isnan(c[size_t(i) * ldc + j])) << what << ": padding written";
                }
              }
}

TEST(MicroKernels, GemmMatchesFloat64) {
  on_every_target([](const cpu::Target& t) {
    for (const GemmDesc& kind : {kF32Exact, kF32ForBf16Outputs})
      check_gemm(t.micro.gemm, kind, t.tile_products, {}, t.micro.reads_b_by_columns);
  });
}

TEST(MicroKernels, GemmAtFastPrecisionMatchesFloat64) {
  on_every_target(
      [](const cpu::Target& t) { check_gemm(t.micro.gemm, kF32Fast, t.tile_products, {}, t.micro.reads_b_by_columns); });
}

TEST(MicroKernels, GemmOfBf16ValuesMatchesFloat64) {
  on_every_target([](const cpu::Target& t) {
    for (const GemmDesc& kind : {kBf16Values, kBf16A, kBf16B})
      check_gemm(t.micro.gemm, kind, t.tile_products, {}, t.micro.reads_b_by_columns);
  });
}

// The tile product's own edges: C tiles of 16 and blocks of 32 rows and columns, row groups of 64,
// steps of 32 k and panels of 256; single rows and columns, an odd k within a pair. (B by columns:
// TileGemmReadsBEitherWayAlike here, and the sweeps above on the tile targets.)
TEST(MicroKernels, TileGemmOnTheModelMatchesFloat64) {
  const OnTheTileModel model;
  const GemmSizes edges{.m = {1, 15, 16, 17, 33, 64, 97}, .n = {1, 16, 17, 33, 65}, .k = {0, 1, 2, 31, 32, 33, 257}};
  for (const GemmDesc& kind : {kF32Exact, kF32Fast, kF32ForBf16Outputs})
    check_gemm(OnTheTileModel::choose, kind, true, edges);
  // One operand of bf16 values: one part of it, the passes with the other's parts alone.
  for (const GemmDesc& kind : {kBf16Values, kBf16A, kBf16B, kBf16AForBf16Outputs})
    check_gemm(OnTheTileModel::choose, kind, true, edges);
}

// The tile product packs B by columns into the very words it packs by rows: the same C, bit for
// bit, for B stored either way, on the model (in this unit's portable packing, and in the amx_model
// target's 16 lanes at a time where it runs) and on the hardware where this CPU has the tiles.
TEST(MicroKernels, TileGemmReadsBEitherWayAlike) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const auto draw = [&] { return uniform(rng); };
  const auto check = [&](cpu::GemmKernel kernel) {
    for (const GemmDesc& kind : {kF32Exact, kF32Fast, kF32ForBf16Outputs, kBf16B})
      for (int m : {1, 33})
        for (int n : {1, 17, 32, 65})
          for (int k : {1, 31, 33, 300})
            for (Triangle tri : {Triangle::none, Triangle::c_lower}) {
              GemmDesc d = kind;
              d.triangle = tri;
              const GemmCase by_rows = gemm_case(m, n, k, d, draw, draw);
              d.b = Layout::columns;
              GemmCase by_columns = gemm_case(m, n, k, d, draw, draw);
              by_columns.a = by_rows.a;
              for (int p = 0; p < k; ++p)
                for (int j = 0; j < n; ++j)
                  by_columns.b[size_t(j) * by_columns.ldb + p] = by_rows.b[size_t(p) * by_rows.ldb + j];
              std::vector<float> c_rows(size_t(m) * by_rows.ldc, kPoison), c_columns = c_rows;
              by_rows.run(kernel, c_rows.data());
              by_columns.run(kernel, c_columns.data());
              for (size_t at = 0; at < c_rows.size(); ++at)
                ASSERT_EQ(std::bit_cast<uint32_t>(c_rows[at]), std::bit_cast<uint32_t>(c_columns[at]))
                    << by_columns.name() << " at " << at;
            }
  };
  {
    const OnTheTileModel model;
    check(cpu::gemm_bf16_32x32__amx<cpu::ModelTiles>);
  }
  for (const cpu::Target* target : test::supported_targets())
    if (target->tile_products) {
      SCOPED_TRACE(std::string("target ") + target->name);
      const cpu::ThreadScope scope(*target, false);
      check(target->micro.gemm(GemmDesc{.precision = Precision::fast}));
    }
}

// Where this CPU runs the amx target: its tile product on the hardware against the same kernel on
// the model, bitwise, across the blocking's edges, the triangles, accumulation, magnitudes that
// round, and operands of bf16 values and of fp32 values split into parts at either precision and
// for either outputs' dtype (the hardware's operands packed 16 lanes at a time, the model's in this
// unit by the portable loops): every kind of product the amx target puts on the tiles. (Products
// of fp32 operands on both sides at exact precision it runs on the FMA units, not on the tiles:
// TileTargetsChooseTheUnitPerProduct.)
// The model follows the order of tdpbf16ps's sums found on a Sapphire or Emerald Rapids Xeon
// (docs/algorithm.md).
TEST(MicroKernels, TileGemmOnTheHardwareMatchesTheModel) {
  const cpu::Target* amx = cpu::find_target("amx");
  if (!amx || !cpu::supported(*amx)) GTEST_SKIP() << "this CPU (or its OS) gives no AMX-BF16 tiles";
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-30.0f, 30.0f), mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> sign(0, 1);
  const auto draw_f32 = [&] { return (sign(rng) ? -1.0f : 1.0f) * mantissa(rng) * std::exp2(exponent(rng)); };
  const auto draw_bf16 = [&] { return to_bf16_value(draw_f32()); };
  for (const GemmDesc& kind : {kBf16Values, kBf16A, kBf16B, kF32Fast, kBf16AForBf16Outputs})
    for (int m : {1, 16, 33, 70})
      for (int n : {1, 17, 32, 65})
        for (int k : {0, 1, 31, 33, 256, 300})
          for (Triangle tri : {Triangle::none, Triangle::a_lower, Triangle::a_upper, Triangle::c_lower})
            for (bool a_transposed : {false, true})
              for (bool accumulate : {false, true}) {
                const auto draw_a = [&] { return kind.a_values == Operands::f32 ? draw_f32() : draw_bf16(); };
                const auto draw_b = [&] { return kind.b_values == Operands::f32 ? draw_f32() : draw_bf16(); };
                const GemmCase g = gemm_case(m, n, k,
                                             {.a_values = kind.a_values,
                                              .b_values = kind.b_values,
                                              .precision = kind.precision,
                                              .bf16_outputs = kind.bf16_outputs,
                                              .a = a_transposed ? Layout::columns : Layout::rows,
                                              .accumulate = accumulate,
                                              .triangle = tri},
                                             draw_a, draw_b);
                std::vector<float> c0(size_t(m) * g.ldc);
                for (float& x : c0) x = draw_f32();
                std::vector<float> on_hardware = c0, on_model = c0;
                {
                  const cpu::ThreadScope scope(*amx, false);
                  g.run(amx->micro.gemm(g.d), on_hardware.data());
                }
                {
                  const OnTheTileModel model;
                  g.run(OnTheTileModel::choose(g.d), on_model.data());
                }
                for (size_t at = 0; at < on_model.size(); ++at)
                  ASSERT_EQ(std::bit_cast<uint32_t>(on_hardware[at]), std::bit_cast<uint32_t>(on_model[at]))
                      << g.name() << " at (" << at / g.ldc << ", " << at % g.ldc << "): " << on_hardware[at]
                      << " on the hardware, " << on_model[at] << " on the model";
              }
}

// A transpose is exact; the destination's padding stays untouched.
// Products sharing B (MicroKernels::gemm_shared_b, where a target has it; on the model everywhere)
// equal each product run alone, bitwise: the same passes and sums, B packed once. Products of
// 1 to 150 rows (row groups of 64, three held at once: three products' five groups in two
// batches), each product with its own layout of A and triangle (the first as the loop gives, the
// others in turn), B by rows and, where `reads_b_by_columns` says the kernels read it so, by
// columns, accumulation, operands of fp32 and of bf16 values at both precisions, and nothing
// written past each C's columns (nor above a c_lower product's diagonal).
void check_shared_b(cpu::MicroKernels::ChooseGemmSharedB shared, cpu::MicroKernels::ChooseGemm alone,
                    cpu::MicroKernels::ReadsBByColumns reads_b_by_columns) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const GemmDesc& kind : {kF32Exact, kF32ForBf16Outputs, kF32Fast, kBf16A})
    for (const std::vector<int>& rows : {std::vector<int>{70}, {64, 64}, {5, 150, 33}})
      for (int n : {17, 65})
        for (int k : {31, 300})
          for (bool a_transposed : {false, true})
            for (bool b_transposed : {false, true})
              for (bool accumulate : {false, true}) {
                const cpu::SharedBDesc d{.a_values = kind.a_values,
                                         .precision = kind.precision,
                                         .bf16_outputs = kind.bf16_outputs,
                                         .b = b_transposed ? Layout::columns : Layout::rows,
                                         .accumulate = accumulate};
                if (b_transposed && !(reads_b_by_columns && reads_b_by_columns(d))) continue;
                const auto draw_a = [&] { return kind.a_values == Operands::f32 ? uniform(rng) : to_bf16_value(uniform(rng)); };
                std::vector<GemmCase> cases;
                for (size_t p = 0; p < rows.size(); ++p) {
                  constexpr Triangle kTriangles[] = {Triangle::none, Triangle::a_lower, Triangle::a_upper, Triangle::c_lower};
                  const Triangle triangle =
                      p == 0 ? Triangle::none : kTriangles[(p + size_t(accumulate) + size_t(k > 100)) % 4];
                  const GemmDesc own = cpu::product_desc(
                      d, {.m = rows[p],
                          .a = nullptr,
                          .lda = 0,
                          .c = nullptr,
                          .ldc = 0,
                          .layout = (a_transposed != (p % 2 == 1)) ? Layout::columns : Layout::rows,
                          .triangle = triangle});
                  cases.push_back(gemm_case(rows[p], n, k, own, draw_a, [&] { return uniform(rng); }));
                }
                for (GemmCase& g : cases) g.b = cases[0].b;  // one B, as the first case drew it
                std::vector<std::vector<float>> together, apart;
                std::vector<cpu::SharedBProduct> products;
                for (const GemmCase& g : cases) {
                  const std::vector<float> c = g.c_start([&] { return uniform(rng); });
                  together.push_back(c);
                  apart.push_back(c);
                }
                for (size_t p = 0; p < cases.size(); ++p) {
                  products.push_back({cases[p].m, cases[p].a.data(), cases[p].lda, together[p].data(), cases[p].ldc,
                                      cases[p].d.a, cases[p].d.triangle});
                  cases[p].run(alone(cases[p].d), apart[p].data());
                }
                shared(d)(d, int(products.size()), products.data(), n, k, cases[0].b.data(), cases[0].ldb, {});
                for (size_t p = 0; p < cases.size(); ++p)
                  for (size_t at = 0; at < apart[p].size(); ++at)
                    ASSERT_EQ(std::bit_cast<uint32_t>(together[p][at]), std::bit_cast<uint32_t>(apart[p][at]))
                        << cases[p].name() << ", product " << p << " of " << cases.size() << " at (" << at / cases[p].ldc
                        << ", " << at % cases[p].ldc << ")";
              }
}

TEST(MicroKernels, ProductsSharingBEqualEachAlone) {
  {
    const OnTheTileModel model;
    check_shared_b(
        [](const cpu::SharedBDesc&) -> cpu::GemmSharedBKernel {
          return cpu::gemm_bf16_shared_b_32x32__amx<cpu::ModelTiles>;
        },
        OnTheTileModel::choose, [](const cpu::SharedBDesc&) { return true; });
  }
  on_every_target([](const cpu::Target& t) {
    if (t.micro.gemm_shared_b) check_shared_b(t.micro.gemm_shared_b, t.micro.gemm, t.micro.reads_b_by_columns);
  });
}

// Products whose A, B or both are kept as bf16 (Bf16Rows: MicroKernels::reads_bf16_rows, the
// forward's rows of q, k and v as loaded) equal, bitwise, the same products on their fp32 copies:
// both layouts of each, the triangles, accumulation, both precisions, edges in m, n and k (A of
// 5 to 150 rows, two products sharing B), B's columns past n and the fp32 copy of an operand kept
// as bf16 never read (NaN there), nothing written past C's columns.
void check_bf16_rows(cpu::MicroKernels::ChooseGemmSharedB shared) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const auto bits = [](const std::vector<float>& x) {
    std::vector<uint16_t> out(x.size());
    for (size_t e = 0; e < x.size(); ++e) out[e] = uint16_t(std::bit_cast<uint32_t>(x[e]) >> 16);
    return out;
  };
  for (Precision precision : {Precision::exact, Precision::fast})
    for (const std::vector<int>& rows : {std::vector<int>{5}, {64, 70}, {150}})
      for (int n : {17, 65})
        for (int k : {31, 300})
          for (bool a_transposed : {false, true})
            for (bool b_transposed : {false, true})
              for (bool accumulate : {false, true})
                for (int kept : {1, 2, 3}) {  // bit 0: A kept as bf16, bit 1: B
                  const bool a_kept = kept & 1, b_kept = kept & 2;
                  const cpu::SharedBDesc d{.a_values = Operands::bf16_values,
                                           .b_values = Operands::bf16_values,
                                           .precision = precision,
                                           .b = b_transposed ? Layout::columns : Layout::rows,
                                           .accumulate = accumulate};
                  const auto draw = [&] { return to_bf16_value(uniform(rng)); };
                  std::vector<GemmCase> cases;
                  for (size_t p = 0; p < rows.size(); ++p) {
                    const Triangle triangle = p == 0 ? Triangle::none : accumulate ? Triangle::a_lower : Triangle::c_lower;
                    const GemmDesc own = cpu::product_desc(
                        d, {.m = rows[p], .a = nullptr, .lda = 0, .c = nullptr, .ldc = 0,
                            .layout = a_transposed ? Layout::columns : Layout::rows, .triangle = triangle});
                    cases.push_back(gemm_case(rows[p], n, k, own, draw, draw));
                  }
                  for (GemmCase& g : cases) g.b = cases[0].b;
                  const std::vector<uint16_t> b_bits = bits(cases[0].b);
                  const std::vector<float> b_unread(cases[0].b.size(), kPoison);
                  std::vector<std::vector<uint16_t>> a_bits;
                  std::vector<std::vector<float>> a_unread, kept_c, copied_c;
                  std::vector<cpu::SharedBProduct> on_kept, on_copies;
                  for (const GemmCase& g : cases) {
                    const std::vector<float> c = g.c_start([&] { return uniform(rng); });
                    kept_c.push_back(c);
                    copied_c.push_back(c);
                    a_bits.push_back(bits(g.a));
                    a_unread.emplace_back(g.a.size(), kPoison);
                  }
                  for (size_t p = 0; p < cases.size(); ++p) {
                    const GemmCase& g = cases[p];
                    on_copies.push_back({g.m, g.a.data(), g.lda, copied_c[p].data(), g.ldc, g.d.a, g.d.triangle});
                    on_kept.push_back({g.m, a_kept ? a_unread[p].data() : g.a.data(), g.lda, kept_c[p].data(), g.ldc,
                                       g.d.a, g.d.triangle,
                                       a_kept ? cpu::Bf16Rows{a_bits[p].data(), g.lda} : cpu::Bf16Rows{}});
                  }
                  const int count = int(cases.size()), ldb = cases[0].ldb;
                  shared(d)(d, count, on_copies.data(), n, k, cases[0].b.data(), ldb, {});
                  shared(d)(d, count, on_kept.data(), n, k, b_kept ? b_unread.data() : cases[0].b.data(), ldb,
                            b_kept ? cpu::Bf16Rows{b_bits.data(), ldb} : cpu::Bf16Rows{});
                  for (size_t p = 0; p < cases.size(); ++p)
                    for (size_t at = 0; at < kept_c[p].size(); ++at)
                      ASSERT_EQ(std::bit_cast<uint32_t>(kept_c[p][at]), std::bit_cast<uint32_t>(copied_c[p][at]))
                          << cases[p].name() << (a_kept ? ", A kept" : "") << (b_kept ? ", B kept" : "")
                          << ", product " << p << " at (" << at / cases[p].ldc << ", " << at % cases[p].ldc << ")";
                }
}

TEST(MicroKernels, OperandsKeptAsBf16EqualTheirFp32Copies) {
  {
    const OnTheTileModel model;
    check_bf16_rows([](const cpu::SharedBDesc&) -> cpu::GemmSharedBKernel {
      return cpu::gemm_bf16_shared_b_32x32__amx<cpu::ModelTiles>;
    });
  }
  on_every_target([](const cpu::Target& t) {  // the tile targets this build has (none under the sanitizers)
    if (!t.micro.reads_bf16_rows) return;
    ASSERT_NE(t.micro.gemm_shared_b, nullptr);
    ASSERT_NE(t.micro.reads_b_by_columns, nullptr);
    check_bf16_rows(t.micro.gemm_shared_b);
  });
}

// A tile target's choice of unit per product (micro_kernels__amx_tiles.h, on_tiles): a product with
// an operand of one part (bf16 values, or any at fast precision) on the tile product, bitwise what
// the kernel gives on the model; one whose operands are both split at exact precision on the fp32
// kernel of the vector target under it (avx512's for amx and amx_model, avx2's for
// amx_model_avx2), bitwise what that target gives.
TEST(MicroKernels, TileTargetsChooseTheUnitPerProduct) {
  const auto vector_target_under = [](std::string_view tile_target) {
    return cpu::find_target(tile_target == "amx_model_avx2" ? "avx2" : "avx512");
  };
  const auto bitwise_equal = [](cpu::GemmKernel chosen, cpu::GemmKernel expected, const GemmDesc& kind) {
    std::mt19937 rng(29);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const auto draw_as = [&](Operands held) {
      return [&, held] { return held == Operands::bf16_values ? to_bf16_value(uniform(rng)) : uniform(rng); };
    };
    const GemmCase g = gemm_case(37, 70, 129, kind, draw_as(kind.a_values), draw_as(kind.b_values));
    std::vector<float> got(size_t(g.m) * g.ldc, kPoison), want(got.size(), kPoison);
    g.run(chosen, got.data());
    g.run(expected, want.data());
    for (size_t at = 0; at < got.size(); ++at)
      if (std::bit_cast<uint32_t>(got[at]) != std::bit_cast<uint32_t>(want[at])) return false;
    return true;
  };
  for (const cpu::Target* target : test::supported_targets()) {
    if (!target->tile_products) continue;
    SCOPED_TRACE(std::string("target ") + target->name);
    const cpu::Target* vector_target = vector_target_under(target->name);
    ASSERT_NE(vector_target, nullptr) << "every CPU that runs a tile target runs the vector target under it";
    const OnTheTileModel model;  // the model's configuration, as a tile target's thread scope loads it
    const cpu::ThreadScope scope(*target, false);
    for (const GemmDesc& kind : {kF32Fast, kBf16Values, kBf16A, kBf16B, kBf16AForBf16Outputs})
      EXPECT_TRUE(bitwise_equal(target->micro.gemm(kind), OnTheTileModel::choose(kind), kind))
          << "an operand of one part: the tile product";
    for (const GemmDesc& kind : {kF32Exact, kF32ForBf16Outputs})
      EXPECT_TRUE(bitwise_equal(target->micro.gemm(kind), vector_target->micro.gemm(kind), kind))
          << "fp32 operands on both sides at exact precision: the vector target's fp32 kernel";
    // B by columns where it is one part on the tiles; by rows where it is split (or off the tiles),
    // and on the vector targets always.
    ASSERT_NE(target->micro.reads_b_by_columns, nullptr);
    for (const GemmDesc& kind : {kF32Fast, kBf16Values, kBf16B})
      EXPECT_TRUE(target->micro.reads_b_by_columns(cpu::call_desc(kind)));
    for (const GemmDesc& kind : {kBf16A, kBf16AForBf16Outputs, kF32Exact, kF32ForBf16Outputs})
      EXPECT_FALSE(target->micro.reads_b_by_columns(cpu::call_desc(kind)));
    EXPECT_EQ(vector_target->micro.reads_b_by_columns, nullptr);
  }
}

TEST(MicroKernels, TransposeIsExact) {
  on_every_target([](const cpu::Target& target) {
    for (int rows : {1, 15, 16, 17, 40})
      for (int cols : {1, 15, 16, 17, 33}) {
        const int lds = cols + 3, ldd = rows + 2;
        std::vector<float> src(size_t(rows) * lds), dst(size_t(cols) * ldd, kPoison);
        for (size_t e = 0; e < src.size(); ++e) src[e] = float(e) * 0.25f - 7.0f;
        target.micro.transpose(rows, cols, src.data(), lds, dst.data(), ldd);
        for (int c = 0; c < cols; ++c) {
          for (int r = 0; r < rows; ++r)
            ASSERT_EQ(dst[size_t(c) * ldd + r], src[size_t(r) * lds + c]) << rows << "x" << cols << " at " << r << "," << c;
          for (int r = rows; r < ldd; ++r) ASSERT_TRUE(std::isnan(dst[size_t(c) * ldd + r])) << "padding written";
        }
      }
  });
}

// exp within an ulp of the float64 value over the gates' range (the decay factors compound over
// a sequence: tests/test_kernels.cpp, NearOneGates), 0 far below fp32's range, NaN kept NaN.
TEST(MicroKernels, ExpWithinAnUlp) {
  on_every_target([](const cpu::Target& target) {
    std::vector<float> x;
    for (int e = 1; e <= 24; ++e) x.push_back(-std::ldexp(1.0f, -e));  // gates just below 0
    for (int i = 0; i <= 2000; ++i) x.push_back(-0.05f * float(i));     // 0 to -100
    x.push_back(0.0f);
    const size_t finite = x.size();
    x.insert(x.end(), {-150.0f, -1736.0f, std::numeric_limits<float>::quiet_NaN()});
    for (int n : {1, 15, 16, 17, int(x.size())}) {
      std::vector<float> y(x.begin(), x.begin() + n);
      target.micro.exp(y.data(), n);
      for (int i = 0; i < n; ++i) {
        if (size_t(i) >= finite) continue;
        const double want = std::exp(double(x[size_t(i)]));
        const double ulp = std::ldexp(1.0, std::ilogb(float(want)) - 23);
        if (want < 1e-37) {
          ASSERT_LE(double(y[size_t(i)]), 2e-37) << "exp(" << x[size_t(i)] << ")";
          continue;
        }
        ASSERT_LE(std::abs(double(y[size_t(i)]) - want), ulp) << "exp(" << x[size_t(i)] << ") = " << y[size_t(i)];
      }
    }
    std::vector<float> tail(x.begin() + long(finite), x.end());
    target.micro.exp(tail.data(), int(tail.size()));
    EXPECT_EQ(tail[0], 0.0f);
    EXPECT_EQ(tail[1], 0.0f);
    EXPECT_TRUE(std::isnan(tail[2]));
  });
}

// The portable exp (vector_math__generic.h: the generic target's exp, the portable conv rows'
// SiLU), in a loop as theirs (the test is built without -fopenmp-simd; -O3 vectorises it alike).
void portable_exp(float* x, int n) {
  for (int i = 0; i < n; ++i) x[i] = cpu::exp_f32(x[i]);
}

float portable_exp(float x) {
  portable_exp(&x, 1);
  return x;
}

// Its edges: 0 (never a subnormal) below kExpLow, the least float whose exp is normal; +inf past
// ln(FLT_MAX); NaN kept; exp(+-0) = 1 exactly.
TEST(MicroKernels, PortableExpEdges) {
  constexpr float inf = std::numeric_limits<float>::infinity(), tiny = std::numeric_limits<float>::min();
  const float low = cpu::kExpLow, below = std::nextafter(low, -inf);
  EXPECT_LT(std::exp(double(below)), double(tiny)) << "kExpLow is the least float with exp(x) normal";
  EXPECT_GE(std::exp(double(low)), double(tiny));
  EXPECT_EQ(portable_exp(0.0f), 1.0f);
  EXPECT_EQ(portable_exp(-0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(portable_exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(portable_exp(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_GE(portable_exp(low), tiny);
  EXPECT_EQ(portable_exp(below), 0.0f);
  for (float x : {-87.4f, -88.0f, -100.0f, -103.97f, -150.0f, -1736.0f, -1e30f, -std::numeric_limits<float>::max(), -inf}) {
    const float y = portable_exp(x);
    EXPECT_EQ(y, 0.0f) << "exp(" << x << ")";
    EXPECT_FALSE(std::signbit(y)) << "exp(" << x << ")";
  }
  // 88.7228317 is the largest float whose exp is finite (3.40279e38), the next one's is not.
  EXPECT_TRUE(std::isfinite(portable_exp(88.72283172607421875f)));
  EXPECT_GT(portable_exp(88.72283172607421875f), 3.4e38f);
  for (float x : {88.72283935546875f, 88.8f, 89.0f, 89.5f, 100.0f, 1e30f, std::numeric_limits<float>::max(), inf})
    EXPECT_EQ(portable_exp(x), inf) << "exp(" << x << ")";
}

// Its accuracy on a dense sweep of [-88, 89] (every 61st float, all of [-1, 1] near 0's gates
// included at that density): within an ulp of float64 exp where that is normal and finite
// (measured on every float: 0.992 ulp without FMA, 1.024 with it), 0 below, never a subnormal.
TEST(MicroKernels, PortableExpWithinAnUlp) {
#if defined(__FMA__)
  constexpr double bound = 1.03;
#else
  constexpr double bound = 1.0;
#endif
  std::vector<float> x, y;
  for (float v = -88.0f; v < 89.0f;) {
    x.push_back(v);
    for (int i = 0; i < 61; ++i) v = std::nextafter(v, 100.0f);
  }
  y = x;
  portable_exp(y.data(), int(y.size()));
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NE(std::fpclassify(y[i]), FP_SUBNORMAL) << "exp(" << x[i] << ")";
    const double want = std::exp(double(x[i]));
    if (x[i] < cpu::kExpLow) {
      ASSERT_EQ(y[i], 0.0f) << "exp(" << x[i] << ")";
      continue;
    }
    if (want > double(std::numeric_limits<float>::max())) continue;
    const double err = std::abs(double(y[i]) - want) / std::ldexp(1.0, std::ilogb(float(want)) - 23);
    if (err > worst) worst = err, worst_at = i;
  }
  EXPECT_LE(worst, bound) << "at exp(" << x[worst_at] << ") = " << y[worst_at] << ", " << x.size() << " points";
}

TEST(MicroKernels, DotMatchesFloat64) {
  on_every_target([](const cpu::Target& target) {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int n : {1, 2, 15, 16, 17, 31, 32, 33, 128, 255, 256}) {
      std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        a[size_t(i)] = uniform(rng);
        b[size_t(i)] = uniform(rng);
      }
      double want = 0, magnitude = 0;
      for (int i = 0; i < n; ++i) {
        want += double(a[size_t(i)]) * b[size_t(i)];
        magnitude += std::abs(double(a[size_t(i)]) * b[size_t(i)]);
      }
      EXPECT_LE(std::abs(double(target.micro.dot(a.data(), b.data(), n)) - want), (n + 1) * kUnit * magnitude) << "n=" << n;
    }
  });
}

// The diagonal blocks' pairwise factors (n <= 16 tokens, per-channel decays) against float64:
//   A[i, j] = sum_c q[i, c] k[j, c] prod_{j<s<=i} a[s, c]  (j <= i),
//   dq[i] += dA[i, j] F_ij k[j],  dk[j] += dA[i, j] F_ij q[i]  (j < i).
TEST(MicroKernels, DiagonalBlocksMatchFloat64) {
  on_every_target([](const cpu::Target& target) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), decay(0.2f, 1.0f);
    for (int n : {1, 2, 7, 16})
      for (int K : {1, 3, 15, 16, 17, 64, 100, 256}) {
        const int lda = n + 3;
        std::vector<float> q(size_t(n) * K), k(q.size()), a(q.size()), dA(size_t(n) * lda);
        for (size_t e = 0; e < q.size(); ++e) {
          q[e] = uniform(rng);
          k[e] = uniform(rng);
          a[e] = decay(rng);
        }
        for (float& x : dA) x = uniform(rng);
        std::vector<float> A(size_t(n) * lda, kPoison), f((size_t(K) + 15) / 16 * 16);
        std::vector<float> dq(q.size(), 0.5f), dk(q.size(), -0.5f);
        target.micro.diagonal_scores(n, K, q.data(), k.data(), a.data(), A.data(), lda, f.data());
        target.micro.diagonal_gradients(n, K, q.data(), k.data(), a.data(), dA.data(), lda, dq.data(), dk.data(), f.data());
        std::vector<double> want_dq(q.size(), 0.5), want_dk(q.size(), -0.5), mag_dq(q.size(), 0.5),
            mag_dk(q.size(), 0.5);
        for (int i = 0; i < n; ++i)
          for (int j = 0; j <= i; ++j) {
            double score = 0, magnitude = 0;
            for (int c = 0; c < K; ++c) {
              double F = 1;
              for (int s = j + 1; s <= i; ++s) F *= a[size_t(s) * K + c];
              const double term = double(q[size_t(i) * K + c]) * k[size_t(j) * K + c] * F;
              score += term;
              magnitude += std::abs(term);
              if (j == i) continue;
              const double w = dA[size_t(i) * lda + j] * F;
              want_dq[size_t(i) * K + c] += w * k[size_t(j) * K + c];
              want_dk[size_t(j) * K + c] += w * q[size_t(i) * K + c];
              mag_dq[size_t(i) * K + c] += std::abs(w * k[size_t(j) * K + c]);
              mag_dk[size_t(j) * K + c] += std::abs(w * q[size_t(i) * K + c]);
            }
            // The factor is a running product of up to 16 roundings, the sum K + 1.
            ASSERT_LE(std::abs(double(A[size_t(i) * lda + j]) - score), (K + 2 * n + 2) * kUnit * magnitude)
                << "A n=" << n << " K=" << K << " at " << i << "," << j;
          }
        for (size_t e = 0; e < q.size(); ++e) {
          ASSERT_LE(std::abs(double(dq[e]) - want_dq[e]), (3 * n + 4) * kUnit * mag_dq[e]) << "dq n=" << n << " K=" << K;
          ASSERT_LE(std::abs(double(dk[e]) - want_dk[e]), (3 * n + 4) * kUnit * mag_dk[e]) << "dk n=" << n << " K=" << K;
        }
      }
  });
}

}  // namespace
}  // namespace flat::test

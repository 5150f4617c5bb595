// Token outputs streamed past the caches (cpu::Stores::streamed, Params::streamed_outputs): the
// same bytes as cached stores, row by row (rows of whole cache lines streamed, any other row
// stored as a cached one), and through every variant's forward and backward on every target.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "checks.h"
#include "cpu/rows.h"
#include "harness.h"

namespace flat::test {
namespace {

// Rows of every width class (under a line, a line, lines and a part, several lines) at every
// alignment class (on a line, off it by an element, by half a line), bf16 and fp32, scaled and
// not: the streamed row's bytes, and the bytes around it, are the cached row's.
TEST(StreamedRows, SameBytesAsCachedRows) {
  // Normal values across binades, bf16's halfway cases both ways, the largest finite and
  // subnormal floats, signed zeros, infinities and a NaN.
  std::vector<float> src(256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::ldexp(float(i % 37) - 18.3f, int(i % 23) - 11);
  const float kinds[] = {0.0f,
                         -0.0f,
                         1.00390625f,  // halfway between two bf16 values, rounds to the even one below
                         1.01171875f,  // halfway, rounds up to the even one
                         std::numeric_limits<float>::max(),
                         std::numeric_limits<float>::denorm_min(),
                         -std::numeric_limits<float>::min() / 3,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < std::size(kinds); ++i) src[7 * i + 3] = kinds[i];

  int streamed = 0;
  for (DType dtype : {DType::bf16, DType::f32})
    for (int width : {1, 15, 16, 17, 31, 32, 33, 64, 100, 128, 256})
      for (int offset : {0, 2, 4, 32, 64})  // bytes past a line
        for (float scale : {1.0f, 0.37f}) {
          const int64_t bytes = int64_t(width) * (dtype == DType::bf16 ? 2 : 4);
          LineAlignedVector<char> cached(size_t(2 * cpu::kCacheLine + offset + bytes), char(0x5a)), got = cached;
          RowView row;
          row.dtype = dtype;
          row.base = cached.data() + cpu::kCacheLine + offset;
          cpu::store_row(row, 0, 0, 0, src.data(), width, scale);
          row.base = got.data() + cpu::kCacheLine + offset;
          cpu::store_row(row, 0, 0, 0, src.data(), width, scale, cpu::Stores::streamed);
          cpu::finish_streamed_stores();
          streamed += cpu::whole_lines(row.base, bytes);
          EXPECT_EQ(std::memcmp(cached.data(), got.data(), cached.size()), 0)
              << (dtype == DType::bf16 ? "bf16" : "f32") << " width " << width << " offset " << offset << " scale "
              << scale;
        }
  // On a line (offsets 0 and 64) and whole lines (bf16 widths 32, 64, 128, 256; fp32 also 16), at
  // both scales: the rows the streamed stores took.
  EXPECT_EQ(streamed, (4 + 5) * 2 * 2);
}

// Bitwise equality of two outputs (NaN included; an output the variant has not, empty in both).
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), sizeof(double) * a.size()) == 0);
}

// Every variant with its token outputs streamed: the outputs of cached stores, bit for bit, and
// nothing written outside them, on every target this CPU runs. Heads of 32 elements make bf16
// rows of whole lines (the harness's buffers start on one); fp32 y too; odd widths and a fused
// projection's strides make rows that are not, stored as cached ones.
class StreamedOutputs : public ::testing::TestWithParam<Case> {};

TEST_P(StreamedOutputs, SameOutputsAsCachedStores) {
  const Problem problem(GetParam());
  for (const cpu::Target* target : supported_targets()) {
    const KernelOutputs cached = run_kernel(problem, true, 2, *target);
    const KernelOutputs streamed = run_kernel(problem, true, 2, *target, streamed_outputs());
    for (const auto& [name, output] : kKernelOutputs)
      EXPECT_TRUE(same_bits(cached.*output, streamed.*output)) << target->name << ": " << name;
    EXPECT_TRUE(streamed.padding_intact) << target->name;
  }
}

std::vector<Case> cases() {
  return build_sweep(variants_where(any_variant), [](Case& base, const auto& add) {
    base.B = 2;
    base.S = 130;
    base.Nq = base.Nk = base.Nv = base.Ng = base.Nb = base.Nw = 2;
    base.h0 = base.dht = true;
    base.K = base.V = 32;
    fit_gate_group(base);
    add([](Case&) {});
    add([](Case& c) { c.y_f32 = true; });
    add([](Case& c) {
      c.K = 17;
      c.V = 33;
      fit_gate_group(c);
    });
    add([](Case& c) { c.strided = true; });
  });
}

INSTANTIATE_TEST_SUITE_P(EveryVariant, StreamedOutputs, ::testing::ValuesIn(cases()));

}  // namespace
}  // namespace flat::test

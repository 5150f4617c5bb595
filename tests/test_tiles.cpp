// The model of the tile unit (src/cpu/kernels/tiles__model.h) against the SDM's semantics, on cases
// that tell them apart from nearby ones: tdpbf16ps sums each pair's even and odd products in
// separate fp32 accumulators and adds their sum to C last; denormal inputs read as zero and
// denormal results flush; loads and stores move exactly the configured rows and bytes; what
// would fault on the hardware throws.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/kernels/tiles__model.h"

namespace flat::test {
namespace {

using cpu::ModelTiles;
using cpu::TileConfig;

uint16_t bf16_of(float x) {  // x must be a bf16 value
  uint32_t u;
  std::memcpy(&u, &x, 4);
  EXPECT_EQ(u & 0xffffu, 0u) << x << " is not a bf16 value";
  return uint16_t(u >> 16);
}

uint32_t pair(float even, float odd) { return uint32_t(bf16_of(even)) | uint32_t(bf16_of(odd)) << 16; }

// C 1 x 1 (tile 0), A 1 row of `pairs` pairs (tile 1), B `pairs` rows of 1 pair (tile 2).
TileConfig one_element(int pairs) {
  TileConfig config;
  config.rows[0] = 1, config.colsb[0] = 4;
  config.rows[1] = 1, config.colsb[1] = uint16_t(4 * pairs);
  config.rows[2] = uint8_t(pairs), config.colsb[2] = 4;
  return config;
}

// C + sum over pairs of a_even b_even + a_odd b_odd, on the model, for one element.
float dot(float c, const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  ModelTiles::configure(one_element(int(a.size())));
  ModelTiles::load<0>(&c, 4);
  ModelTiles::load<1>(a.data(), 4 * a.size());
  ModelTiles::load<2>(b.data(), 4);
  ModelTiles::dpbf16ps<0, 1, 2>();
  float out = std::numeric_limits<float>::quiet_NaN();
  ModelTiles::store<0>(&out, 4);
  ModelTiles::release();
  return out;
}

TEST(TileModel, EvenAndOddSumsMeetBeforeC) {
  const float big = 16777216.0f;  // 2^24: big + 1 rounds back to big (to even)
  // (even + odd) = 2^24 + 1 rounds to 2^24 before it meets C = -2^24: 0. Adding to C one product
  // at a time (the older pseudo-code) would give 1.
  EXPECT_EQ(dot(-big, {pair(big, 1.0f)}, {pair(1.0f, 1.0f)}), 0.0f);
  // The even products accumulate apart from the odd ones across pairs: even 2^24 - 2^24 = 0 and
  // odd 1 + 1 = 2, so 2; accumulating a pair at a time into one sum would round 2^24 + 1 away.
  EXPECT_EQ(dot(0.0f, {pair(big, 1.0f), pair(-big, 1.0f)}, {pair(1.0f, 1.0f), pair(1.0f, 1.0f)}), 2.0f);
  // Products of bf16 values are exact: (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14.
  const float x = 1.0f + 1.0f / 128;
  EXPECT_EQ(dot(0.0f, {pair(x, 0.0f)}, {pair(x, 0.0f)}), 1.0f + 1.0f / 64 + 1.0f / 16384);
}

TEST(TileModel, DenormalsReadAsZeroAndFlush) {
  uint32_t tiny_bits = 1u << 16;  // the smallest positive bf16 denormal, 2^-133
  float tiny;
  std::memcpy(&tiny, &tiny_bits, 4);
  ASSERT_EQ(std::fpclassify(tiny), FP_SUBNORMAL);
  const float huge = std::ldexp(1.0f, 100);
  // A denormal input reads as zero: not 2^-33.
  EXPECT_EQ(dot(0.0f, {pair(tiny, 0.0f)}, {pair(huge, 0.0f)}), 0.0f);
  // A product below the normal range (2^-130, which fp32 holds as a denormal) flushes to zero.
  EXPECT_EQ(dot(0.0f, {pair(-std::ldexp(1.0f, -70), 0.0f)}, {pair(std::ldexp(1.0f, -60), 0.0f)}), 0.0f);
  // A denormal C reads as zero.
  EXPECT_EQ(dot(std::ldexp(1.0f, -140), {pair(0.0f, 0.0f)}, {pair(0.0f, 0.0f)}), 0.0f);
}

TEST(TileModel, LoadsAndStoresMoveTheConfiguredShape) {
  TileConfig config;
  config.rows[3] = 3, config.colsb[3] = 8;
  ModelTiles::configure(config);
  std::vector<uint8_t> source(5 * 20);
  for (size_t i = 0; i < source.size(); ++i) source[i] = uint8_t(i + 1);
  ModelTiles::load<3>(source.data(), 20);  // rows 0..2, 8 bytes each, 20 apart
  std::vector<uint8_t> out(5 * 12, 0xee);
  ModelTiles::store<3>(out.data(), 12);
  for (int r = 0; r < 5; ++r)
    for (int j = 0; j < 12; ++j)
      EXPECT_EQ(out[size_t(r) * 12 + j], r < 3 && j < 8 ? source[size_t(r) * 20 + j] : 0xee) << r << ", " << j;
  ModelTiles::zero<3>();
  ModelTiles::store<3>(out.data(), 12);
  EXPECT_EQ(out[0], 0) << "tilezero";
  ModelTiles::release();
}

TEST(TileModel, WhatWouldFaultThrows) {
  float row[16] = {};
  EXPECT_THROW(ModelTiles::load<0>(row, 64), std::logic_error) << "before ldtilecfg";
  TileConfig too_tall;
  too_tall.rows[2] = 17;
  EXPECT_THROW(ModelTiles::configure(too_tall), std::logic_error);
  TileConfig palette;
  palette.palette = 2;
  EXPECT_THROW(ModelTiles::configure(palette), std::logic_error);
  TileConfig mismatched = one_element(2);
  mismatched.rows[2] = 1;  // B has 1 pair row where A has 2 pairs
  ModelTiles::configure(mismatched);
  try {
    ModelTiles::dpbf16ps<0, 1, 2>();
    ADD_FAILURE() << "a shape tdpbf16ps faults on";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("tdpbf16ps: shapes C 1x4B, A 1x8B, B 1x4B"), std::string::npos) << e.what();
  }
  ModelTiles::release();
  EXPECT_THROW(ModelTiles::zero<0>(), std::logic_error) << "after tilerelease";
}

}  // namespace
}  // namespace flat::test

// bf16 <-> fp32 conversion, round to nearest even: for the API and validation as for the
// backends' kernels.
#pragma once

#include <cstdint>
#include <cstring>

namespace flat {
// Internal linkage: each translation unit, whatever its target flags, keeps its own copy.
namespace {

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

}  // namespace
}  // namespace flat

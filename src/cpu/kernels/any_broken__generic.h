// The value scan's leaf (src/cpu/values.cpp): whether any of n contiguous elements breaks a rule
// of validate::Values, one branch-free pass in portable C++ that the compiler vectorises with the
// flags of the target unit including it (internal linkage: a copy per target, each target's table
// holding its own, src/cpu/make_target.h). A decode step's state is read again here, so the pass
// runs as wide as the target's vectors.
#pragma once

#include <cstdint>
#include <cstring>

#include "validate.h"

namespace flat::cpu {
namespace {

// Whether the fp32 value with these bits breaks the rule, on the bits alone (the compiler
// vectorises integer tests where float compares with NaN in play stay scalar): finite means an
// exponent below all ones; at most 0 means the sign bit set, or +0.
inline uint32_t breaks(uint32_t bits, validate::Values rule) {
  const uint32_t finite = (bits & 0x7f800000u) != 0x7f800000u;
  const uint32_t nonpositive = (bits >> 31) | (bits == 0u);
  return rule == validate::Values::finite ? finite ^ 1u : (finite & nonpositive) ^ 1u;
}

inline uint32_t bits_of(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}
inline uint32_t bits_of(uint16_t bf16) { return uint32_t(bf16) << 16; }

template <class Element>
bool any_broken__generic(const Element* row, int64_t n, validate::Values rule) {
  uint32_t any = 0;
  for (int64_t c = 0; c < n; ++c) any |= breaks(bits_of(row[c]), rule);
  return any != 0;
}

}  // namespace
}  // namespace flat::cpu

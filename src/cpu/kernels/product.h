// What every product microkernel shares: the triangle a product may skip. Target-independent.
#pragma once

namespace flat::cpu {

// Which part of a matrix product's operands is known to be zero (stored as zeros), so whole
// tiles can be skipped: A(i, p) = 0 for p > i (a_lower) or p < i (a_upper); or only C(i, j) with
// j <= i is wanted (c_lower; tiles entirely above the diagonal are left unwritten).
enum class Triangle { none, a_lower, a_upper, c_lower };

}  // namespace flat::cpu

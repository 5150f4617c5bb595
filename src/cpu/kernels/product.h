// What every product microkernel shares: the descriptor a chunk product is chosen and run by.
// Target-independent.
#pragma once

#include <cstdint>

#include "flat/flat.h"

namespace flat::cpu {

// Which part of a matrix product's operands is known to be zero (stored as zeros), so whole
// tiles can be skipped: A(i, p) = 0 for p > i (a_lower) or p < i (a_upper); or only C(i, j) with
// j <= i is wanted (c_lower; tiles entirely above the diagonal are left unwritten).
enum class Triangle : uint8_t { none, a_lower, a_upper, c_lower };

// What a product's operand holds: any fp32 values, or only bf16 values (the rows of bf16 q, k and
// v as loaded), which a kernel on narrower units (bf16 dot products, tiles) packs without loss.
enum class Operands : uint8_t { f32, bf16_values };

// How A is stored: by rows (A [m, k], row i at a + i * lda) or by columns (A^T stored [k, m],
// column p of A at a + p * lda: the products A^T B of the state update and the backward). And B:
// by rows ([k, n], row p at b + p * ldb) or by columns (B^T stored [n, k], column j at b + j * ldb:
// the products A B^T, for a kernel that packs B and so reads it either way,
// MicroKernels::reads_b_by_columns).
enum class Layout : uint8_t { rows, columns };

// One chunk product C[m, n] (+)= A B, described: a target chooses its
// kernel by it (MicroKernels::gemm) and the kernel runs it. A new operand type or kernel (fp16,
// AMX tiles) is a value here and a target's choice, not a new slot in the table.
struct GemmDesc {
  Operands a_values = Operands::f32;  // what A holds
  Operands b_values = Operands::f32;  // what B holds
  // How a kernel on a bf16 unit takes f32 operands: as sums of bf16 parts (exact) or rounded once
  // (fast); fp32 FMA kernels compute exactly either way.
  Precision precision = Precision::exact;
  // The call's token outputs are bf16 (Chunk::bf16_outputs): at exact precision a product need
  // only be exact far below their rounding (2^-9), so a bf16 unit may take fewer parts.
  bool bf16_outputs = false;
  Layout a = Layout::rows;
  Layout b = Layout::rows;  // by columns only for a kernel that reads B so (MicroKernels::reads_b_by_columns)
  bool accumulate = false;  // C += A B, else C = A B
  Triangle triangle = Triangle::none;
};

// Both operands bf16 values: a bf16 dot-product unit takes the product exactly in one pass.
constexpr bool bf16_operands(const GemmDesc& d) {
  return d.a_values == Operands::bf16_values && d.b_values == Operands::bf16_values;
}

// A product microkernel: the leaf (m, n, k, a, lda, b, ldb, c, ldc) of the product `d` describes;
// no threads, no allocation.
using GemmKernel = void (*)(const GemmDesc& d, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                            float* c, int ldc);

// An operand of bf16 values kept as bf16 (MicroKernels::reads_bf16_rows): the same [rows, cols]
// storage as its fp32 copy would have (rows `ld` apart), as bf16 bits, read by the product in the
// layout the fp32 copy would have (GemmDesc::a, b). Absent: data null.
struct Bf16Rows {
  const uint16_t* data = nullptr;
  int ld = 0;

  bool present() const { return data != nullptr; }
  const uint16_t* at(int i, int j) const { return data + size_t(i) * size_t(ld) + size_t(j); }
};

// One of several products C_p[m_p, n] (+)= A_p B that read the same B (MicroKernels::gemm_shared_b):
// A_p's rows, where A_p and C_p lie, how A_p is stored and its triangle; and A_p kept as bf16, where
// given (then `a` is not read).
struct SharedBProduct {
  int m;
  const float* a;
  int lda;
  float* c;
  int ldc;
  Layout layout = Layout::rows;  // GemmDesc::a
  Triangle triangle = Triangle::none;
  Bf16Rows a_bf16{};
};
// What the products of a shared-B call have in common: GemmDesc but for A's layout and triangle,
// which are each product's own (SharedBProduct), so a call cannot carry one its kernel would ignore.
struct SharedBDesc {
  Operands a_values = Operands::f32;
  Operands b_values = Operands::f32;
  Precision precision = Precision::exact;
  bool bf16_outputs = false;
  Layout b = Layout::rows;
  bool accumulate = false;
};
// The description of one product of a shared-B call `d`.
constexpr GemmDesc product_desc(const SharedBDesc& d, const SharedBProduct& product) {
  return {.a_values = d.a_values,
          .b_values = d.b_values,
          .precision = d.precision,
          .bf16_outputs = d.bf16_outputs,
          .a = product.layout,
          .b = d.b,
          .accumulate = d.accumulate,
          .triangle = product.triangle};
}
// A lone product `d` as a shared-B call of one: the call's part of it (its product's part is
// {m, a, lda, c, ldc, d.a, d.triangle}).
constexpr SharedBDesc call_desc(const GemmDesc& d) {
  return {.a_values = d.a_values,
          .b_values = d.b_values,
          .precision = d.precision,
          .bf16_outputs = d.bf16_outputs,
          .b = d.b,
          .accumulate = d.accumulate};
}
// Products that share B, described by `d` and each its own: a kernel that packs B packs it once for
// all of them. B kept as bf16 where `b_bf16` is given (then `b` is not read).
using GemmSharedBKernel = void (*)(const SharedBDesc& d, int count, const SharedBProduct* products, int n, int k,
                                   const float* b, int ldb, const Bf16Rows& b_bf16);

// The multiply-adds of C[m, n] (+)= A B over k that the product's triangle leaves (the bench's
// product census, the tests' count of the work the passes ask for).
constexpr int64_t product_multiply_adds(const GemmDesc& d, int m, int n, int k) {
  int64_t work = 0;
  for (int i = 0; i < m; ++i) switch (d.triangle) {
      case Triangle::none: work += int64_t(n) * k; break;
      case Triangle::a_lower: work += int64_t(n) * (i + 1 < k ? i + 1 : k); break;
      case Triangle::a_upper: work += int64_t(n) * (k - i > 0 ? k - i : 0); break;
      case Triangle::c_lower: work += int64_t(k) * (i + 1 < n ? i + 1 : n); break;
    }
  return work;
}

// A's element strides (row, column) for its layout.
struct AStrides {
  int row, column;
};
constexpr AStrides a_strides(const GemmDesc& d, int lda) {
  return d.a == Layout::rows ? AStrides{lda, 1} : AStrides{1, lda};
}

// Products that share B run one by one, each on the kernel `choose` picks for it (what a kernel that
// reads B as it lies does with a shared-B call: nothing to pack once). Operands kept as bf16 are not
// read: a target's stages keep them so only where its table reads them (MicroKernels::reads_bf16_rows),
// and then on the kernel that does. Internal linkage, as every kernel: each target's unit compiles
// its own copy with its own flags.
namespace {
template <GemmKernel (*choose)(const GemmDesc&)>
void gemm_each_alone(const SharedBDesc& d, int count, const SharedBProduct* products, int n, int k, const float* b,
                     int ldb, const Bf16Rows&) {
  for (int p = 0; p < count; ++p) {
    const GemmDesc own = product_desc(d, products[p]);
    choose(own)(own, products[p].m, n, k, products[p].a, products[p].lda, b, ldb, products[p].c, products[p].ldc);
  }
}
}  // namespace

// The choice of a target whose one kernel takes every product.
template <GemmKernel kernel>
constexpr GemmKernel every_product(const GemmDesc&) {
  return kernel;
}

}  // namespace flat::cpu

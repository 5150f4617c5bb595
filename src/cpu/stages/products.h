// The chunk products in the three layouts the stages need, described (GemmDesc,
// src/cpu/kernels/product.h) to the target's gemm (Ops::gemm), which runs each on the kernel it
// chooses for the description (bf16 dot products where every operand is a bf16 value, on a
// target that has them). Packing is a step of its own: an
// operand packed once (PackedB) serves any number of products; A B^T lays B^T out in the chunk's
// `packed` panel and multiplies, or, where the target's kernel packs B from its columns (the
// tiles), hands B as it lies.
//
// Everything here has internal linkage (an anonymous namespace): each target's translation unit
// (src/cpu/target_<name>.cpp) compiles its own copy with its own flags, so no out-of-line copy
// built for one instruction set is picked by the linker for another. For the same reason it uses
// no standard-library templates but header-only ones that inline.
#pragma once

#include "cpu/stages/chunk.h"

namespace flat::cpu::stages {
namespace {

// Every product of a chunk runs at the call's precision (Params::precision), for its outputs'
// dtype (Chunk::bf16_outputs).

// `a_values`, `b_values`: what A and B hold (GemmDesc), f32 unless a caller knows better.

// The description of chunk products sharing B (each product's layout and triangle its own) at the
// chunk's precision and outputs' dtype, B stored as `b` says.
inline SharedBDesc chunk_products(const Chunk& ch, Operands a_values, Operands b_values, bool accumulate,
                                  Layout b = Layout::rows) {
  return {.a_values = a_values,
          .b_values = b_values,
          .precision = ch.precision,
          .bf16_outputs = ch.bf16_outputs,
          .b = b,
          .accumulate = accumulate};
}
// Whether products whose A holds `a0` and `a1` run as one call: where A is one kind in both, or at
// Precision::fast, where a product unit takes every operand as one bf16 part whatever it holds
// (and an fp32 unit computes as it does at exact); exact products of two kinds take a call each.
inline bool one_call(const Chunk& ch, Operands a0, Operands a1) {
  return a0 == a1 || ch.precision == Precision::fast;
}
// What A holds in such a call: the one kind, or fp32 for two (true of either).
inline Operands one_call_values(Operands a0, Operands a1) { return a0 == a1 ? a0 : Operands::f32; }

// The description of one chunk product.
inline GemmDesc chunk_product(const Chunk& ch, Operands a_values, Operands b_values, bool accumulate, Triangle tri,
                              Layout a = Layout::rows, Layout b = Layout::rows) {
  return {.a_values = a_values,
          .b_values = b_values,
          .precision = ch.precision,
          .bf16_outputs = ch.bf16_outputs,
          .a = a,
          .b = b,
          .accumulate = accumulate,
          .triangle = tri};
}

// The product `d` describes, on Ops::gemm, or where A or B is kept as bf16 (Bf16Rows: their fp32
// rows not loaded) as a shared-B call of one, whose kernel reads them (MicroKernels::reads_bf16_rows).
template <class Ops>
void gemm_described(const GemmDesc& d, int m, int n, int k, const float* a, int lda, const Bf16Rows& a_bf16,
                    const float* b, int ldb, const Bf16Rows& b_bf16, float* c, int ldc) {
  if (!a_bf16.present() && !b_bf16.present()) {
    Ops::gemm(d, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  const SharedBProduct product{m, a, lda, c, ldc, d.a, d.triangle, a_bf16};
  Ops::gemm_shared_b(call_desc(d), 1, &product, n, k, b, ldb, b_bf16);
}

// C[m, n] (+)= A[m, k] B[k, n], A row-major, B row-major (or stored by columns where `b_layout`
// says so, for a kernel that reads it so: MicroKernels::reads_b_by_columns); either kept as bf16
// where given.
template <class Ops>
void gemm_nn(const Chunk& ch, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate, Triangle tri = Triangle::none, Operands a_values = Operands::f32,
             Operands b_values = Operands::f32, Layout b_layout = Layout::rows, const Bf16Rows& a_bf16 = {},
             const Bf16Rows& b_bf16 = {}) {
  gemm_described<Ops>(chunk_product(ch, a_values, b_values, accumulate, tri, Layout::rows, b_layout), m, n, k, a,
                      lda, a_bf16, b, ldb, b_bf16, c, ldc);
}
// C[m, n] (+)= A^T B with A stored [k, m]; either kept as bf16 where given.
template <class Ops>
void gemm_tn(const Chunk& ch, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate, Triangle tri = Triangle::none, Operands a_values = Operands::f32,
             Operands b_values = Operands::f32, const Bf16Rows& a_bf16 = {}, const Bf16Rows& b_bf16 = {}) {
  gemm_described<Ops>(chunk_product(ch, a_values, b_values, accumulate, tri, Layout::columns), m, n, k, a, lda,
                      a_bf16, b, ldb, b_bf16, c, ldc);
}
// A B operand as the microkernels read it: row-major [k, n] rows at `data`, `ld` apart, or by
// columns (B^T's rows [n, k]) for a kernel that reads it so; kept as bf16 where given.
struct PackedB {
  const float* data;
  int ld;
  Layout layout = Layout::rows;
  Bf16Rows bf16{};
};

// The B of products A B^T, stored [n, k] (B^T's rows), for products of A holding `a_values` (and
// `other_a_values`, where A of a second kind reads it too) on B holding `b_values`: as it lies, by
// columns, where the target's kernel for each of them reads B so (Ops::reads_b_by_columns: the
// tiles pack it from there, with no copy between), else laid out [k, n] in `out` (k * n floats),
// so that the microkernels stream contiguous rows, once for all of them. B kept as bf16 (`bf16`)
// only where the kernels read it by columns: a target that reads rows kept as bf16 reads any
// one-part B by columns (MicroKernels::reads_bf16_rows).
template <class Ops>
PackedB transposed_b(const Chunk& ch, int n, int k, const float* b, int ldb, float* out, Operands b_values,
                     Operands a_values, Operands other_a_values, const Bf16Rows& bf16 = {}) {
  const auto by_columns = [&](Operands a) {
    return Ops::reads_b_by_columns(chunk_products(ch, a, b_values, false, Layout::columns));
  };
  if (by_columns(a_values) && by_columns(other_a_values)) return {b, ldb, Layout::columns, bf16};
  Ops::transpose(n, k, b, ldb, out, n);
  return {out, n, Layout::rows};
}

// C[m, n] (+)= A B with B packed; A kept as bf16 where given.
template <class Ops>
void gemm_packed(const Chunk& ch, int m, int n, int k, const float* a, int lda, PackedB b, float* c, int ldc,
                 bool accumulate, Triangle tri = Triangle::none, Operands a_values = Operands::f32,
                 Operands b_values = Operands::f32, const Bf16Rows& a_bf16 = {}) {
  gemm_nn<Ops>(ch, m, n, k, a, lda, b.data, b.ld, c, ldc, accumulate, tri, a_values, b_values, b.layout, a_bf16,
               b.bf16);
}

// C0 = A0 B and, where A1 is given, C1 = A1 B, B packed (kept as bf16 where it is; A_p [m, k] rows
// lda apart, C_p ldc apart): one call, so a target that packs B packs it once (Ops::gemm_shared_b).
template <class Ops>
void gemm_packed_sharing_b(const Chunk& ch, int m, int n, int k, PackedB b, int lda, const float* a0, float* c0,
                           const float* a1, float* c1, int ldc, Triangle tri = Triangle::none,
                           Operands b_values = Operands::f32, Operands a_values = Operands::f32) {
  const SharedBProduct products[2] = {{m, a0, lda, c0, ldc, Layout::rows, tri},
                                      {m, a1, lda, c1, ldc, Layout::rows, tri}};
  Ops::gemm_shared_b(chunk_products(ch, a_values, b_values, false, b.layout), a1 ? 2 : 1, products, n, k, b.data,
                     b.ld, b.bf16);
}

// C[m, n] (+)= A B^T with B stored [n, k], transposed into the chunk's panel for this one product
// where the kernel does not read it as it lies (transposed_b).
template <class Ops>
void gemm_nt(Chunk& ch, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, bool accumulate, Triangle tri = Triangle::none, Operands a_values = Operands::f32,
             Operands b_values = Operands::f32) {
  gemm_packed<Ops>(ch, m, n, k, a, lda, transposed_b<Ops>(ch, n, k, b, ldb, ch.packed, b_values, a_values, a_values),
                   c, ldc, accumulate, tri, a_values, b_values);
}

// ---- Products of ScaledRows (chunk.h): the rows in the product, their factors on its result or on
// the other operand.

// x [rows, cols] (ld ldx) with row i times f_i (factors along rows) or column j times f_j (along
// columns) into ch.scaled, [rows, cols] dense; x itself when f is null.
struct ScaledOperand {
  const float* data;
  int ld;
  Bf16Rows bf16{};
};
enum class FactorsAlong { rows, columns };
inline ScaledOperand scaled_operand(Chunk& ch, const float* x, int ldx, const float* f, FactorsAlong along, int rows,
                                    int cols) {
  if (!f) return {x, ldx};
  for (int i = 0; i < rows; ++i) {
    const float* xi = x + size_t(i) * ldx;
    float* out = ch.scaled + size_t(i) * cols;
    if (along == FactorsAlong::rows) {
      const float s = f[i];
      for (int j = 0; j < cols; ++j) out[j] = xi[j] * s;
    } else {
      for (int j = 0; j < cols; ++j) out[j] = xi[j] * f[j];
    }
  }
  return {ch.scaled, cols};
}

// C[m, n] = Diag(a.factor) (a.rows B): A's rows [m, K] (ch.K apart, or kept as bf16), B [K, n], C dense
// [m, n].
template <class Ops>
void gemm_scaled_nn(const Chunk& ch, int m, int n, const ScaledRows& a, const float* b, int ldb, float* c) {
  gemm_nn<Ops>(ch, m, n, ch.K, a.rows, ch.K, b, ldb, c, n, false, Triangle::none, a.values, Operands::f32,
               Layout::rows, a.bf16);
  if (a.factor) scale_rows(c, c, a.factor, m, n, 1);
}

// gemm_scaled_nn of a0 into c0 and of a1 into c1 on the same B: one call where their rows can be
// (one_call), so a target that packs B packs it once (Ops::gemm_shared_b).
template <class Ops>
void gemm_scaled_nn_sharing_b(const Chunk& ch, int m, int n, const ScaledRows& a0, float* c0, const ScaledRows& a1,
                              float* c1, const float* b, int ldb) {
  if (!one_call(ch, a0.values, a1.values)) {
    gemm_scaled_nn<Ops>(ch, m, n, a0, b, ldb, c0);
    gemm_scaled_nn<Ops>(ch, m, n, a1, b, ldb, c1);
    return;
  }
  gemm_packed_sharing_b<Ops>(ch, m, n, ch.K, {b, ldb}, ch.K, a0.rows, c0, a1.rows, c1, n, Triangle::none,
                             Operands::f32, one_call_values(a0.values, a1.values));
  if (a0.factor) scale_rows(c0, c0, a0.factor, m, n, 1);
  if (a1.factor) scale_rows(c1, c1, a1.factor, m, n, 1);
}

// C[K, n] (+)= a^T B = a.rows^T (Diag(a.factor) B): A's rows [k, K] (or kept as bf16), B [k, n]
// (holding b_values; or kept as bf16, `b_bf16`); the factors, on the sum's index,
// scale B's rows (in ch.scaled).
template <class Ops>
void gemm_scaled_tn(Chunk& ch, int n, int k, const ScaledRows& a, const float* b, int ldb, Operands b_values,
                    float* c, int ldc, bool accumulate, const Bf16Rows& b_bf16 = {}) {
  ScaledOperand scaled_b{b, ldb, b_bf16};
  if (a.factor && b_bf16.present()) {
    scale_bf16_rows(ch.scaled, b_bf16, a.factor, k, n);
    scaled_b = {ch.scaled, n};
  } else if (a.factor) {
    scaled_b = scaled_operand(ch, b, ldb, a.factor, FactorsAlong::rows, k, n);
  }
  gemm_tn<Ops>(ch, ch.K, n, k, a.rows, ch.K, scaled_b.data, scaled_b.ld, c, ldc, accumulate, Triangle::none, a.values,
               a.factor ? Operands::f32 : b_values, a.bf16, scaled_b.bf16);
}

}  // namespace
}  // namespace flat::cpu::stages

// The multiply-adds the fused passes ask of a target's products, counted: the chunk products and the
// diagonal blocks' kernels of every variant's forward and backward, on the portable target's
// kernels behind a counting table, against the documented formula (chunk_flops,
// tools/bench_model.cpp). A product that leaves out a triangle it could skip (as the backward's
// shared-B products did before 1548b5c), or asks for work the formula does not count, shows here
// though its results are the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "bench_workload.h"
#include "cpu/kernels/conv_rows__generic.h"
#include "cpu/kernels/micro_kernels__generic.h"
#include "cpu/make_target.h"
#include "cpu/on_target.h"
#include "params.h"

namespace flat::test {
namespace {

std::atomic<int64_t> counted_multiply_adds{0};

void counting_gemm(const cpu::GemmDesc& d, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                   float* c, int ldc) {
  counted_multiply_adds += cpu::product_multiply_adds(d, m, n, k);
  cpu::gemm_f32_1xn__generic(d, m, n, k, a, lda, b, ldb, c, ldc);
}
// A block of n tokens: the scores j <= i over K channels; the gradients' pairs j < i into dq and
// into dk, and the pairs i = j, which the stage adds elementwise (gradients, backward.h).
void counting_diagonal_scores(int n, int K, const float* q, const float* k, const float* a, float* A, int lda,
                              float* f) {
  counted_multiply_adds += int64_t(n) * (n + 1) / 2 * K;
  cpu::diagonal_scores_f32_1xk__generic(n, K, q, k, a, A, lda, f);
}
void counting_diagonal_gradients(int n, int K, const float* q, const float* k, const float* a, const float* dA,
                                 int lda, float* dq, float* dk, float* f) {
  counted_multiply_adds += int64_t(n) * (n + 1) * K;
  cpu::diagonal_gradients_f32_1xk__generic(n, K, q, k, a, dA, lda, dq, dk, f);
}

constexpr cpu::MicroKernels kCountingKernels = [] {
  cpu::MicroKernels kernels = cpu::micro_kernels__generic;
  kernels.gemm = cpu::every_product<counting_gemm>;
  kernels.diagonal_scores = counting_diagonal_scores;
  kernels.diagonal_gradients = counting_diagonal_gradients;
  return kernels;
}();
constexpr cpu::Target kCountingTarget = cpu::make_target<kCountingKernels, cpu::conv_generic::ConvRowsGeneric>(
    {.name = "counting"});

// The formula's count but where the products take a strict triangle (tri' = L(L-1)/2 pairs) with
// its diagonal (a triangle of Triangle includes it: tri = L(L+1)/2, L more per column): the delta
// rule's L (formed once in either pass: the backward's state pass keeps the solve for the
// gradient pass), and in the backward dL = dZ R^T and dL's two products back to bt and k; and T,
// L^3/6 in the formula, solved by substitution, scalar code that no product counts (the blocked
// and doubling solves multiply whole blocks of T, more than L^3/6).
double expected_multiply_adds(const VariantInfo& variant, const tool::Shape& shape, bool backward) {
  double total = tool::chunk_flops(variant, shape, backward) / 2;
  if (!variant.is_delta()) return total;
  const double K = double(shape.K), W = double(shape.V * shape.R), items = double(shape.B * shape.key_heads());
  for (int64_t t0 = 0; t0 < shape.S; t0 += shape.chunk) {
    const double L = double(std::min<int64_t>(shape.chunk, shape.S - t0));
    total += items * (L * K - L * L * L / 6 + (backward ? L * W + 2 * L * K : 0));
  }
  return total;
}

TEST(ProductWork, EveryPassAsksWhatTheFormulaCounts) {
  for (const VariantInfo& variant : all_variants())
    for (int64_t S : {int64_t(64), int64_t(150)}) {
      tool::BenchOptions o;
      o.B = 1;
      o.S = S;
      o.N = 4;  // sla packs its 4 value heads of one key head (R = 4)
      o.K = 32;
      o.V = 48;
      o.solve = Solve::substitution;
      tool::Workload w(o, variant.variant);
      const Options options = w.options(o);
      ExecutionContext context;
      context.threads = 1;
      for (bool backward : {false, true}) {
        counted_multiply_adds = 0;
        if (backward)
          cpu::backward_on(kCountingTarget, describe_backward(variant.variant, w.backward_args(), options), context);
        else
          cpu::forward_on(kCountingTarget, describe_forward(variant.variant, w.forward_args(), options), context);
        EXPECT_NEAR(double(counted_multiply_adds), expected_multiply_adds(variant, w.sh, backward), 0.5)
            << variant.name << (backward ? " backward" : " forward") << ", S = " << S;
      }
    }
}

}  // namespace
}  // namespace flat::test

// The in-kernel L2 norm (Options::l2norm_qk: x / sqrt(sum x^2 + eps)) on rows at both ends of
// fp32's range, against the float64 oracle on the same rounded inputs: every variant, both dtypes,
// every target, on the chunkwise path and the decode path, forward and backward (dq and dk go
// through the norm). A row of 1e20 has a sum of squares past fp32's range (it once normalised to
// 0); a row of 1e-20 has squares below it, where eps must keep its meaning; both within one row;
// rows of zeros among ordinary ones. Same bounds as every other comparison with the oracle.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "harness.h"

namespace flat::test {
namespace {

enum class Rows {
  huge,            // every element times 2^67 (1.5e20)
  one_huge,        // one element per row 2^67, the others as drawn (about 1)
  largest,         // one element per row 1.5 * 2^127 (2.6e38, the top binade), the others as drawn
  tiny,            // every element times 2^-66 (1.4e-20): eps outweighs the sum
  tiny_and_small,  // every element times 2^-66, one per row 2^-10 (1e-3): its square near eps
  zero,            // the rows of odd tokens all zero, the others as drawn
};
constexpr Rows kRows[] = {Rows::huge, Rows::one_huge, Rows::largest, Rows::tiny, Rows::tiny_and_small, Rows::zero};
constexpr const char* kRowNames[] = {"huge", "one_huge", "largest", "tiny", "tiny_and_small", "zero"};

// x [B, S, heads, K] edited by `rows`. The drawn values are rounded to fp32 or bf16 and scaled by
// powers of two, and the values set are powers of two or 1.5 times one, so every input stays
// exactly what the kernel reads.
void edit(std::vector<double>& x, Rows rows, int S, int heads, int K) {
  for (size_t r = 0; r < x.size() / size_t(K); ++r) {
    double* row = &x[r * size_t(K)];
    const int t = int(r / size_t(heads)) % S;
    double& one = row[r % size_t(K)];
    switch (rows) {
      case Rows::huge:
        for (int c = 0; c < K; ++c) row[c] = std::ldexp(row[c], 67);
        break;
      case Rows::one_huge: one = std::ldexp(1.0, 67); break;
      case Rows::largest: one = std::ldexp(1.5, 127); break;
      case Rows::tiny:
      case Rows::tiny_and_small:
        for (int c = 0; c < K; ++c) row[c] = std::ldexp(row[c], -66);
        if (rows == Rows::tiny_and_small) one = std::ldexp(1.0, -10);
        break;
      case Rows::zero:
        if (t % 2 == 1)
          for (int c = 0; c < K; ++c) row[c] = 0;
        break;
    }
  }
}

using Param = std::tuple<Variant, Rows>;

class ExtremeL2Norm : public ::testing::TestWithParam<Param> {
 protected:
  // Both dtypes, with q's rows edited and then k's: one tensor at a time, as a gradient that is a
  // product of both at 1e-17 (gdn2's db, at 1e-45) is below anything a float holds. Two
  // sequences of 40 tokens in chunks of 16, q shared by two heads, from a state and with a final
  // state's gradient.
  static void expect_right(const Implementation& implementation) {
    const auto [variant, rows] = GetParam();
    for (DType dtype : {DType::f32, DType::bf16})
      for (const bool keys : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (keys ? ", k edited" : ", q edited"));
        Case c;
        c.variant = variant;
        c.dtype = dtype;
        c.B = 2;
        c.S = 40;
        c.Nq = 1;
        c.Nk = c.Nv = c.Ng = c.Nb = c.Nw = 2;
        c.K = variant == Variant::sla ? 64 : 32;
        c.V = 16;
        c.chunk = 16;
        c.l2norm = c.h0 = c.dht = true;
        fit_gate_group(c);
        Problem p(c);
        if (keys) edit(p.in.k, rows, c.S, c.Nk, c.K);
        else edit(p.in.q, rows, c.S, c.Nq, c.K);
        ErrorsByTarget errors = compare(p, implementation);
        // A row in the top binade has a gradient of about 1/|x| = 4e-39, below fp32's normal
        // range, which bf16 holds to two digits and flush-to-zero not at all: every output is
        // measured but that gradient.
        if (rows == Rows::largest)
          for (auto& [target, e] : errors) (keys ? e.dk : e.dq) = 0;
        expect_within_bounds(errors, dtype);
      }
  }
};

TEST_P(ExtremeL2Norm, Chunkwise) { expect_right(library()); }

TEST_P(ExtremeL2Norm, DecodePath) { expect_right(decode_path()); }

INSTANTIATE_TEST_SUITE_P(EveryVariant, ExtremeL2Norm,
                         ::testing::Combine(::testing::ValuesIn(variants_where(any_variant)), ::testing::ValuesIn(kRows)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(variant_name(std::get<Variant>(info.param))) + "_" +
                                  kRowNames[int(std::get<Rows>(info.param))];
                         });

}  // namespace
}  // namespace flat::test

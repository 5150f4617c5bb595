// Test harness of the output norm and gate: a case (shape, dtypes, options), and its random
// inputs rounded to their dtypes, as float64 for the oracle; shared by the kernels' tests
// (test_norm.cpp) and `flat run norm_gate`'s (test_norm_cli.cpp).
#pragma once

#include <cstdint>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "checks.h"
#include "flat/flat.h"
#include "ref/norm_reference.h"

namespace flat::test {

struct NormCase {
  DType x_dtype = DType::f32;  // x and dx
  DType g_dtype = DType::f32;  // g and dg
  DType y_dtype = DType::f32;  // y and dy
  int B = 2, S = 5, N = 3, D = 16;
  bool gate = true;
  Activation activation = Activation::silu;
  bool norm_before_gate = true;
  bool strided = false;  // every [B, S, N, D] tensor a view with gaps between heads, rows and batches
  bool weight_per_head = false;  // weight [N, D] instead of [D]
  int threads = 2;
  uint64_t seed = 1;
  double g_scale = 2.0;  // of the gate's inputs
  double x_scale = 1.0;
  bool mixed_magnitudes = false;  // x's elements in turn also times 1e20, 1 and 1e-20

  // Written to a stream: GCC 12 warns (-Wrestrict, a false positive) on "D" + std::to_string(D).
  std::string name() const {
    std::ostringstream s;
    s << "D" << D << "_" << B << "x" << S << "x" << N << "_" << dtype_name(x_dtype) << dtype_name(g_dtype)
      << dtype_name(y_dtype);
    if (gate) s << "_" << activation_name(activation) << (norm_before_gate ? "_normfirst" : "_gatefirst");
    else s << "_nogate";
    if (strided) s << "_strided";
    if (weight_per_head) s << "_headweights";
    if (x_scale != 1.0) s << "_x" << x_scale;
    if (mixed_magnitudes) s << "_mixed";
    return s.str();
  }
};

inline void PrintTo(const NormCase& c, std::ostream* os) { *os << c.name(); }

inline int64_t rows_of(const NormCase& c) { return int64_t(c.B) * c.S * c.N; }

// Random inputs rounded to their dtypes, as the oracle sees them.
struct NormData {
  explicit NormData(const NormCase& cs) : c(cs) {
    std::mt19937_64 rng(c.seed);
    std::normal_distribution<double> normal;
    const size_t n = size_t(rows_of(c)) * size_t(c.D);
    const auto sample = [&](DType dtype, double scale) {
      std::vector<double> v(n);
      for (double& x : v) x = round_to(dtype, scale * normal(rng));
      return v;
    };
    in.x = sample(c.x_dtype, c.x_scale);
    if (c.mixed_magnitudes)
      for (size_t i = 0; i < n; ++i) in.x[i] = round_to(c.x_dtype, in.x[i] * (i % 3 == 0 ? 1e20 : i % 3 == 1 ? 1.0 : 1e-20));
    if (c.gate) in.g = sample(c.g_dtype, c.g_scale);
    in.weight.resize(size_t(c.weight_per_head ? c.N : 1) * size_t(c.D));
    for (double& w : in.weight) w = double(float(1.0 + 0.5 * normal(rng)));
    dy = sample(c.y_dtype, 1.0);
    problem.rows = int(rows_of(c));
    problem.D = c.D;
    problem.N = c.N;
    problem.activation = c.activation;
    problem.norm_before_gate = c.norm_before_gate;
  }

  NormCase c;
  ref::NormGateProblem problem;
  ref::NormGateInputs in;
  std::vector<double> dy;
};

}  // namespace flat::test

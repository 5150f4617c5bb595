// The float64 oracle of the output norm and gate (flat::norm_gate_forward / _backward), row by
// row from the definition: the forward as written in include/flat/flat.h, the backward as the
// chain rule through u, rms(u) and act(g), term by term. Slow and simple on purpose; the kernels
// are tested against it and it is tested against finite differences.
#pragma once

#include <vector>

#include "flat/flat.h"

namespace flat::ref {

struct NormGateProblem {
  int rows = 1, D = 1;  // B * S * N rows of D channels
  int N = 1;            // heads: row r is head r % N
  Activation activation = Activation::silu;
  bool norm_before_gate = true;
  double eps = 1e-5;
};

// Dense row-major: x [rows, D], g [rows, D] or empty (no gate), weight [D] or [N, D] (per head).
struct NormGateInputs {
  std::vector<double> x, g, weight;
};

struct NormGateGradients {
  std::vector<double> dx, dg, dweight;  // dg empty without a gate; dweight in weight's shape
};

std::vector<double> norm_gate_forward(const NormGateProblem& problem, const NormGateInputs& in);
NormGateGradients norm_gate_backward(const NormGateProblem& problem, const NormGateInputs& in,
                                     const std::vector<double>& dy);

}  // namespace flat::ref

// The float64 oracle of the short convolution (flat::conv_forward / conv_backward): the layer
// run one position at a time with its window of the last W-1 inputs as state, and the backward
// as the reverse walk through those steps (the adjoint of each step, not the kernels'
// anti-causal correlation). Slow and simple on purpose; the kernels are tested against it and
// it is tested against finite differences.
#pragma once

#include <vector>

#include "flat/flat.h"

namespace flat::ref {

struct ConvProblem {
  int B = 1, S = 1, C = 1, W = 4;
  Activation activation = Activation::silu;
};

// Dense row-major: x [B, S, C], weight [C, W], bias [C] or empty (none), state0 [B, C, W-1] or
// empty (zeros).
struct ConvInputs {
  std::vector<double> x, weight, bias, state0;
};

struct ConvOutputs {
  std::vector<double> y;      // [B, S, C]
  std::vector<double> state;  // [B, C, W-1]: the last W-1 inputs
};

struct ConvGradients {
  std::vector<double> dx;       // [B, S, C]
  std::vector<double> dweight;  // [C, W]
  std::vector<double> dbias;    // [C] (the gradient a bias would get, also when there is none)
  std::vector<double> dstate0;  // [B, C, W-1] (with respect to state0, or the zero state)
};

ConvOutputs conv_forward(const ConvProblem& problem, const ConvInputs& in);
// dstate: the gradient with respect to the final state, [B, C, W-1]; empty means zero.
ConvGradients conv_backward(const ConvProblem& problem, const ConvInputs& in, const std::vector<double>& dy,
                            const std::vector<double>& dstate);

}  // namespace flat::ref

// Internal description of one output norm-and-gate call (flat::norm_gate_forward / _backward),
// already validated: sizes, options, and every tensor as rows with explicit strides.
#pragma once

#include <cstdint>

#include "flat/flat.h"
#include "params.h"

namespace flat {

struct NormGateParams {
  int B = 0, S = 0, N = 0, D = 0;
  Activation activation = Activation::silu;
  bool norm_before_gate = true;
  float eps = 1e-5f;

  int64_t rows() const { return int64_t(B) * S * N; }

  // [B, S, N, D]: row(b, s, n) is the address of the row's first channel; g, dg absent without a gate.
  RowView x, g, y, dy, dx, dg;
  // weight [D] shared by the heads (weight_rows 1), or [N, D] (weight_rows N): head n's weights at
  // weight + (n % weight_rows) * D; dweight (backward) alike.
  int weight_rows = 1;
  const float* weight = nullptr;
  float* dweight = nullptr;

  const float* weight_of(int64_t n) const { return weight + (n % weight_rows) * int64_t(D); }
};

// Validate exactly as the public entry points do (throwing flat::Error, writing nothing) and
// describe the problem; for internal callers such as the tests and the benchmark.
NormGateParams describe_norm_gate_forward(const NormGateArgs& args, const NormGateOptions& options);
NormGateParams describe_norm_gate_backward(const NormGateBackwardArgs& args, const NormGateOptions& options);

}  // namespace flat

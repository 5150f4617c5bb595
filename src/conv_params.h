// Internal description of one short-convolution call (flat::conv_forward / conv_backward),
// already validated: sizes, and every tensor as a base pointer with explicit strides.
#pragma once

#include <cstdint>

#include "flat/flat.h"
#include "params.h"

namespace flat {

struct ConvParams {
  int B = 0, S = 0, C = 0, W = 0;
  Activation activation = Activation::silu;

  // [B, S, C]: row(b, t, c) is the address of element c of position t in batch b.
  RowView x, y, dy, dx;
  // [B, C, W-1] fp32: row(b, c, j) is the address of element j of channel c; absent if not given.
  RowView state0, state, dstate, dstate0;
  // weight[c * weight_stride + w], bias[c] (null when absent), fp32.
  const float* weight = nullptr;
  int64_t weight_stride = 0;
  const float* bias = nullptr;
  // Backward outputs: dweight[c * dweight_stride + w], dbias[c] (null when not wanted).
  float* dweight = nullptr;
  int64_t dweight_stride = 0;
  float* dbias = nullptr;
  // With sequences, state0 and state are [num_seqs, C, W-1] or pools addressed through them,
  // dstate and dstate0 [num_seqs, C, W-1].
  SequenceLayout sequences;
  TokenStates token_states;  // a problem of one sequence (B = 1) that keeps its tokens' states
};

// Validate exactly as the public entry points do (throwing flat::Error, writing nothing) and
// describe the problem; for internal callers such as the tests and the benchmark.
ConvParams describe_conv_forward(const ConvArgs& args, const ConvOptions& options);
ConvParams describe_conv_backward(const ConvBackwardArgs& args, const ConvOptions& options);
// The same for the inputs shared by both passes alone (flat::output_shapes); final_states: the
// call writes final states (a forward, which may take final_state_indices).
ConvParams describe_conv_inputs(const ConvInputs& inputs, const ConvOptions& options, bool final_states);

}  // namespace flat

// The public entry points of the short convolution: validate every argument, describe the
// problem as ConvParams (src/conv_params.h), then hand it to the tensors' backend (the CPU's: src/cpu/conv.*).
// Nothing is written before validation has passed. Messages follow src/api.cpp:
// "flat: <tensor>: <what was expected>, got <what came>".
#include <algorithm>
#include <climits>
#include <sstream>
#include <vector>

#include "backend.h"
#include "conv_params.h"
#include "flat/flat.h"
#include "operations.h"
#include "validate.h"

namespace flat {

namespace {

using validate::Axis;
using validate::check_dtype;
using validate::check_tensor;
using validate::fail;
using validate::shape_string;

constexpr int kMaxTaps = 8;

void check_f32(const std::string& name, const Tensor& t, const std::vector<Axis>& axes, const char* why) {
  check_tensor(name, t, axes);
  check_dtype(name, t, DType::f32, why);
}

// The state tensors: [B, C, W-1] fp32 when W > 1 (one row per sequence, or a pool the indices
// address: flat::Sequences); with W = 1 there is no state to pass.
void check_state(const std::string& name, const Tensor& t, const ConvParams& p, const Sequences& s, bool pool = false) {
  if (p.W == 1) fail(name, "W = 1 keeps no state (W-1 = 0 inputs), expected no tensor, got shape " + shape_string(t));
  check_f32(name, t, {validate::state_axis(s, p.B, pool), {"C", p.C}, {"W-1", p.W - 1}}, " (states are fp32)");
}

void check_sequence(const std::string& name, const Tensor& t, const ConvParams& p) {
  check_tensor(name, t, {{"B", p.B}, {"S", p.S}, {"C", p.C}});
}

}  // namespace

ConvParams describe_conv_inputs(const ConvInputs& in, const ConvOptions& options, bool final_states) {
  ConvParams p;
  check_tensor("x", in.x, {{"B", validate::kAnyOrEmpty}, {"S", validate::kAnyOrEmpty}, {"C", -1}});
  p.B = int(in.x.shape[0]);
  p.S = int(in.x.shape[1]);
  p.C = int(in.x.shape[2]);
  validate::check_sequences(in.sequences, "x", p.B, p.S, final_states);
  if (!in.weight.present()) fail("weight", "required tensor is missing");
  if (in.weight.rank == 2 && in.weight.shape[1] > kMaxTaps)
    fail("weight", "W = " + std::to_string(in.weight.shape[1]) + " taps is not supported (1 to " +
                       std::to_string(kMaxTaps) + ")");
  check_f32("weight", in.weight, {{"C", p.C}, {"W", -1}}, " (weights are fp32)");
  p.W = int(in.weight.shape[1]);
  if (in.bias.present()) check_f32("bias", in.bias, {{"C", p.C}}, " (the bias is fp32)");
  const std::span<const int64_t> state0_indices = in.sequences.initial_state_indices;
  if (in.state0.present()) check_state("state0", in.state0, p, in.sequences, !state0_indices.empty());
  validate::check_indices("initial_state_indices", state0_indices, {"state0", &in.state0});
  if (options.activation != Activation::none && options.activation != Activation::silu)
    fail("options.activation", "the convolution takes none or silu, got " + std::string(activation_name(options.activation)));

  p.activation = options.activation;
  p.x = rows_of(in.x);
  p.state0 = rows_of(in.state0);
  p.weight = static_cast<const float*>(in.weight.data);
  p.weight_stride = in.weight.stride[0];
  p.bias = static_cast<const float*>(in.bias.data);
  p.sequences = SequenceLayout(in.sequences);
  return p;
}

ConvParams describe_conv_forward(const ConvArgs& a, const ConvOptions& options) {
  ConvParams p = describe_conv_inputs(a, options, true);
  check_sequence("y", a.y, p);
  if (a.state.present()) check_state("state", a.state, p, a.sequences, validate::writes_pool(a.sequences));
  validate::check_pool_writes(a.sequences, p.B, p.S, {"state0", &a.state0}, {"state", &a.state});
  validate::check_no_overlap(named_tensors(a, Tensors::outputs), named_tensors(a, Tensors::inputs),
                             {{"state", "state0"}});
  p.y = rows_of(a.y);
  p.state = rows_of(a.state);
  return p;
}

ConvParams describe_conv_backward(const ConvBackwardArgs& a, const ConvOptions& options) {
  ConvParams p = describe_conv_inputs(a, options, false);
  check_sequence("dy", a.dy, p);
  if (a.dstate.present()) check_state("dstate", a.dstate, p, a.sequences);
  check_sequence("dx", a.dx, p);
  check_dtype("dx", a.dx, a.x.dtype, " (the dtype of x)");
  check_f32("dweight", a.dweight, {{"C", p.C}, {"W", p.W}}, " (weights are fp32)");
  if (a.bias.present()) {
    check_f32("dbias", a.dbias, {{"C", p.C}}, " (the bias is fp32)");
  } else if (a.dbias.present()) {
    fail("dbias", "given, but there is no bias");
  }
  if (a.dstate0.present()) check_state("dstate0", a.dstate0, p, a.sequences);
  validate::check_no_overlap(named_tensors(a, Tensors::outputs), named_tensors(a, Tensors::inputs));
  p.dy = rows_of(a.dy);
  p.dstate = rows_of(a.dstate);
  p.dx = rows_of(a.dx);
  p.dweight = static_cast<float*>(a.dweight.data);
  p.dweight_stride = a.dweight.stride[0];
  p.dbias = static_cast<float*>(a.dbias.data);
  p.dstate0 = rows_of(a.dstate0);
  return p;
}

void conv_forward(const ConvArgs& args, const ConvOptions& options, const ExecutionContext& context) {
  const ConvParams p = describe_conv_forward(args, options);
  const Backend& backend = backend_for_call(named_tensors(args, Tensors::all), context);
  backend.conv_forward(p, context);
}

void conv_backward(const ConvBackwardArgs& args, const ConvOptions& options, const ExecutionContext& context) {
  const ConvParams p = describe_conv_backward(args, options);
  const Backend& backend = backend_for_call(named_tensors(args, Tensors::all), context);
  backend.conv_backward(p, context);
}

}  // namespace flat

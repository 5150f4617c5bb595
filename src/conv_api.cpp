// The public entry points of the short convolution: validate every argument, describe the
// problem as ConvParams (src/conv/conv_params.h), then hand it to the kernels (src/conv/).
// Nothing is written before validation has passed. Messages follow src/api.cpp:
// "flat: <tensor>: <what was expected>, got <what came>".
#include <algorithm>
#include <climits>
#include <sstream>
#include <thread>
#include <vector>

#include "conv/conv.h"
#include "conv/conv_params.h"
#include "flat/flat.h"

namespace flat {

std::string_view activation_name(Activation activation) { return activation == Activation::silu ? "silu" : "none"; }

Activation parse_activation(std::string_view name) {
  for (Activation a : {Activation::none, Activation::silu})
    if (activation_name(a) == name) return a;
  throw Error("flat: unknown activation '" + std::string(name) + "' (expected silu or none)");
}

namespace {

constexpr int kMaxTaps = 8;

[[noreturn]] void fail(const std::string& tensor, const std::string& what) {
  throw Error("flat: " + tensor + ": " + what);
}

std::string shape_string(const Tensor& t) {
  std::ostringstream s;
  s << "[";
  for (int d = 0; d < t.rank; ++d) s << (d ? ", " : "") << t.shape[size_t(d)];
  s << "]";
  return s.str();
}

struct Axis {
  const char* name;
  int64_t size;  // -1: any size from 1
};

std::string expected_string(const std::vector<Axis>& axes) {
  std::ostringstream s;
  s << "[";
  for (size_t d = 0; d < axes.size(); ++d) {
    s << (d ? ", " : "") << axes[d].name;
    if (axes[d].size >= 0) s << "=" << axes[d].size;
  }
  s << "]";
  return s.str();
}

// A present tensor that is a usable view of the expected shape, with a contiguous last axis.
void check_tensor(const std::string& name, const Tensor& t, const std::vector<Axis>& axes) {
  if (!t.present()) fail(name, "required tensor is missing");
  if (t.rank != int(axes.size()))
    fail(name, "expected rank " + std::to_string(axes.size()) + " " + expected_string(axes) + ", got rank " +
                   std::to_string(t.rank) + " " + shape_string(t));
  if (t.data == nullptr) fail(name, "null data pointer");
  for (size_t d = 0; d < axes.size(); ++d) {
    if (t.shape[d] < 1)
      fail(name, std::string("axis ") + axes[d].name + " must be at least 1, got " + std::to_string(t.shape[d]) +
                     " in shape " + shape_string(t));
    if (t.shape[d] > INT_MAX)
      fail(name, std::string("axis ") + axes[d].name + " = " + std::to_string(t.shape[d]) + " is too large");
    if (axes[d].size >= 0 && t.shape[d] != axes[d].size)
      fail(name, "expected shape " + expected_string(axes) + ", got " + shape_string(t));
    if (t.stride[d] < 0) fail(name, std::string("negative stride on axis ") + axes[d].name);
  }
  if (t.stride[axes.size() - 1] != 1)
    fail(name, "the last axis must be contiguous (stride 1), got stride " + std::to_string(t.stride[axes.size() - 1]));
}

void check_dtype(const std::string& name, const Tensor& t, DType expected, const std::string& why) {
  if (t.dtype != expected)
    fail(name,
         "expected dtype " + std::string(dtype_name(expected)) + why + ", got " + std::string(dtype_name(t.dtype)));
}

void check_f32(const std::string& name, const Tensor& t, const std::vector<Axis>& axes, const char* why) {
  check_tensor(name, t, axes);
  check_dtype(name, t, DType::f32, why);
}

// A [B, S, C] or [B, C, W-1] tensor as rows addressed by its first two indices.
RowView rows3(const Tensor& t) {
  RowView r;
  if (!t.present()) return r;
  r.base = static_cast<char*>(t.data);
  r.dtype = t.dtype;
  r.stride0 = t.stride[0];
  r.stride1 = t.stride[1];
  r.stride2 = 1;
  return r;
}

// The state tensors: [B, C, W-1] fp32 when W > 1; with W = 1 there is no state to pass.
void check_state(const std::string& name, const Tensor& t, const ConvParams& p) {
  if (p.W == 1) fail(name, "W = 1 keeps no state (W-1 = 0 inputs), expected no tensor, got shape " + shape_string(t));
  check_f32(name, t, {{"B", p.B}, {"C", p.C}, {"W-1", p.W - 1}}, " (states are fp32)");
}

ConvParams describe_inputs(const ConvInputs& in, const ConvOptions& options) {
  ConvParams p;
  check_tensor("x", in.x, {{"B", -1}, {"S", -1}, {"C", -1}});
  p.B = int(in.x.shape[0]);
  p.S = int(in.x.shape[1]);
  p.C = int(in.x.shape[2]);
  if (!in.weight.present()) fail("weight", "required tensor is missing");
  if (in.weight.rank == 2 && in.weight.shape[1] > kMaxTaps)
    fail("weight", "W = " + std::to_string(in.weight.shape[1]) + " taps is not supported (1 to " +
                       std::to_string(kMaxTaps) + ")");
  check_f32("weight", in.weight, {{"C", p.C}, {"W", -1}}, " (weights are fp32)");
  p.W = int(in.weight.shape[1]);
  if (in.bias.present()) check_f32("bias", in.bias, {{"C", p.C}}, " (the bias is fp32)");
  if (in.state0.present()) check_state("state0", in.state0, p);
  if (options.threads < 0) fail("options.threads", "expected 0 (all) or more, got " + std::to_string(options.threads));
  if (options.activation != Activation::none && options.activation != Activation::silu)
    fail("options.activation", "expected none or silu");

  p.activation = options.activation;
  p.threads = options.threads > 0 ? options.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  p.x = rows3(in.x);
  p.state0 = rows3(in.state0);
  p.weight = static_cast<const float*>(in.weight.data);
  p.weight_stride = in.weight.stride[0];
  p.bias = static_cast<const float*>(in.bias.data);
  return p;
}

void check_sequence(const std::string& name, const Tensor& t, const ConvParams& p) {
  check_tensor(name, t, {{"B", p.B}, {"S", p.S}, {"C", p.C}});
}

}  // namespace

ConvParams describe_conv_forward(const ConvArgs& a, const ConvOptions& options) {
  ConvParams p = describe_inputs(a, options);
  check_sequence("y", a.y, p);
  if (a.state.present()) check_state("state", a.state, p);
  p.y = rows3(a.y);
  p.state = rows3(a.state);
  return p;
}

ConvParams describe_conv_backward(const ConvBackwardArgs& a, const ConvOptions& options) {
  ConvParams p = describe_inputs(a, options);
  check_sequence("dy", a.dy, p);
  if (a.dstate.present()) check_state("dstate", a.dstate, p);
  check_sequence("dx", a.dx, p);
  check_dtype("dx", a.dx, a.x.dtype, " (the dtype of x)");
  check_f32("dweight", a.dweight, {{"C", p.C}, {"W", p.W}}, " (weights are fp32)");
  if (a.bias.present()) {
    check_f32("dbias", a.dbias, {{"C", p.C}}, " (the bias is fp32)");
  } else if (a.dbias.present()) {
    fail("dbias", "given, but there is no bias");
  }
  if (a.dstate0.present()) check_state("dstate0", a.dstate0, p);
  p.dy = rows3(a.dy);
  p.dstate = rows3(a.dstate);
  p.dx = rows3(a.dx);
  p.dweight = static_cast<float*>(a.dweight.data);
  p.dweight_stride = a.dweight.stride[0];
  p.dbias = static_cast<float*>(a.dbias.data);
  p.dstate0 = rows3(a.dstate0);
  return p;
}

void conv_forward(const ConvArgs& args, const ConvOptions& options) {
  cpu::conv_forward(describe_conv_forward(args, options));
}

void conv_backward(const ConvBackwardArgs& args, const ConvOptions& options) {
  cpu::conv_backward(describe_conv_backward(args, options));
}

}  // namespace flat

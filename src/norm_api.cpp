// The public entry points of the output norm and gate: validate every argument, describe the
// problem as NormGateParams (src/norm_params.h), then hand it to the tensors' backend.
// Nothing is written before validation has passed. Messages follow src/api.cpp:
// "flat: <tensor>: <what was expected>, got <what came>".
#include <cmath>
#include <string>
#include <vector>

#include "backend.h"
#include "flat/flat.h"
#include "norm_params.h"
#include "operations.h"
#include "validate.h"

namespace flat {
namespace {

using validate::check_dtype;
using validate::check_tensor;
using validate::fail;

void check_rows(const std::string& name, const Tensor& t, const NormGateParams& p) {
  check_tensor(name, t, {{"B", p.B}, {"S", p.S}, {"N", p.N}, {"D", p.D}});
}

// [D], or [N, D] with one row of weights per head; dense.
void check_weight(const std::string& name, const Tensor& t, const NormGateParams& p, int rows) {
  if (rows == 1) check_tensor(name, t, {{"D", p.D}});
  else check_tensor(name, t, {{"N", p.N}, {"D", p.D}});
  check_dtype(name, t, DType::f32, " (the norm's weight is fp32)");
  if (rows > 1 && t.stride[0] != p.D)
    fail(name, "expected contiguous rows (stride " + std::to_string(p.D) + " on axis N), got stride " +
                   std::to_string(t.stride[0]));
}

int weight_rows_of(const Tensor& weight, const NormGateParams& p) {
  if (weight.rank == 2) return p.N;
  return 1;
}

NormGateParams describe_inputs(const NormGateInputs& in, const NormGateOptions& options) {
  NormGateParams p;
  check_tensor("x", in.x, {{"B", validate::kAnyOrEmpty}, {"S", validate::kAnyOrEmpty}, {"N", validate::kAnyOrEmpty},
                           {"D", -1}});
  p.B = int(in.x.shape[0]);
  p.S = int(in.x.shape[1]);
  p.N = int(in.x.shape[2]);
  p.D = int(in.x.shape[3]);
  if (in.g.present()) check_rows("g", in.g, p);
  if (!in.weight.present()) fail("weight", "required tensor is missing");
  p.weight_rows = weight_rows_of(in.weight, p);
  check_weight("weight", in.weight, p, p.weight_rows);
  const Activation a = options.activation;
  if (a != Activation::none && a != Activation::silu && a != Activation::sigmoid)
    fail("options.activation", "expected none, silu or sigmoid, got value " + std::to_string(int(a)));
  if (!std::isfinite(options.eps) || options.eps <= 0.0f)
    fail("options.eps", "expected a finite value > 0, got " + std::to_string(options.eps));
  p.activation = a;
  p.norm_before_gate = options.norm_before_gate;
  p.eps = options.eps;
  p.x = rows_of(in.x);
  p.g = rows_of(in.g);
  p.weight = static_cast<const float*>(in.weight.data);
  return p;
}

}  // namespace

NormGateParams describe_norm_gate_forward(const NormGateArgs& a, const NormGateOptions& options) {
  NormGateParams p = describe_inputs(a, options);
  check_rows("y", a.y, p);
  validate::check_no_overlap(named_tensors(a, Tensors::outputs), named_tensors(a, Tensors::inputs));
  p.y = rows_of(a.y);
  return p;
}

NormGateParams describe_norm_gate_backward(const NormGateBackwardArgs& a, const NormGateOptions& options) {
  NormGateParams p = describe_inputs(a, options);
  check_rows("dy", a.dy, p);
  check_rows("dx", a.dx, p);
  check_dtype("dx", a.dx, a.x.dtype, " (the dtype of x)");
  if (a.g.present()) {
    check_rows("dg", a.dg, p);
    check_dtype("dg", a.dg, a.g.dtype, " (the dtype of g)");
  } else if (a.dg.present()) {
    fail("dg", "given, but there is no g");
  }
  check_weight("dweight", a.dweight, p, p.weight_rows);
  validate::check_no_overlap(named_tensors(a, Tensors::outputs), named_tensors(a, Tensors::inputs));
  p.dy = rows_of(a.dy);
  p.dx = rows_of(a.dx);
  p.dg = rows_of(a.dg);
  p.dweight = static_cast<float*>(a.dweight.data);
  return p;
}

void norm_gate_forward(const NormGateArgs& args, const NormGateOptions& options, const ExecutionContext& context) {
  const NormGateParams p = describe_norm_gate_forward(args, options);
  const Backend& backend = backend_for_call(named_tensors(args, Tensors::all), context);
  backend.norm_gate_forward(p, context);
}

void norm_gate_backward(const NormGateBackwardArgs& args, const NormGateOptions& options,
                        const ExecutionContext& context) {
  const NormGateParams p = describe_norm_gate_backward(args, options);
  const Backend& backend = backend_for_call(named_tensors(args, Tensors::all), context);
  backend.norm_gate_backward(p, context);
}

}  // namespace flat

// flat_oracle: the library's float64 oracles (src/ref/), token by token, on dense numpy arrays, for
// the Python tests to check flat.torch and flat.jax against. Built beside the wheel when
// FLAT_ORACLE is on (scripts/test.sh), never installed with it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "flat/flat.h"
#include "ref/conv_reference.h"
#include "ref/norm_reference.h"
#include "ref/reference.h"

namespace nb = nanobind;

namespace flat::python {
namespace {

using Array = nb::ndarray<const double, nb::c_contig, nb::device::cpu>;
using Result = nb::ndarray<nb::numpy, double>;

std::vector<double> vector_of(const std::optional<Array>& a) {
  if (!a) return {};
  return std::vector<double>(a->data(), a->data() + a->size());
}

Result array_of(std::vector<double> values, std::vector<size_t> shape) {
  auto* owned = new std::vector<double>(std::move(values));
  nb::capsule free(owned, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  return Result(owned->data(), shape.size(), shape.data(), free);
}

ref::Problem problem_of(const std::string& variant, const std::vector<int>& sizes, int G, double scale, bool l2norm) {
  // sizes: B, S, Nq, Nk, Nv, Ng, Nb, Nw, K, V
  ref::Problem p;
  p.variant = parse_variant(variant);
  p.B = sizes.at(0);
  p.S = sizes.at(1);
  p.Nq = sizes.at(2);
  p.Nk = sizes.at(3);
  p.Nv = sizes.at(4);
  p.Ng = sizes.at(5);
  p.Nb = sizes.at(6);
  p.Nw = sizes.at(7);
  p.K = sizes.at(8);
  p.V = sizes.at(9);
  p.G = G;
  p.scale = scale;
  p.l2norm = l2norm;
  return p;
}

ref::Inputs inputs_of(const Array& q, const Array& k, const Array& v, const std::optional<Array>& g,
                      const std::optional<Array>& beta, const std::optional<Array>& b, const std::optional<Array>& w,
                      const std::optional<Array>& h0) {
  ref::Inputs in;
  in.q = vector_of(q);
  in.k = vector_of(k);
  in.v = vector_of(v);
  in.g = vector_of(g);
  in.beta = vector_of(beta);
  in.b = vector_of(b);
  in.w = vector_of(w);
  in.h0 = vector_of(h0);
  return in;
}

}  // namespace
}  // namespace flat::python

NB_MODULE(flat_oracle, m) {
  using namespace flat;
  using namespace flat::python;
  m.doc() = "flat's float64 oracles on dense numpy arrays, for the tests";

  m.def(
      "reference_forward",
      [](const std::string& variant, const std::vector<int>& sizes, int G, double scale, bool l2norm, const Array& q,
         const Array& k, const Array& v, const std::optional<Array>& g, const std::optional<Array>& beta,
         const std::optional<Array>& b, const std::optional<Array>& w, const std::optional<Array>& h0) {
        const ref::Problem p = problem_of(variant, sizes, G, scale, l2norm);
        const ref::Outputs out = ref::forward(p, inputs_of(q, k, v, g, beta, b, w, h0));
        const size_t N = size_t(p.N());
        return std::make_tuple(array_of(out.y, {size_t(p.B), size_t(p.S), N, size_t(p.V)}),
                               array_of(out.ht, {size_t(p.B), N, size_t(p.K), size_t(p.V)}));
      },
      nb::arg("variant"), nb::arg("sizes"), nb::arg("G"), nb::arg("scale"), nb::arg("l2norm"), nb::arg("q"),
      nb::arg("k"), nb::arg("v"), nb::arg("g").none(), nb::arg("beta").none(), nb::arg("b").none(),
      nb::arg("w").none(), nb::arg("h0").none(),
      "The float64 oracle's forward on dense inputs: (y, ht).");
  m.def(
      "reference_backward",
      [](const std::string& variant, const std::vector<int>& sizes, int G, double scale, bool l2norm, const Array& q,
         const Array& k, const Array& v, const std::optional<Array>& g, const std::optional<Array>& beta,
         const std::optional<Array>& b, const std::optional<Array>& w, const std::optional<Array>& h0,
         const Array& dy, const std::optional<Array>& dht) {
        const ref::Problem p = problem_of(variant, sizes, G, scale, l2norm);
        const ref::Inputs in = inputs_of(q, k, v, g, beta, b, w, h0);
        const ref::Gradients d = ref::backward(p, in, vector_of(dy), vector_of(dht));
        const auto like = [](const std::vector<double>& grad, const std::optional<Array>& input) {
          std::vector<size_t> shape;
          if (input)
            for (size_t i = 0; i < input->ndim(); ++i) shape.push_back(input->shape(i));
          return input ? std::optional<Result>(array_of(grad, shape)) : std::nullopt;
        };
        const size_t N = size_t(p.N());
        return std::make_tuple(like(d.dq, q).value(), like(d.dk, k).value(), like(d.dv, v).value(), like(d.dg, g),
                               like(d.dbeta, beta), like(d.db, b), like(d.dw, w),
                               array_of(d.dh0, {size_t(p.B), N, size_t(p.K), size_t(p.V)}));
      },
      nb::arg("variant"), nb::arg("sizes"), nb::arg("G"), nb::arg("scale"), nb::arg("l2norm"), nb::arg("q"),
      nb::arg("k"), nb::arg("v"), nb::arg("g").none(), nb::arg("beta").none(), nb::arg("b").none(),
      nb::arg("w").none(), nb::arg("h0").none(), nb::arg("dy"), nb::arg("dht").none(),
      "The float64 oracle's backward: (dq, dk, dv, dg, dbeta, db, dw, dh0), None for absent inputs.");
  m.def(
      "reference_conv",
      [](int B, int S, int C, int W, const std::string& activation, const Array& x, const Array& weight,
         const std::optional<Array>& bias, const std::optional<Array>& state0, const Array& dy,
         const std::optional<Array>& dstate) {
        ref::ConvProblem p;
        p.B = B;
        p.S = S;
        p.C = C;
        p.W = W;
        p.activation = parse_activation(activation);
        ref::ConvInputs in;
        in.x = vector_of(x);
        in.weight = vector_of(weight);
        in.bias = vector_of(bias);
        in.state0 = vector_of(state0);
        const ref::ConvOutputs out = ref::conv_forward(p, in);
        const ref::ConvGradients d = ref::conv_backward(p, in, vector_of(dy), vector_of(dstate));
        const size_t K = size_t(W - 1);
        return std::make_tuple(array_of(out.y, {size_t(B), size_t(S), size_t(C)}),
                               array_of(out.state, {size_t(B), size_t(C), K}),
                               array_of(d.dx, {size_t(B), size_t(S), size_t(C)}),
                               array_of(d.dweight, {size_t(C), size_t(W)}), array_of(d.dbias, {size_t(C)}),
                               array_of(d.dstate0, {size_t(B), size_t(C), K}));
      },
      nb::arg("B"), nb::arg("S"), nb::arg("C"), nb::arg("W"), nb::arg("activation"), nb::arg("x"),
      nb::arg("weight"), nb::arg("bias").none(), nb::arg("state0").none(), nb::arg("dy"), nb::arg("dstate").none(),
      "The convolution's float64 oracle: (y, state, dx, dweight, dbias, dstate0).");

  m.def(
      "reference_norm_gate",
      [](int rows, int N, int D, const std::string& activation, bool norm_before_gate, double eps, const Array& x,
         const std::optional<Array>& g, const Array& weight, const Array& dy) {
        ref::NormGateProblem p;
        p.rows = rows;
        p.N = N;
        p.D = D;
        p.activation = parse_activation(activation);
        p.norm_before_gate = norm_before_gate;
        p.eps = eps;
        ref::NormGateInputs in;
        in.x = vector_of(x);
        in.g = vector_of(g);
        in.weight = vector_of(weight);
        std::vector<double> y = ref::norm_gate_forward(p, in);
        ref::NormGateGradients d = ref::norm_gate_backward(p, in, vector_of(dy));
        const std::vector<size_t> shape{size_t(rows), size_t(D)};
        return std::make_tuple(array_of(std::move(y), shape), array_of(std::move(d.dx), shape),
                               g ? std::optional<Result>(array_of(std::move(d.dg), shape)) : std::nullopt,
                               array_of(std::move(d.dweight), {d.dweight.size() / size_t(D), size_t(D)}));
      },
      nb::arg("rows"), nb::arg("N"), nb::arg("D"), nb::arg("activation"), nb::arg("norm_before_gate"), nb::arg("eps"), nb::arg("x"),
      nb::arg("g").none(), nb::arg("weight"), nb::arg("dy"),
      "The output norm's float64 oracle on [rows, D] arrays, head r % N for row r, weight [D] or [N, D]: (y, dx, "
      "dg or None, dweight as [1 or N, D]).");
}

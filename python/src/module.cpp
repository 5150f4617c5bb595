// flat._core: the library's entry points for Python, on tensors passed as views (data pointer,
// dtype, shape, strides), so PyTorch's tensors and their strided slices are read and written in
// place. The GIL is released while a kernel runs. flat::Error arrives as ValueError (nanobind maps
// std::invalid_argument), with the library's message.
//
// Also: the float64 oracles (for the tests), the variants' table, the CPU target a call runs on,
// and the JAX FFI handlers (jax_ffi.cpp) as capsules.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/targets.h"
#include "flat/flat.h"
#include "host_threads.h"
#include "jax_ffi.h"
#include "options.h"
#include "ref/conv_reference.h"
#include "ref/norm_reference.h"
#include "ref/reference.h"
#include "variants.h"

namespace nb = nanobind;

namespace flat::python {
namespace {

// A tensor as Python passes it: (data pointer, "f32" | "bf16", shape, strides in elements), or
// None for an absent one.
using View = std::tuple<uintptr_t, std::string, std::vector<int64_t>, std::vector<int64_t>>;

DType dtype_of(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  throw Error("flat: dtype " + name + " is not supported (expected float32 or bfloat16)");
}

// A tensor's view; rank 0 is refused, since the library takes a Tensor of rank 0 for an absent
// one (flat.torch names the tensor before this).
Tensor tensor_of(const std::optional<View>& view) {
  if (!view) return {};
  const auto& [data, dtype, shape, strides] = *view;
  if (shape.empty() || shape.size() > 4 || shape.size() != strides.size())
    throw Error("flat: a tensor view: expected rank 1 to 4 with a stride per axis, got rank " +
                std::to_string(shape.size()) + " with " + std::to_string(strides.size()) + " strides");
  Tensor t;
  t.data = reinterpret_cast<void*>(data);
  t.dtype = dtype_of(dtype);
  t.rank = int(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    t.shape[d] = shape[d];
    t.stride[d] = strides[d];
  }
  return t;
}

// How a call runs: on `threads` threads of flat's pool, or of the OpenMP runtime the process has
// loaded ("openmp": PyTorch's intra-op threads when torch was imported first).
ExecutionContext context_of(int threads, const std::string& pool) {
  ExecutionContext context;
  context.threads = threads;
  if (pool == "openmp") context.parallel_for = openmp_parallel_for;
  else if (pool != "flat") throw Error("flat: pool '" + pool + "' is unknown (expected flat or openmp)");
  return context;
}

struct Call {
  Options options;
  ExecutionContext context;
};

Call call_of(std::optional<float> scale, int chunk, bool l2norm, const std::string& solve, int gate_group,
             bool check_values, int threads, const std::string& pool) {
  return {options_of(scale, chunk, l2norm, solve, gate_group, check_values), context_of(threads, pool)};
}

using Opt = std::optional<View>;

// flat::Sequences as Python passes them: cu_seqlens, initial_state_indices, final_state_indices,
// token_state_indices, each a list of integers, empty where not given.
using Ints = std::vector<int64_t>;
using SequenceLists = std::tuple<Ints, Ints, Ints, Ints>;

// A view of the lists, which must outlive the call.
Sequences sequences_of(const SequenceLists& lists) {
  const auto& [cu_seqlens, reads, writes, tokens] = lists;
  return {cu_seqlens, reads, writes, tokens};
}

void forward(const std::string& variant, const View& q, const View& k, const View& v, const Opt& g, const Opt& beta,
             const Opt& b, const Opt& w, const Opt& h0, const View& y, const Opt& ht,
             const SequenceLists& sequences, std::optional<float> scale, int chunk, bool l2norm,
             const std::string& solve, int gate_group, bool check_values, int threads, const std::string& pool) {
  ForwardArgs args;
  args.sequences = sequences_of(sequences);
  args.q = tensor_of(q);
  args.k = tensor_of(k);
  args.v = tensor_of(v);
  args.g = tensor_of(g);
  args.beta = tensor_of(beta);
  args.b = tensor_of(b);
  args.w = tensor_of(w);
  args.h0 = tensor_of(h0);
  args.y = tensor_of(y);
  args.ht = tensor_of(ht);
  const Variant which = parse_variant(variant);
  const Call call = call_of(scale, chunk, l2norm, solve, gate_group, check_values, threads, pool);
  nb::gil_scoped_release unlocked;
  flat::forward(which, args, call.options, call.context);
}

void backward(const std::string& variant, const View& q, const View& k, const View& v, const Opt& g, const Opt& beta,
              const Opt& b, const Opt& w, const Opt& h0, const View& dy, const Opt& dht, const View& dq,
              const View& dk, const View& dv, const Opt& dg, const Opt& dbeta, const Opt& db, const Opt& dw,
              const Opt& dh0, const SequenceLists& sequences, std::optional<float> scale, int chunk, bool l2norm,
              const std::string& solve, int gate_group, bool check_values, int threads, const std::string& pool) {
  BackwardArgs args;
  args.sequences = sequences_of(sequences);
  args.q = tensor_of(q);
  args.k = tensor_of(k);
  args.v = tensor_of(v);
  args.g = tensor_of(g);
  args.beta = tensor_of(beta);
  args.b = tensor_of(b);
  args.w = tensor_of(w);
  args.h0 = tensor_of(h0);
  args.dy = tensor_of(dy);
  args.dht = tensor_of(dht);
  args.dq = tensor_of(dq);
  args.dk = tensor_of(dk);
  args.dv = tensor_of(dv);
  args.dg = tensor_of(dg);
  args.dbeta = tensor_of(dbeta);
  args.db = tensor_of(db);
  args.dw = tensor_of(dw);
  args.dh0 = tensor_of(dh0);
  const Variant which = parse_variant(variant);
  const Call call = call_of(scale, chunk, l2norm, solve, gate_group, check_values, threads, pool);
  nb::gil_scoped_release unlocked;
  flat::backward(which, args, call.options, call.context);
}

void conv_forward(const View& x, const View& weight, const Opt& bias, const Opt& state0, const View& y,
                  const Opt& state, const SequenceLists& sequences, const std::string& activation, int threads,
                  const std::string& pool) {
  ConvArgs args;
  args.sequences = sequences_of(sequences);
  args.x = tensor_of(x);
  args.weight = tensor_of(weight);
  args.bias = tensor_of(bias);
  args.state0 = tensor_of(state0);
  args.y = tensor_of(y);
  args.state = tensor_of(state);
  ConvOptions options;
  options.activation = parse_activation(activation);
  const ExecutionContext context = context_of(threads, pool);
  nb::gil_scoped_release unlocked;
  flat::conv_forward(args, options, context);
}

void conv_backward(const View& x, const View& weight, const Opt& bias, const Opt& state0, const View& dy,
                   const Opt& dstate, const View& dx, const View& dweight, const Opt& dbias, const Opt& dstate0,
                   const SequenceLists& sequences, const std::string& activation, int threads,
                   const std::string& pool) {
  ConvBackwardArgs args;
  args.sequences = sequences_of(sequences);
  args.x = tensor_of(x);
  args.weight = tensor_of(weight);
  args.bias = tensor_of(bias);
  args.state0 = tensor_of(state0);
  args.dy = tensor_of(dy);
  args.dstate = tensor_of(dstate);
  args.dx = tensor_of(dx);
  args.dweight = tensor_of(dweight);
  args.dbias = tensor_of(dbias);
  args.dstate0 = tensor_of(dstate0);
  ConvOptions options;
  options.activation = parse_activation(activation);
  const ExecutionContext context = context_of(threads, pool);
  nb::gil_scoped_release unlocked;
  flat::conv_backward(args, options, context);
}

NormGateOptions norm_gate_options(const std::string& activation, bool norm_before_gate, float eps) {
  NormGateOptions options;
  options.activation = parse_activation(activation);
  options.norm_before_gate = norm_before_gate;
  options.eps = eps;
  return options;
}

void norm_gate_forward(const View& x, const Opt& g, const View& weight, const View& y, const std::string& activation,
                       bool norm_before_gate, float eps, int threads, const std::string& pool) {
  NormGateArgs args;
  args.x = tensor_of(x);
  args.g = tensor_of(g);
  args.weight = tensor_of(weight);
  args.y = tensor_of(y);
  const NormGateOptions options = norm_gate_options(activation, norm_before_gate, eps);
  const ExecutionContext context = context_of(threads, pool);
  nb::gil_scoped_release unlocked;
  flat::norm_gate_forward(args, options, context);
}

void norm_gate_backward(const View& x, const Opt& g, const View& weight, const View& dy, const View& dx,
                        const Opt& dg, const View& dweight, const std::string& activation, bool norm_before_gate,
                        float eps, int threads, const std::string& pool) {
  NormGateBackwardArgs args;
  args.x = tensor_of(x);
  args.g = tensor_of(g);
  args.weight = tensor_of(weight);
  args.dy = tensor_of(dy);
  args.dx = tensor_of(dx);
  args.dg = tensor_of(dg);
  args.dweight = tensor_of(dweight);
  const NormGateOptions options = norm_gate_options(activation, norm_before_gate, eps);
  const ExecutionContext context = context_of(threads, pool);
  nb::gil_scoped_release unlocked;
  flat::norm_gate_backward(args, options, context);
}

// ---- The float64 oracles, on dense numpy arrays ---------------------------------------------

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

NB_MODULE(_core, m) {
  using namespace flat;
  using namespace flat::python;
  m.doc() = "flat's kernels on tensor views; use flat.torch or flat.jax";

  m.def("forward", &python::forward, nb::arg("variant"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g").none(),
        nb::arg("beta").none(), nb::arg("b").none(), nb::arg("w").none(), nb::arg("h0").none(), nb::arg("y"),
        nb::arg("ht").none(), nb::arg("sequences"), nb::arg("scale").none(), nb::arg("chunk"), nb::arg("l2norm"),
        nb::arg("solve"), nb::arg("gate_group"), nb::arg("check_values"), nb::arg("threads"), nb::arg("pool"));
  m.def("backward", &python::backward, nb::arg("variant"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("g").none(), nb::arg("beta").none(), nb::arg("b").none(), nb::arg("w").none(), nb::arg("h0").none(),
        nb::arg("dy"), nb::arg("dht").none(), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dg").none(),
        nb::arg("dbeta").none(), nb::arg("db").none(), nb::arg("dw").none(), nb::arg("dh0").none(),
        nb::arg("sequences"), nb::arg("scale").none(), nb::arg("chunk"), nb::arg("l2norm"), nb::arg("solve"),
        nb::arg("gate_group"), nb::arg("check_values"), nb::arg("threads"), nb::arg("pool"));
  m.def("conv_forward", &python::conv_forward, nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(),
        nb::arg("state0").none(), nb::arg("y"), nb::arg("state").none(), nb::arg("sequences"), nb::arg("activation"),
        nb::arg("threads"), nb::arg("pool"));
  m.def("conv_backward", &python::conv_backward, nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(),
        nb::arg("state0").none(), nb::arg("dy"), nb::arg("dstate").none(), nb::arg("dx"), nb::arg("dweight"),
        nb::arg("dbias").none(), nb::arg("dstate0").none(), nb::arg("sequences"), nb::arg("activation"),
        nb::arg("threads"), nb::arg("pool"));

  m.def("norm_gate_forward", &python::norm_gate_forward, nb::arg("x"), nb::arg("g").none(), nb::arg("weight"),
        nb::arg("y"), nb::arg("activation"), nb::arg("norm_before_gate"), nb::arg("eps"), nb::arg("threads"),
        nb::arg("pool"));
  m.def("norm_gate_backward", &python::norm_gate_backward, nb::arg("x"), nb::arg("g").none(), nb::arg("weight"),
        nb::arg("dy"), nb::arg("dx"), nb::arg("dg").none(), nb::arg("dweight"), nb::arg("activation"),
        nb::arg("norm_before_gate"), nb::arg("eps"), nb::arg("threads"), nb::arg("pool"));
  // The variants' table: name -> (gate, update, default gate group).
  m.def("variants", [] {
    std::vector<std::tuple<std::string, std::string, std::string, int>> out;
    static const char* kGates[] = {"none", "per_sequence", "per_token", "per_channel", "grouped"};
    static const char* kUpdates[] = {"additive", "delta", "erase_write"};
    for (const VariantInfo& v : all_variants())
      out.emplace_back(v.name, kGates[int(v.gate)], kUpdates[int(v.update)], v.default_gate_group);
    return out;
  });
  m.def("solves", [] {
    std::vector<std::string> names;
    for (Solve s : {Solve::automatic, Solve::substitution, Solve::blocked, Solve::doubling})
      names.emplace_back(solve_name(s));
    return names;
  }, "the solves' names, as the library takes them");
  m.def(
      "parse_solve", [](const std::string& name) { parse_solve(name); },
      "ValueError with the library's message where the library takes no solve of this name");
  m.def("target", [] { return std::string(cpu::default_target().name); }, "the CPU target calls run on");
  m.def("last_openmp_team", &last_openmp_team, "threads of the last call run on the OpenMP runtime (tests)");

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

  m.def(
      "jax_ffi_targets",
      [] {
        std::vector<std::pair<std::string, nb::capsule>> out;
        for (const auto& [name, handler] : jax_ffi_handlers()) out.emplace_back(name, nb::capsule(handler));
        return out;
      },
      "The JAX FFI handlers as (name, capsule) pairs; empty when built without jaxlib's headers.");
}

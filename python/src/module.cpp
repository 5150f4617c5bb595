// flat._core: the library's entry points for Python, on tensors passed as views (data pointer,
// dtype, shape, strides), so PyTorch's tensors and their strided slices are read and written in
// place. The GIL is released while a kernel runs. flat::Error arrives as ValueError (nanobind maps
// std::invalid_argument), with the library's message.
//
// Also: the variants' table, the solves' names, the CPU target a call runs on, and the JAX FFI
// handlers (jax_ffi.cpp) as capsules. The float64 oracles are a module of their own for the tests
// (oracle_module.cpp), not shipped.
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
      "jax_ffi_targets",
      [] {
        std::vector<std::pair<std::string, nb::capsule>> out;
        for (const auto& [name, handler] : jax_ffi_handlers()) out.emplace_back(name, nb::capsule(handler));
        return out;
      },
      "The JAX FFI handlers as (name, capsule) pairs; empty when built without jaxlib's headers.");
}

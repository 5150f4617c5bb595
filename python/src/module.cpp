// flat._core: the library's calls by name for Python (flat/call.h), on tensors passed as views
// (data pointer, dtype, shape, strides), so PyTorch's tensors and their strided slices are read
// and written in place. The GIL is released while a kernel runs. flat::Error arrives as ValueError
// (nanobind maps std::invalid_argument), with the library's message, its argument named as the
// Python functions name it (names.h).
//
// Also: the variants' table, the CPU target a call runs on, and the JAX FFI handler (jax_ffi.cpp)
// as a capsule. The float64 oracles are a module of their own for the tests
// (oracle_module.cpp), not shipped.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "flat/call.h"
#include "host_threads.h"
#include "jax_ffi.h"
#include "names.h"

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

using Ints = std::vector<int64_t>;

// flat::Sequences as Python passes them: cu_seqlens, initial_state_indices, final_state_indices,
// token_state_indices, each a list of integers, empty where not given.
using SequenceLists = std::tuple<Ints, Ints, Ints, Ints>;

// A call's options as Python gives them once (flat.torch and flat.jax keep one per set of values):
// by the library's names, checked by the library when made, then passed to output_shapes and call
// as they are, so a call's options are parsed and checked once, not once per entry point.
struct CallOptions {
  NamedOptions named;
};

// Python's option values: a bool, an int, a float or a str; None leaves the option at its default.
NamedOptions options_of(const nb::dict& options) {
  NamedOptions named;
  for (const auto& [key, value] : options) {
    const std::string name = nb::cast<std::string>(key);
    if (value.is_none()) continue;
    if (nb::isinstance<nb::bool_>(value)) named.emplace_back(name, nb::cast<bool>(value));
    else if (nb::isinstance<nb::int_>(value)) named.emplace_back(name, nb::cast<int64_t>(value));
    else if (nb::isinstance<nb::float_>(value)) named.emplace_back(name, nb::cast<double>(value));
    else if (nb::isinstance<nb::str>(value)) named.emplace_back(name, nb::cast<std::string>(value));
    else
      throw Error("flat: " + name + ": expected a bool, an int, a float or a str, got " +
                  nb::cast<std::string>(nb::str(value.type().attr("__name__"))));
  }
  return named;
}

// The options of `operation` from Python's values, refused here (flat::Error naming the option) as
// the call would refuse them.
CallOptions call_options(const std::string& operation, const nb::dict& options) {
  CallOptions parsed{options_of(options)};
  try {
    switch (parse_operation(operation)) {
      case Operation::forward:
      case Operation::backward: recurrence_options(parsed.named); break;
      case Operation::conv_forward:
      case Operation::conv_backward: conv_options(parsed.named); break;
      case Operation::norm_gate_forward:
      case Operation::norm_gate_backward: norm_gate_options(parsed.named); break;
    }
  } catch (const Error& e) {
    throw Error(python_names(e.what()));
  }
  return parsed;
}

// One call of the library by name (flat::call): tensors by their names in the operation's Args
// (None: absent), the options by theirs.
void call(const std::string& operation, const std::string& variant, const std::map<std::string, std::optional<View>>& tensors,
          const SequenceLists& sequences, const CallOptions& options, int threads, const std::string& pool) {
  NamedCall named;
  named.operation = parse_operation(operation);
  if (named.operation == Operation::forward || named.operation == Operation::backward)
    named.variant = parse_variant(variant);
  for (const auto& [name, view] : tensors)
    if (view) named.tensors.emplace_back(name, tensor_of(view));
  const auto& [cu_seqlens, reads, writes, tokens] = sequences;
  named.sequences = {cu_seqlens, reads, writes, tokens};
  named.options = options.named;
  const ExecutionContext context = context_of(threads, pool);
  nb::gil_scoped_release unlocked;
  try {
    flat::call(named, context);
  } catch (const Error& e) {
    throw Error(python_names(e.what()));
  }
}

// A call's outputs as the library describes them (flat::output_shapes): (name, dtype, shape) for
// each, from the inputs' (dtype, shape) by name.
using Described = std::tuple<std::string, std::vector<int64_t>>;

std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>> output_shapes(
    const std::string& operation, const std::string& variant, const std::map<std::string, Described>& inputs,
    int64_t cu_seqlens, bool initial_state_indices, const CallOptions& options) {
  const Operation op = parse_operation(operation);
  const Variant which = op == Operation::forward || op == Operation::backward ? parse_variant(variant) : Variant::la;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, described] : inputs) {
    const auto& [dtype, shape] = described;
    if (shape.empty() || shape.size() > 4)
      throw Error("flat: " + name + ": expected rank 1 to 4, got rank " + std::to_string(shape.size()));
    tensors.emplace_back(name, Tensor::contiguous(nullptr, dtype_of(dtype), shape));
  }
  std::vector<std::pair<std::string_view, Tensor>> shapes;
  try {
    shapes = flat::output_shapes(op, which, tensors, {cu_seqlens, initial_state_indices}, options.named);
  } catch (const Error& e) {
    throw Error(python_names(e.what()));
  }
  std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>> out;
  for (const auto& [name, t] : shapes)
    out.emplace_back(std::string(name), std::string(dtype_name(t.dtype)),
                     std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.rank));
  return out;
}

}  // namespace
}  // namespace flat::python

NB_MODULE(_core, m) {
  using namespace flat;
  using namespace flat::python;
  m.doc() = "flat's kernels on tensor views; use flat.torch or flat.jax";

  nb::class_<CallOptions>(m, "Options", "A call's options, checked (options(operation, values) makes one)");
  m.def("options", &python::call_options, nb::arg("operation"), nb::arg("values"),
        "A call's options from their values by the library's names (None: the default), checked as the call "
        "would check them; call and output_shapes take them");
  m.def(
      "option_names",
      [](const std::string& operation) {
        std::vector<std::string> out;
        for (std::string_view name : option_names(parse_operation(operation))) out.emplace_back(name);
        return out;
      },
      nb::arg("operation"), "The operation's options by the library's names, in its order (flat::option_names)");
  m.def("call", &python::call, nb::arg("operation"), nb::arg("variant"), nb::arg("tensors"), nb::arg("sequences"),
        nb::arg("options"), nb::arg("threads"), nb::arg("pool"),
        "Runs one operation (flat::call): tensors and options by the library's names (flat/call.h)");
  m.def("output_shapes", &python::output_shapes, nb::arg("operation"), nb::arg("variant"), nb::arg("inputs"),
        nb::arg("cu_seqlens"), nb::arg("initial_state_indices"), nb::arg("options"),
        "The outputs a call writes, (name, dtype, shape) each, from its inputs' (dtype, shape) by name and the "
        "sizes of its sequence arrays (flat::output_shapes)");
  m.def(
      "tensor_slots",
      [](const std::string& operation) {
        std::vector<std::pair<std::string, bool>> out;
        for (const TensorSlot& slot : tensor_slots(parse_operation(operation))) out.emplace_back(slot.name, slot.output);
        return out;
      },
      nb::arg("operation"), "The operation's tensors as (name, written) in the order positional front ends pass them");
  // The variants' table: name -> (gate, update, default gate group).
  m.def("variants", [] {
    std::vector<std::tuple<std::string, std::string, std::string, int>> out;
    for (const VariantSummary& v : variant_summaries()) out.emplace_back(v.name, v.gate, v.update, v.default_gate_group);
    return out;
  });
  m.def("precisions", [] {
    std::vector<std::string> out;
    for (Precision p : kPrecisions) out.emplace_back(precision_name(p));
    return out;
  }, "the names precision= takes (flat::Precision), the default first");
  m.def("target", [] { return std::string(cpu_target()); }, "the CPU target calls run on (flat::cpu_target)");
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

// The operations' tensors, one table per Args struct of flat.h, the one place their names are
// written: each tensor's name (flat/call.h's), its field, whether the call writes it, how an output
// is shaped (the shape and dtype of an input, or the problem's values or state) and which inputs'
// values are checked. flat::call binds tensors by name with them and output_shapes shapes the
// outputs by them (src/call.cpp); the entry points take from them the call's inputs and outputs,
// the gradients' inputs and the value checks (src/api.cpp, conv_api.cpp, norm_api.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <iterator>
#include <optional>
#include <vector>

#include "flat/flat.h"
#include "validate.h"

namespace flat {

// How an output's shape and dtype follow from the call: those of its input (a gradient; the
// convolution's and the norm's y); the recurrence's values, [B, S, N, V] in v's dtype (y); a state,
// fp32 [sequences, ...] (the final states and the initial states' gradients).
enum class OutputShape { input, values, state };

template <class Args>
struct TensorField {
  const char* name;
  Tensor Args::*member;
  bool output = false;
  OutputShape shape = OutputShape::input;
  // The input an output follows: its shape and dtype (OutputShape::input), or whether the output is
  // there at all (a state's gradient, there with its state); null for an output always there.
  Tensor Args::*input = nullptr;
  // An input whose values the call checks (Options::check_values; Backend::check_values), and the
  // rule: the gates finite and <= 0, the strengths and the initial state finite.
  std::optional<validate::Values> values = std::nullopt;
};

// TensorTable<Args>::fields: the tensors of the operation that takes Args, in the order positional
// front ends pass them (flat::tensor_slots: the inputs, then the outputs).
template <class Args>
struct TensorTable;

// The inputs an operation's forward and backward share, written once for both tables: the
// recurrence's (ForwardArgs and BackwardArgs hold them as fields of Inputs), the convolution's
// (of ConvInputs) and the output norm's (of NormGateInputs).
template <class A>
constexpr TensorField<A> recurrence_inputs[] = {
    {"q", &A::q},
    {"k", &A::k},
    {"v", &A::v},
    {.name = "g", .member = &A::g, .values = validate::Values::finite_nonpositive},
    {.name = "beta", .member = &A::beta, .values = validate::Values::finite},
    {.name = "b", .member = &A::b, .values = validate::Values::finite},
    {.name = "w", .member = &A::w, .values = validate::Values::finite},
    {.name = "h0", .member = &A::h0, .values = validate::Values::finite},
};
template <class A>
constexpr TensorField<A> conv_inputs[] = {
    {"x", &A::x},
    {"weight", &A::weight},
    {"bias", &A::bias},
    {"state0", &A::state0},
};
template <class A>
constexpr TensorField<A> norm_gate_inputs[] = {
    {"x", &A::x},
    {"g", &A::g},
    {"weight", &A::weight},
};

// A table: the shared inputs, then the operation's own rows.
template <class A, size_t N, size_t M>
constexpr std::array<TensorField<A>, N + M> shared_then(const TensorField<A> (&shared)[N],
                                                       const TensorField<A> (&own)[M]) {
  std::array<TensorField<A>, N + M> out{};
  for (size_t i = 0; i < N; ++i) out[i] = shared[i];
  for (size_t i = 0; i < M; ++i) out[N + i] = own[i];
  return out;
}

template <>
struct TensorTable<ForwardArgs> {
  using A = ForwardArgs;
  static constexpr auto fields = shared_then<A>(recurrence_inputs<A>, {
      {"y", &A::y, true, OutputShape::values},
      {"ht", &A::ht, true, OutputShape::state},
  });
};

template <>
struct TensorTable<BackwardArgs> {
  using A = BackwardArgs;
  static constexpr auto fields = shared_then<A>(recurrence_inputs<A>, {
      {"dy", &A::dy},
      {"dht", &A::dht},
      {"dq", &A::dq, true, OutputShape::input, &A::q},
      {"dk", &A::dk, true, OutputShape::input, &A::k},
      {"dv", &A::dv, true, OutputShape::input, &A::v},
      {"dg", &A::dg, true, OutputShape::input, &A::g},
      {"dbeta", &A::dbeta, true, OutputShape::input, &A::beta},
      {"db", &A::db, true, OutputShape::input, &A::b},
      {"dw", &A::dw, true, OutputShape::input, &A::w},
      {"dh0", &A::dh0, true, OutputShape::state, &A::h0},
  });
};

template <>
struct TensorTable<ConvArgs> {
  using A = ConvArgs;
  static constexpr auto fields = shared_then<A>(conv_inputs<A>, {
      {"y", &A::y, true, OutputShape::input, &A::x},
      {"state", &A::state, true, OutputShape::state},
  });
};

template <>
struct TensorTable<ConvBackwardArgs> {
  using A = ConvBackwardArgs;
  static constexpr auto fields = shared_then<A>(conv_inputs<A>, {
      {"dy", &A::dy},
      {"dstate", &A::dstate},
      {"dx", &A::dx, true, OutputShape::input, &A::x},
      {"dweight", &A::dweight, true, OutputShape::input, &A::weight},
      {"dbias", &A::dbias, true, OutputShape::input, &A::bias},
      {"dstate0", &A::dstate0, true, OutputShape::state, &A::state0},
  });
};

template <>
struct TensorTable<NormGateArgs> {
  using A = NormGateArgs;
  static constexpr auto fields = shared_then<A>(norm_gate_inputs<A>, {
      {"y", &A::y, true, OutputShape::input, &A::x},
  });
};

template <>
struct TensorTable<NormGateBackwardArgs> {
  using A = NormGateBackwardArgs;
  static constexpr auto fields = shared_then<A>(norm_gate_inputs<A>, {
      {"dy", &A::dy},
      {"dx", &A::dx, true, OutputShape::input, &A::x},
      {"dg", &A::dg, true, OutputShape::input, &A::g},
      {"dweight", &A::dweight, true, OutputShape::input, &A::weight},
  });
};

// The name of a field of Args' table (the input an output follows).
template <class Args>
const char* field_name(Tensor Args::*member) {
  for (const TensorField<Args>& field : TensorTable<Args>::fields)
    if (field.member == member) return field.name;
  return nullptr;
}

// A call's tensors by name, as the validation and the backend's choice take them: its inputs (what
// it reads), its outputs, or all of them.
enum class Tensors { inputs, outputs, all };
template <class Args>
std::vector<validate::Named> named_tensors(const Args& args, Tensors which) {
  std::vector<validate::Named> out;
  out.reserve(std::size(TensorTable<Args>::fields));
  for (const TensorField<Args>& field : TensorTable<Args>::fields)
    if (which == Tensors::all || field.output == (which == Tensors::outputs))
      out.push_back({field.name, &(args.*field.member)});
  return out;
}

}  // namespace flat

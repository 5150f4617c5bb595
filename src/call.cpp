// The calls by name (flat/call.h): each operation's tensors and options as tables of names and
// fields, one binder from names to the Args and options structs, one parser of option values.
#include "flat/call.h"

#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <sstream>
#include <type_traits>

#include "conv_params.h"
#include "params.h"

namespace flat {
namespace {

// ---- Option values -----------------------------------------------------------------------------

std::string value_string(const OptionValue& value) {
  std::ostringstream out;
  std::visit(
      [&out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) out << (v ? "true" : "false");
        else if constexpr (std::is_same_v<T, std::string>) out << "'" << v << "'";
        else out << v;
      },
      value);
  return out.str();
}

[[noreturn]] void refuse(std::string_view name, const std::string& what) {
  throw Error("flat: " + std::string(name) + ": " + what);
}

[[noreturn]] void refuse_kind(std::string_view name, const char* kind, const OptionValue& value) {
  refuse(name, std::string("expected ") + kind + ", got " + value_string(value));
}

// A string's whole text as T, or nothing.
template <class T>
std::optional<T> parsed(const std::string& text) {
  T out{};
  const char* end = text.data() + text.size();
  const auto [next, error] = std::from_chars(text.data(), end, out);
  if (text.empty() || error != std::errc() || next != end) return std::nullopt;
  return out;
}

bool flag_of(std::string_view name, const OptionValue& value) {
  if (const bool* b = std::get_if<bool>(&value)) return *b;
  if (const int64_t* i = std::get_if<int64_t>(&value); i && (*i == 0 || *i == 1)) return *i == 1;
  if (const std::string* s = std::get_if<std::string>(&value); s && (*s == "true" || *s == "false"))
    return *s == "true";
  refuse_kind(name, "true or false", value);
}

int integer_of(std::string_view name, const OptionValue& value) {
  std::optional<int64_t> i;
  if (const int64_t* v = std::get_if<int64_t>(&value)) i = *v;
  else if (const std::string* s = std::get_if<std::string>(&value)) i = parsed<int64_t>(*s);
  if (!i) refuse_kind(name, "an integer", value);
  if (*i < std::numeric_limits<int>::min() || *i > std::numeric_limits<int>::max())
    refuse(name, value_string(value) + " is out of range (an int)");
  return int(*i);
}

// A finite float: the scale and the norm's eps are fp32 in the kernels.
float number_of(std::string_view name, const OptionValue& value, const char* unless) {
  std::optional<double> x;
  if (const double* v = std::get_if<double>(&value)) x = *v;
  else if (const int64_t* v = std::get_if<int64_t>(&value)) x = double(*v);
  else if (const std::string* s = std::get_if<std::string>(&value)) x = parsed<double>(*s);
  if (!x || !std::isfinite(*x)) refuse_kind(name, unless, value);
  if (std::abs(*x) > double(std::numeric_limits<float>::max())) {
    std::ostringstream range;
    range << " is out of range (a number from " << std::numeric_limits<float>::lowest() << " to "
          << std::numeric_limits<float>::max() << ")";
    refuse(name, value_string(value) + range.str());
  }
  return float(*x);
}

const std::string& string_of(std::string_view name, const OptionValue& value) {
  const std::string* s = std::get_if<std::string>(&value);
  if (!s) refuse_kind(name, "a name", value);
  return *s;
}

// One of the activations an operation has: the convolution has no sigmoid (flat.h).
Activation activation_of(std::string_view name, const OptionValue& value, std::span<const Activation> allowed) {
  std::string expected;
  for (size_t i = 0; i < allowed.size(); ++i)
    expected += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + std::string(activation_name(allowed[i]));
  const std::string* text = std::get_if<std::string>(&value);
  for (const Activation a : allowed)
    if (text && *text == activation_name(a)) return a;
  refuse_kind(name, expected.c_str(), value);
}

constexpr Activation kConvActivations[] = {Activation::silu, Activation::none};
constexpr Activation kNormGateActivations[] = {Activation::silu, Activation::sigmoid, Activation::none};

// ---- Options by name ------------------------------------------------------------------------------

template <class Struct>
struct OptionField {
  std::string_view name;
  void (*set)(Struct& options, std::string_view name, const OptionValue& value);
};

constexpr OptionField<Options> kRecurrenceOptions[] = {
    {"scale",
     [](Options& o, std::string_view n, const OptionValue& v) {
       o.scale = number_of(n, v, "a finite number, or none for K^-1/2");
     }},
    {"chunk", [](Options& o, std::string_view n, const OptionValue& v) { o.chunk = integer_of(n, v); }},
    {"l2norm_qk", [](Options& o, std::string_view n, const OptionValue& v) { o.l2norm_qk = flag_of(n, v); }},
    {"solve", [](Options& o, std::string_view n, const OptionValue& v) { o.solve = parse_solve(string_of(n, v)); }},
    {"precision",
     [](Options& o, std::string_view n, const OptionValue& v) { o.precision = parse_precision(string_of(n, v)); }},
    {"gate_group", [](Options& o, std::string_view n, const OptionValue& v) { o.gate_group = integer_of(n, v); }},
    {"check_values", [](Options& o, std::string_view n, const OptionValue& v) { o.check_values = flag_of(n, v); }},
};

constexpr OptionField<ConvOptions> kConvOptions[] = {
    {"activation",
     [](ConvOptions& o, std::string_view n, const OptionValue& v) { o.activation = activation_of(n, v, kConvActivations); }},
};

constexpr OptionField<NormGateOptions> kNormGateOptions[] = {
    {"activation",
     [](NormGateOptions& o, std::string_view n, const OptionValue& v) {
       o.activation = activation_of(n, v, kNormGateActivations);
     }},
    {"norm_before_gate",
     [](NormGateOptions& o, std::string_view n, const OptionValue& v) { o.norm_before_gate = flag_of(n, v); }},
    // The kernel divides by sqrt(mean + eps).
    {"eps",
     [](NormGateOptions& o, std::string_view n, const OptionValue& v) {
       o.eps = number_of(n, v, "a finite number > 0");
       if (o.eps <= 0.0f) refuse_kind(n, "a finite number > 0", v);
     }},
};

template <class Struct>
std::string_view name_of(const OptionField<Struct>& field) {
  return field.name;
}

template <class Item>
std::string names_of(std::span<const Item> items) {
  std::string names;
  for (const Item& item : items) names += (names.empty() ? "" : ", ") + std::string(name_of(item));
  return names;
}

// The item of this name, each name given at most once (`seen`: the names so far), and known.
template <class Item>
const Item& find(std::span<const Item> items, std::string_view kind, std::string_view name,
                 std::vector<std::string_view>& seen) {
  for (std::string_view s : seen)
    if (s == name) throw Error("flat: " + std::string(name) + ": " + std::string(kind) + " given twice");
  seen.push_back(name);
  for (const Item& item : items)
    if (name_of(item) == name) return item;
  throw Error("flat: unknown " + std::string(kind) + " '" + std::string(name) + "' (expected " +
              names_of(items) + ")");
}

template <class Struct>
Struct options_from(std::span<const OptionField<Struct>> fields, const NamedOptions& named) {
  Struct options;
  std::vector<std::string_view> seen;
  for (const auto& [name, value] : named) find(fields, "option", name, seen).set(options, name, value);
  return options;
}

// ---- Tensors by name ------------------------------------------------------------------------------

template <class Args>
struct TensorField {
  TensorSlot slot;
  Tensor Args::*member;
};

constexpr TensorField<ForwardArgs> kForwardTensors[] = {
    {{"q", false}, &ForwardArgs::q},       {{"k", false}, &ForwardArgs::k},    {{"v", false}, &ForwardArgs::v},
    {{"g", false}, &ForwardArgs::g},       {{"beta", false}, &ForwardArgs::beta},
    {{"b", false}, &ForwardArgs::b},       {{"w", false}, &ForwardArgs::w},    {{"h0", false}, &ForwardArgs::h0},
    {{"y", true}, &ForwardArgs::y},        {{"ht", true}, &ForwardArgs::ht},
};

constexpr TensorField<BackwardArgs> kBackwardTensors[] = {
    {{"q", false}, &BackwardArgs::q},     {{"k", false}, &BackwardArgs::k},       {{"v", false}, &BackwardArgs::v},
    {{"g", false}, &BackwardArgs::g},     {{"beta", false}, &BackwardArgs::beta}, {{"b", false}, &BackwardArgs::b},
    {{"w", false}, &BackwardArgs::w},     {{"h0", false}, &BackwardArgs::h0},     {{"dy", false}, &BackwardArgs::dy},
    {{"dht", false}, &BackwardArgs::dht}, {{"dq", true}, &BackwardArgs::dq},      {{"dk", true}, &BackwardArgs::dk},
    {{"dv", true}, &BackwardArgs::dv},    {{"dg", true}, &BackwardArgs::dg},      {{"dbeta", true}, &BackwardArgs::dbeta},
    {{"db", true}, &BackwardArgs::db},    {{"dw", true}, &BackwardArgs::dw},      {{"dh0", true}, &BackwardArgs::dh0},
};

constexpr TensorField<ConvArgs> kConvForwardTensors[] = {
    {{"x", false}, &ConvArgs::x},      {{"weight", false}, &ConvArgs::weight}, {{"bias", false}, &ConvArgs::bias},
    {{"state0", false}, &ConvArgs::state0}, {{"y", true}, &ConvArgs::y},        {{"state", true}, &ConvArgs::state},
};

constexpr TensorField<ConvBackwardArgs> kConvBackwardTensors[] = {
    {{"x", false}, &ConvBackwardArgs::x},           {{"weight", false}, &ConvBackwardArgs::weight},
    {{"bias", false}, &ConvBackwardArgs::bias},     {{"state0", false}, &ConvBackwardArgs::state0},
    {{"dy", false}, &ConvBackwardArgs::dy},         {{"dstate", false}, &ConvBackwardArgs::dstate},
    {{"dx", true}, &ConvBackwardArgs::dx},          {{"dweight", true}, &ConvBackwardArgs::dweight},
    {{"dbias", true}, &ConvBackwardArgs::dbias},    {{"dstate0", true}, &ConvBackwardArgs::dstate0},
};

constexpr TensorField<NormGateArgs> kNormGateForwardTensors[] = {
    {{"x", false}, &NormGateArgs::x},
    {{"g", false}, &NormGateArgs::g},
    {{"weight", false}, &NormGateArgs::weight},
    {{"y", true}, &NormGateArgs::y},
};

constexpr TensorField<NormGateBackwardArgs> kNormGateBackwardTensors[] = {
    {{"x", false}, &NormGateBackwardArgs::x},       {{"g", false}, &NormGateBackwardArgs::g},
    {{"weight", false}, &NormGateBackwardArgs::weight}, {{"dy", false}, &NormGateBackwardArgs::dy},
    {{"dx", true}, &NormGateBackwardArgs::dx},      {{"dg", true}, &NormGateBackwardArgs::dg},
    {{"dweight", true}, &NormGateBackwardArgs::dweight},
};

template <class Args>
std::string_view name_of(const TensorField<Args>& field) {
  return field.slot.name;
}

// The slots of a table, for tensor_slots().
template <class Args, size_t n>
std::span<const TensorSlot> slots_of(const TensorField<Args> (&fields)[n]) {
  static const std::vector<TensorSlot> slots = [&fields] {
    std::vector<TensorSlot> out;
    for (const TensorField<Args>& field : fields) out.push_back(field.slot);
    return out;
  }();
  return slots;
}

template <class Args>
Args args_from(std::span<const TensorField<Args>> fields, const NamedCall& call) {
  Args args;
  std::vector<std::string_view> seen;
  for (const auto& [name, tensor] : call.tensors) args.*find(fields, "tensor", name, seen).member = tensor;
  if constexpr (requires { args.sequences; }) {
    args.sequences = call.sequences;
  } else {
    const Sequences& s = call.sequences;
    if (!s.cu_seqlens.empty() || !s.initial_state_indices.empty() || !s.final_state_indices.empty() ||
        !s.token_state_indices.empty())
      throw Error("flat: sequences: " + std::string(operation_name(call.operation)) +
                  " takes no cu_seqlens and no state indices (it has no state), got some");
  }
  return args;
}

constexpr std::string_view kOperationNames[] = {"forward",       "backward",          "conv_forward",
                                                "conv_backward", "norm_gate_forward", "norm_gate_backward"};

template <class Struct>
std::span<const std::string_view> field_names(std::span<const OptionField<Struct>> fields) {
  static const std::vector<std::string_view> names = [fields] {
    std::vector<std::string_view> out;
    for (const OptionField<Struct>& field : fields) out.push_back(field.name);
    return out;
  }();
  return names;
}

// A tensor of this dtype and shape with no data: an output's description.
Tensor shaped(DType dtype, std::initializer_list<int64_t> shape) { return Tensor::contiguous(nullptr, dtype, shape); }

Tensor shaped_like(const Tensor& t) {
  return Tensor::contiguous(nullptr, t.dtype, std::span<const int64_t>(t.shape.data(), size_t(t.rank)));
}

// Any address for a tensor the description reads no element of (validation wants one where a
// tensor has elements).
void* const kNoData = reinterpret_cast<void*>(alignof(std::max_align_t));

}  // namespace

std::string_view operation_name(Operation operation) { return kOperationNames[int(operation)]; }

Operation parse_operation(std::string_view name) {
  for (int i = 0; i < int(std::size(kOperationNames)); ++i)
    if (kOperationNames[i] == name) return Operation(i);
  throw Error("flat: unknown operation '" + std::string(name) +
              "' (expected forward, backward, conv_forward, conv_backward, norm_gate_forward or norm_gate_backward)");
}

std::span<const TensorSlot> tensor_slots(Operation operation) {
  switch (operation) {
    case Operation::forward: return slots_of(kForwardTensors);
    case Operation::backward: return slots_of(kBackwardTensors);
    case Operation::conv_forward: return slots_of(kConvForwardTensors);
    case Operation::conv_backward: return slots_of(kConvBackwardTensors);
    case Operation::norm_gate_forward: return slots_of(kNormGateForwardTensors);
    case Operation::norm_gate_backward: return slots_of(kNormGateBackwardTensors);
  }
  return {};
}

std::span<const std::string_view> option_names(Operation operation) {
  switch (operation) {
    case Operation::forward:
    case Operation::backward: return field_names(std::span<const OptionField<Options>>(kRecurrenceOptions));
    case Operation::conv_forward:
    case Operation::conv_backward: return field_names(std::span<const OptionField<ConvOptions>>(kConvOptions));
    case Operation::norm_gate_forward:
    case Operation::norm_gate_backward:
      return field_names(std::span<const OptionField<NormGateOptions>>(kNormGateOptions));
  }
  return {};
}

Options recurrence_options(const NamedOptions& options) {
  return options_from(std::span<const OptionField<Options>>(kRecurrenceOptions), options);
}

ConvOptions conv_options(const NamedOptions& options) {
  return options_from(std::span<const OptionField<ConvOptions>>(kConvOptions), options);
}

NormGateOptions norm_gate_options(const NamedOptions& options) {
  return options_from(std::span<const OptionField<NormGateOptions>>(kNormGateOptions), options);
}

void call(const NamedCall& c, const ExecutionContext& context) {
  switch (c.operation) {
    case Operation::forward:
      return forward(c.variant, args_from(std::span<const TensorField<ForwardArgs>>(kForwardTensors), c),
                     recurrence_options(c.options), context);
    case Operation::backward:
      return backward(c.variant, args_from(std::span<const TensorField<BackwardArgs>>(kBackwardTensors), c),
                      recurrence_options(c.options), context);
    case Operation::conv_forward:
      return conv_forward(args_from(std::span<const TensorField<ConvArgs>>(kConvForwardTensors), c),
                          conv_options(c.options), context);
    case Operation::conv_backward:
      return conv_backward(args_from(std::span<const TensorField<ConvBackwardArgs>>(kConvBackwardTensors), c),
                           conv_options(c.options), context);
    case Operation::norm_gate_forward:
      return norm_gate_forward(args_from(std::span<const TensorField<NormGateArgs>>(kNormGateForwardTensors), c),
                               norm_gate_options(c.options), context);
    case Operation::norm_gate_backward:
      return norm_gate_backward(
          args_from(std::span<const TensorField<NormGateBackwardArgs>>(kNormGateBackwardTensors), c),
          norm_gate_options(c.options), context);
  }
}


std::vector<std::pair<std::string_view, Tensor>> output_shapes(Operation operation, Variant variant,
                                                               const std::vector<std::pair<std::string, Tensor>>& inputs,
                                                               const SequenceSizes& sizes, const NamedOptions& options) {
  NamedCall c{operation, variant, inputs, {}, options};
  for (auto& [name, tensor] : c.tensors) {
    if (tensor.present() && tensor.data == nullptr) tensor.data = kNoData;
    // Only inputs: an output given here is refused as a name the description does not take.
    for (const TensorSlot& slot : tensor_slots(operation))
      if (slot.name == name && slot.output)
        throw Error("flat: " + name + ": output_shapes takes the inputs, got the output " + name);
  }
  // Sequences of these sizes that any call of them may have: all empty but the last.
  const Tensor* first = nullptr;
  for (const auto& [name, tensor] : c.tensors)
    if (name == "q" || name == "x") first = &tensor;
  const int64_t S = first && first->rank >= 2 ? first->shape[1] : 0;
  const int64_t B = first && first->rank >= 1 ? first->shape[0] : 0;
  std::vector<int64_t> offsets, rows;
  if (sizes.cu_seqlens > 0) {
    offsets.assign(size_t(sizes.cu_seqlens), 0);
    offsets.back() = S;
  }
  if (sizes.initial_state_indices) rows.assign(size_t(sizes.cu_seqlens > 0 ? sizes.cu_seqlens - 1 : B), -1);
  c.sequences = {offsets, rows, {}, {}};

  std::vector<std::pair<std::string_view, Tensor>> out;
  const auto like = [&out](std::string_view name, const Tensor& input) {
    if (input.present()) out.emplace_back(name, shaped_like(input));
  };
  switch (operation) {
    case Operation::forward:
    case Operation::backward: {
      const Inputs in = operation == Operation::forward
                            ? Inputs(args_from(std::span<const TensorField<ForwardArgs>>(kForwardTensors), c))
                            : Inputs(args_from(std::span<const TensorField<BackwardArgs>>(kBackwardTensors), c));
      const Params p = describe_inputs(variant, in, recurrence_options(options), operation == Operation::forward);
      const int64_t count = p.sequences.count(p.B);
      const Tensor state = shaped(DType::f32, {count, p.N, p.K, p.V});
      if (operation == Operation::forward) {
        out.emplace_back("y", shaped(in.v.dtype, {p.B, p.S, p.N, p.V}));
        out.emplace_back("ht", state);
        return out;
      }
      for (const auto& [name, input] : {std::pair{"dq", &in.q}, std::pair{"dk", &in.k}, std::pair{"dv", &in.v},
                                        std::pair{"dg", &in.g}, std::pair{"dbeta", &in.beta}, std::pair{"db", &in.b},
                                        std::pair{"dw", &in.w}})
        like(name, *input);
      if (in.h0.present()) out.emplace_back("dh0", state);
      return out;
    }
    case Operation::conv_forward:
    case Operation::conv_backward: {
      const ConvInputs in =
          operation == Operation::conv_forward
              ? ConvInputs(args_from(std::span<const TensorField<ConvArgs>>(kConvForwardTensors), c))
              : ConvInputs(args_from(std::span<const TensorField<ConvBackwardArgs>>(kConvBackwardTensors), c));
      const ConvParams p = describe_conv_inputs(in, conv_options(options), operation == Operation::conv_forward);
      const int64_t count = p.sequences.count(p.B);
      const bool has_state = p.W > 1;
      if (operation == Operation::conv_forward) {
        like("y", in.x);
        if (has_state) out.emplace_back("state", shaped(DType::f32, {count, p.C, p.W - 1}));
        return out;
      }
      like("dx", in.x);
      like("dweight", in.weight);
      like("dbias", in.bias);
      if (in.state0.present()) out.emplace_back("dstate0", shaped(DType::f32, {count, p.C, p.W - 1}));
      return out;
    }
    case Operation::norm_gate_forward:
    case Operation::norm_gate_backward: {
      norm_gate_options(options);
      const NormGateInputs in =
          operation == Operation::norm_gate_forward
              ? NormGateInputs(args_from(std::span<const TensorField<NormGateArgs>>(kNormGateForwardTensors), c))
              : NormGateInputs(
                    args_from(std::span<const TensorField<NormGateBackwardArgs>>(kNormGateBackwardTensors), c));
      if (operation == Operation::norm_gate_forward) {
        like("y", in.x);
        return out;
      }
      like("dx", in.x);
      like("dg", in.g);
      like("dweight", in.weight);
      return out;
    }
  }
  return out;
}

}  // namespace flat

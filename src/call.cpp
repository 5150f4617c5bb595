// The calls by name (flat/call.h): the operations in one table (name, tensors, options, entry
// point, output shapes), each operation's tensors (src/operations.h) and options as tables of names
// and fields, one binder from names to the Args and options structs, one parser of option values.
#include "flat/call.h"

#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <sstream>
#include <type_traits>

#include "conv_params.h"
#include "operations.h"
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

// An option's or a tensor's name (OptionField, TensorField).
template <class Field>
std::string_view name_of(const Field& field) {
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
Args args_from(const NamedCall& call) {
  Args args;
  std::vector<std::string_view> seen;
  for (const auto& [name, tensor] : call.tensors)
    args.*find(std::span<const TensorField<Args>>(TensorTable<Args>::fields), "tensor", name, seen).member = tensor;
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

template <class Args>
std::span<const TensorSlot> slots_of() {
  static const std::vector<TensorSlot> slots = [] {
    std::vector<TensorSlot> out;
    for (const TensorField<Args>& field : TensorTable<Args>::fields) out.push_back({field.name, field.output});
    return out;
  }();
  return slots;
}

template <const auto& fields>
std::span<const std::string_view> option_names_of() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> out;
    for (const auto& field : fields) out.push_back(field.name);
    return out;
  }();
  return names;
}

// ---- Output shapes --------------------------------------------------------------------------------

using Outputs = std::vector<std::pair<std::string_view, Tensor>>;

// A tensor of this dtype and shape with no data: an output's description.
Tensor shaped(DType dtype, std::initializer_list<int64_t> shape) { return Tensor::contiguous(nullptr, dtype, shape); }

Tensor shaped_like(const Tensor& t) {
  return Tensor::contiguous(nullptr, t.dtype, std::span<const int64_t>(t.shape.data(), size_t(t.rank)));
}

// What the outputs not shaped as an input are shaped as (OutputShape), from the call's inputs,
// validated as the call validates them: the recurrence's values and a state of each family;
// absent where the call keeps no state (the convolution with W = 1). `final_states`: the call
// writes final states (a forward).
struct ProblemShapes {
  Tensor values = {}, state = {};
};

ProblemShapes problem_shapes(const Inputs& in, const NamedCall& c, bool final_states) {
  const Params p = describe_inputs(c.variant, in, recurrence_options(c.options), final_states);
  return {.values = shaped(in.v.dtype, {p.B, p.S, p.N, p.V}),
          .state = shaped(DType::f32, {p.sequences.count(p.B), p.N, p.K, p.V})};
}

ProblemShapes problem_shapes(const ConvInputs& in, const NamedCall& c, bool final_states) {
  const ConvParams p = describe_conv_inputs(in, conv_options(c.options), final_states);
  if (p.W == 1) return {};
  return {.state = shaped(DType::f32, {p.sequences.count(p.B), p.C, p.W - 1})};
}

// The norm's outputs are its inputs' shapes; its inputs are checked by the call.
ProblemShapes problem_shapes(const NormGateInputs&, const NamedCall& c, bool) {
  norm_gate_options(c.options);
  return {};
}

// Any address for a tensor the description reads no element of (validation wants one where a
// tensor has elements).
void* const kNoData = reinterpret_cast<void*>(alignof(std::max_align_t));

// The outputs of a call of Args (flat::output_shapes), in the table's order, from its inputs: each
// output whose input (TensorField::input) is there, shaped as its table says.
template <class Args>
Outputs outputs_of(const NamedCall& call) {
  NamedCall c = call;
  for (auto& [name, tensor] : c.tensors)
    if (tensor.present() && tensor.data == nullptr) tensor.data = kNoData;
  const Args args = args_from<Args>(c);
  constexpr bool final_states = std::is_same_v<Args, ForwardArgs> || std::is_same_v<Args, ConvArgs>;
  const ProblemShapes shapes = problem_shapes(args, c, final_states);
  Outputs out;
  for (const TensorField<Args>& field : TensorTable<Args>::fields) {
    if (!field.output || (field.input && !(args.*field.input).present())) continue;
    const Tensor t = field.shape == OutputShape::input    ? shaped_like(args.*field.input)
                     : field.shape == OutputShape::values ? shapes.values
                                                          : shapes.state;
    if (t.present()) out.emplace_back(field.name, t);
  }
  return out;
}

// ---- The operations -------------------------------------------------------------------------------

// An operation of flat/call.h: its name, its tensors (the table of its Args) and options (its
// options' table), how it runs (flat.h's entry point) and how its outputs are described.
struct OperationEntry {
  Operation operation;
  std::string_view name;
  std::span<const TensorSlot> (*tensor_slots)();
  std::span<const std::string_view> (*option_names)();
  void (*run)(const NamedCall& call, const ExecutionContext& context);
  Outputs (*outputs)(const NamedCall& call);
};

constexpr OperationEntry kOperations[] = {
    {.operation = Operation::forward,
     .name = "forward",
     .tensor_slots = slots_of<ForwardArgs>,
     .option_names = option_names_of<kRecurrenceOptions>,
     .run = [](const NamedCall& c, const ExecutionContext& context) {
       forward(c.variant, args_from<ForwardArgs>(c), recurrence_options(c.options), context);
     },
     .outputs = outputs_of<ForwardArgs>},
    {.operation = Operation::backward,
     .name = "backward",
     .tensor_slots = slots_of<BackwardArgs>,
     .option_names = option_names_of<kRecurrenceOptions>,
     .run = [](const NamedCall& c, const ExecutionContext& context) {
       backward(c.variant, args_from<BackwardArgs>(c), recurrence_options(c.options), context);
     },
     .outputs = outputs_of<BackwardArgs>},
    {.operation = Operation::conv_forward,
     .name = "conv_forward",
     .tensor_slots = slots_of<ConvArgs>,
     .option_names = option_names_of<kConvOptions>,
     .run = [](const NamedCall& c, const ExecutionContext& context) {
       conv_forward(args_from<ConvArgs>(c), conv_options(c.options), context);
     },
     .outputs = outputs_of<ConvArgs>},
    {.operation = Operation::conv_backward,
     .name = "conv_backward",
     .tensor_slots = slots_of<ConvBackwardArgs>,
     .option_names = option_names_of<kConvOptions>,
     .run = [](const NamedCall& c, const ExecutionContext& context) {
       conv_backward(args_from<ConvBackwardArgs>(c), conv_options(c.options), context);
     },
     .outputs = outputs_of<ConvBackwardArgs>},
    {.operation = Operation::norm_gate_forward,
     .name = "norm_gate_forward",
     .tensor_slots = slots_of<NormGateArgs>,
     .option_names = option_names_of<kNormGateOptions>,
     .run = [](const NamedCall& c, const ExecutionContext& context) {
       norm_gate_forward(args_from<NormGateArgs>(c), norm_gate_options(c.options), context);
     },
     .outputs = outputs_of<NormGateArgs>},
    {.operation = Operation::norm_gate_backward,
     .name = "norm_gate_backward",
     .tensor_slots = slots_of<NormGateBackwardArgs>,
     .option_names = option_names_of<kNormGateOptions>,
     .run = [](const NamedCall& c, const ExecutionContext& context) {
       norm_gate_backward(args_from<NormGateBackwardArgs>(c), norm_gate_options(c.options), context);
     },
     .outputs = outputs_of<NormGateBackwardArgs>},
};

// kOperations in the order of flat::Operation: an operation is its entry's index.
static_assert([] {
  for (size_t i = 0; i < std::size(kOperations); ++i)
    if (kOperations[i].operation != Operation(i)) return false;
  return true;
}());

const OperationEntry& entry(Operation operation) { return kOperations[size_t(operation)]; }

}  // namespace

std::string_view operation_name(Operation operation) { return entry(operation).name; }

Operation parse_operation(std::string_view name) {
  std::string expected;
  for (size_t i = 0; i < std::size(kOperations); ++i) {
    if (kOperations[i].name == name) return kOperations[i].operation;
    expected += (i == 0 ? "" : i + 1 == std::size(kOperations) ? " or " : ", ") + std::string(kOperations[i].name);
  }
  throw Error("flat: unknown operation '" + std::string(name) + "' (expected " + expected + ")");
}

std::span<const TensorSlot> tensor_slots(Operation operation) { return entry(operation).tensor_slots(); }

std::span<const std::string_view> option_names(Operation operation) { return entry(operation).option_names(); }

Options recurrence_options(const NamedOptions& options) {
  return options_from(std::span<const OptionField<Options>>(kRecurrenceOptions), options);
}

ConvOptions conv_options(const NamedOptions& options) {
  return options_from(std::span<const OptionField<ConvOptions>>(kConvOptions), options);
}

NormGateOptions norm_gate_options(const NamedOptions& options) {
  return options_from(std::span<const OptionField<NormGateOptions>>(kNormGateOptions), options);
}

void call(const NamedCall& c, const ExecutionContext& context) { entry(c.operation).run(c, context); }

std::vector<std::pair<std::string_view, Tensor>> output_shapes(Operation operation, Variant variant,
                                                               const std::vector<std::pair<std::string, Tensor>>& inputs,
                                                               const SequenceSizes& sizes, const NamedOptions& options) {
  const OperationEntry& op = entry(operation);
  // Only inputs: an output given here is refused as a name the description does not take.
  for (const auto& [name, tensor] : inputs)
    for (const TensorSlot& slot : op.tensor_slots())
      if (slot.name == name && slot.output)
        throw Error("flat: " + name + ": output_shapes takes the inputs, got the output " + name);
  // Sequences of these sizes that any call of them may have: all empty but the last. Their
  // tokens are the first input's (q, x).
  const Tensor* first = nullptr;
  for (const auto& [name, tensor] : inputs)
    if (name == op.tensor_slots().front().name) first = &tensor;
  const int64_t S = first && first->rank >= 2 ? first->shape[1] : 0;
  const int64_t B = first && first->rank >= 1 ? first->shape[0] : 0;
  std::vector<int64_t> offsets, rows;
  if (sizes.cu_seqlens > 0) {
    offsets.assign(size_t(sizes.cu_seqlens), 0);
    offsets.back() = S;
  }
  if (sizes.initial_state_indices) rows.assign(size_t(sizes.cu_seqlens > 0 ? sizes.cu_seqlens - 1 : B), -1);
  return op.outputs({operation, variant, inputs, {offsets, rows, {}, {}}, options});
}

}  // namespace flat

// The library's calls by name: one argument schema for every front end (flat._core's Python
// binding, the JAX FFI handler, `flat run`). A front end names its tensors and options as the
// library does and hands them over; this turns them into the Args and Options of flat.h and runs
// the call, so that every front end takes, defaults and refuses the same arguments with the same
// messages. A C++ program calls flat.h's functions directly.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "flat/flat.h"

namespace flat {

// The entry points of flat.h.
enum class Operation { forward, backward, conv_forward, conv_backward, norm_gate_forward, norm_gate_backward };

// "forward", "backward", "conv_forward", "conv_backward", "norm_gate_forward",
// "norm_gate_backward".
std::string_view operation_name(Operation operation);
// Throws flat::Error for an unknown name.
Operation parse_operation(std::string_view name);

// A tensor of an operation: its field's name in the operation's Args (q, h0, dy, state0, ...) and
// whether the call writes it, from the operation's table (src/operations.h). The order is the one
// in which positional front ends pass them (the JAX FFI: the inputs as operands, then the outputs
// as results).
struct TensorSlot {
  std::string_view name;
  bool output;
};
std::span<const TensorSlot> tensor_slots(Operation operation);

// An option's value as front ends have it: a flag (a bool, or the integer 0 or 1), an integer, a
// number (a double, or an integer), or a name. A string is also read as any of those, as a command
// line gives it ("64", "0.125", "true").
using OptionValue = std::variant<bool, int64_t, double, std::string>;

// The options of an operation by name: the fields of its options struct (flat::Options for forward
// and backward, flat::ConvOptions, flat::NormGateOptions) as src/call.cpp's tables name them, the
// one list every front end asks (flat._core.option_names). An option not given takes its struct's
// default (scale: K^-1/2).
std::span<const std::string_view> option_names(Operation operation);

using NamedOptions = std::vector<std::pair<std::string, OptionValue>>;

// The options by name as the structs the entry points take. Throws flat::Error naming the option
// for an unknown name, one given twice, or a value of the wrong kind or out of its range (a scale
// or eps that is not a finite float, a chunk or gate group that is not an integer, a name the
// library has no such thing of). A front end that traces a call before it runs (jax.jit,
// torch.compile) parses them then, before it has the call's tensors.
Options recurrence_options(const NamedOptions& options);
ConvOptions conv_options(const NamedOptions& options);
NormGateOptions norm_gate_options(const NamedOptions& options);

// One call by name. Tensors: each name at most once, any order; an absent tensor is left out (or
// given as a Tensor of rank 0). `variant` is read by forward and backward only; the output norm
// takes no sequences.
struct NamedCall {
  Operation operation = Operation::forward;
  Variant variant = Variant::la;
  std::vector<std::pair<std::string, Tensor>> tensors;
  Sequences sequences;
  NamedOptions options;
};

// What the shapes of a call's outputs depend on in flat::Sequences: the arrays' sizes, not their
// values (a traced front end has those only).
struct SequenceSizes {
  int64_t cu_seqlens = 0;              // its size, num_seqs + 1; 0: not given (num_seqs = B)
  bool initial_state_indices = false;  // given: the initial state is a pool [P, ...]
};

// The outputs a front end allocates for a call, in tensor_slots' order, from its input tensors'
// shapes and dtypes (`inputs` by name as in NamedCall, outputs refused; data pointers may be
// null, none is read): each output's name and a Tensor with its shape and dtype and a null data
// pointer. The recurrence's and the convolution's inputs are validated as the call validates them
// (the same errors; the norm's outputs are its inputs' shapes, its inputs checked by the call). An
// output of an absent input is left out (dg without g, dh0 without h0, state with W = 1); an
// optional output is there (ht, state). Dtypes: y the recurrence's v's, the convolution's and the
// norm's x's; a gradient its input's; states fp32.
std::vector<std::pair<std::string_view, Tensor>> output_shapes(Operation operation, Variant variant,
                                                               const std::vector<std::pair<std::string, Tensor>>& inputs,
                                                               const SequenceSizes& sequences,
                                                               const NamedOptions& options);

// Runs the call: an unknown tensor or option name, a name given twice, or an option's value of the
// wrong kind throws flat::Error naming it, before anything is written; then flat.h's entry point
// validates the rest as usual.
void call(const NamedCall& call, const ExecutionContext& context = {});

}  // namespace flat

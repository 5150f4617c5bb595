// Argument checks shared by the public entry points. Each throws flat::Error with the message
// "flat: <tensor>: <what was expected>, got <what came>" and writes nothing.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "flat/flat.h"
#include "params.h"

namespace flat::validate {

[[noreturn]] void fail(const std::string& tensor, const std::string& what);

// "[2, 5, 16]"
std::string shape_string(const Tensor& t);

// One expected axis: its name, and its size where it is known (-1: any size from 1; kAnyOrEmpty:
// any size from 0, for the axes along which a call may be empty: batch and time).
struct Axis {
  const char* name;
  int64_t size;
};
inline constexpr int64_t kAnyOrEmpty = -2;

// A present tensor that is a usable view of the expected shape: every axis at least 1 unless
// its expected size is 0 or kAnyOrEmpty (and within int range), non-null data unless it has no
// elements, no negative stride, a contiguous last axis. The stride of an axis of one element is
// never used, and may be anything.
void check_tensor(const std::string& name, const Tensor& t, const std::vector<Axis>& axes);

// Elements of a tensor (0 for an absent one).
int64_t element_count(const Tensor& t);

// A tensor as an entry point names it.
struct Named {
  const char* name;
  const Tensor* tensor;  // absent tensors are skipped
};

// Outputs must not overlap themselves (a stride of 0, say), each other or any input (a tensor of
// no elements overlaps nothing): the kernels write an output while still reading the inputs, and
// a second output over the first. The
// exceptions are `in_place` pairs (output, input) that may be the very same view, read in full
// before the output is written (a state updated in place). Views whose bytes are apart pass at
// once; views that interleave (column blocks of one fused buffer) are compared row by row.
void check_no_overlap(const std::vector<Named>& outputs, const std::vector<Named>& inputs,
                      const std::vector<std::pair<std::string, std::string>>& in_place = {});

// A tensor's head count, for head sharing (0: the tensor is absent).
struct HeadCount {
  std::string tensor;
  const char* axis;  // "Nq", "Ng", ...
  int64_t count;
};

// N, the largest count, checked to be a multiple of every other. Of a count that does not divide
// N and the tensor N comes from, the one later in `counts` is named as the culprit (list q, k, v
// first: a gate with three heads beside queries with two is the gate's fault).
int64_t head_count(const std::vector<HeadCount>& counts);

// What every element of a tensor must be: finite, or finite and at most 0 (log-space gates).
enum class Values { finite, finite_nonpositive };

// A backend's value scan (Backend::check_values) found `value` breaking `rule` at logical index
// `at` of t (row-major over its shape): throws naming the element by its index along each axis,
// e.g. "g: expected finite values <= 0 (log-space gates), got inf at [0, 3, 1, 2]".
[[noreturn]] void refuse_value(const std::string& name, const Tensor& t, Values rule, int64_t at, float value);

// The device of the present tensors, which must all be on one ("k: on cuda, expected cpu like q").
Device common_device(const std::vector<Named>& tensors);

// `why` follows the expected dtype in the message, e.g. " (states are fp32)".
void check_dtype(const std::string& name, const Tensor& t, DType expected, const std::string& why);

// A call's sequences (flat::Sequences) against the batch B and length S of the tensor that packs
// them (q, x): cu_seqlens running from 0 to S without decreasing, with B = 1; index arrays of one
// entry per sequence (per token for token_state_indices); final_state_indices and
// token_state_indices only where the call writes states (a forward).
void check_sequences(const Sequences& s, const std::string& tensor, int64_t B, int64_t S, bool final_states);

// The leading axis of a state tensor: a pool of any number of rows P when indices address it,
// else one row per sequence (num_seqs with cu_seqlens, else B).
Axis state_axis(const Sequences& s, int64_t B, bool pool);
// Whether the final states' tensor (ht, state) is a pool: final or token state indices address it.
bool writes_pool(const Sequences& s);

// The indices into a pool, once the pool's shape is checked: given only with the pool, each from
// -1 (none) to P-1.
void check_indices(const std::string& name, std::span<const int64_t> indices, const Named& pool);

// The rows the final and the tokens' states go to (their indices checked against the pool): none
// written twice, and where the initial states are read from the very same view (a pool updated in
// place), none that another sequence reads. S: the length of the tensor packing the sequences.
void check_pool_writes(const Sequences& s, int64_t B, int64_t S, const Named& initial, const Named& final);

}  // namespace flat::validate

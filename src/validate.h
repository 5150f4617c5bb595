// Argument checks shared by the public entry points. Each throws flat::Error with the message
// "flat: <tensor>: <what was expected>, got <what came>" and writes nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flat/flat.h"

namespace flat::validate {

[[noreturn]] void fail(const std::string& tensor, const std::string& what);

// "[2, 5, 16]"
std::string shape_string(const Tensor& t);

// One expected axis: its name, and its size where it is known (-1: any size from 1).
struct Axis {
  const char* name;
  int64_t size;
};

// A present tensor that is a usable view of the expected shape: non-null data, every axis at
// least 1 (and within int range), no negative stride, a contiguous last axis.
void check_tensor(const std::string& name, const Tensor& t, const std::vector<Axis>& axes);

// `why` follows the expected dtype in the message, e.g. " (states are fp32)".
void check_dtype(const std::string& name, const Tensor& t, DType expected, const std::string& why);

}  // namespace flat::validate

// The CPU backend's value scan (Backend::check_values): every element of a tensor in host memory
// against a rule of validate::Values, on a target's scan leaf and the call's workers.
#pragma once

#include <string>

#include "cpu/parallel.h"
#include "cpu/targets.h"
#include "validate.h"

namespace flat::cpu {

// Scans every element of a present tensor (of any elements; bf16 or fp32, any strides); throws
// validate::refuse_value's message for the first element (in row-major order) that breaks the
// rule. Small tensors (a decode step's gates) are scanned on the calling thread alone.
void check_values(const std::string& name, const Tensor& t, validate::Values rule, const Target& target,
                  const Workers& workers);

}  // namespace flat::cpu

// The recurrence's options as both bindings take them from Python (flat._core's entry points and
// the JAX FFI handlers' attributes): one parser, so that both accept and refuse the same values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "flat/flat.h"

namespace flat::python {

// scale: none for the default K^-1/2 (the library refuses a non-finite one); gate_group 0: the
// variant's default or g's last axis.
inline Options options_of(std::optional<float> scale, int64_t chunk, bool l2norm, std::string_view solve,
                          int64_t gate_group, bool check_values) {
  Options options;
  options.scale = scale;
  options.chunk = int(chunk);
  options.l2norm_qk = l2norm;
  options.solve = parse_solve(solve);
  options.gate_group = int(gate_group);
  options.check_values = check_values;
  return options;
}

}  // namespace flat::python

// The library's entry points as XLA FFI handlers (JAX custom calls on the CPU).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace flat::python {

// (target name, handler) for every entry point; empty when built without jaxlib's FFI headers.
std::vector<std::pair<std::string, void*>> jax_ffi_handlers();

}  // namespace flat::python

#include "backend.h"

#include <string>

namespace flat {

// One accessor per backend of this build, from the list CMake compiled (FLAT_BACKENDS).
#define FLAT_BACKEND(name) \
  namespace name {         \
  const Backend& backend(); \
  }
#include "flat_backends.inc"
#undef FLAT_BACKEND

std::string_view device_name(Device device) { return device == Device::cuda ? "cuda" : "cpu"; }

const Backend& backend_for(Device device) {
  static const Backend* const backends[] = {
#define FLAT_BACKEND(name) &name::backend(),
#include "flat_backends.inc"
#undef FLAT_BACKEND
  };
  for (const Backend* backend : backends)
    if (backend->device == device) return *backend;
  throw Error("flat: no backend for device " + std::string(device_name(device)) + " in this build");
}

const Backend& backend_for_call(const std::vector<validate::Named>& tensors, const ExecutionContext& context) {
  if (context.threads < 0)
    validate::fail("context.threads", "expected 0 (all) or more, got " + std::to_string(context.threads));
  return backend_for(validate::common_device(tensors));
}

}  // namespace flat

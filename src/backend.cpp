#include "backend.h"

#include <string>

namespace flat {

std::string_view device_name(Device device) { return device == Device::cuda ? "cuda" : "cpu"; }

const Backend& backend_for(Device device) {
  for (const Backend* backend : {&cpu::backend()})
    if (backend->device == device) return *backend;
  throw Error("flat: no backend for device " + std::string(device_name(device)) + " in this build");
}

const Backend& backend_for_call(const std::vector<validate::Named>& tensors, const ExecutionContext& context) {
  if (context.threads < 0)
    validate::fail("context.threads", "expected 0 (all) or more, got " + std::to_string(context.threads));
  return backend_for(validate::common_device(tensors));
}

}  // namespace flat

// The boundary between the API and the devices' kernels. The API validates a call (shapes,
// dtypes, strides, overlaps: nothing that reads a tensor's memory) and describes it as Params or
// ConvParams or NormGateParams; the backend of the tensors' device checks the values it is asked
// to and runs the call. Every call reaches it, an empty one too (B = 0 or S = 0: no token), whose
// results are the backend's to write as any other's: each final state the initial one, each
// state's gradient passed through, a gradient summed over the tokens zero.
//
// One Backend per device, in src/<device>/backend.*: `flat::<device>::backend()` gives it. CMake's
// FLAT_BACKENDS lists the backends a build has (the CPU's: src/cpu/backend.cpp), and backend_for
// finds a device's among them (src/backend.cpp, through the generated flat_backends.inc).
#pragma once

#include <vector>

#include "conv_params.h"
#include "flat/flat.h"
#include "norm_params.h"
#include "params.h"
#include "validate.h"

namespace flat {

struct Backend {
  Device device;
  // Refuses a tensor whose values break `rule` (validate::refuse_value's message), reading it
  // where it lives.
  void (*check_values)(const char* name, const Tensor& tensor, validate::Values rule, const ExecutionContext& context);
  void (*forward)(const Params& p, const ExecutionContext& context);
  void (*backward)(const Params& p, const ExecutionContext& context);
  void (*conv_forward)(const ConvParams& p, const ExecutionContext& context);
  void (*conv_backward)(const ConvParams& p, const ExecutionContext& context);
  void (*norm_gate_forward)(const NormGateParams& p, const ExecutionContext& context);
  void (*norm_gate_backward)(const NormGateParams& p, const ExecutionContext& context);
};

// The backend of a device; flat::Error when this build has none.
const Backend& backend_for(Device device);
// The backend of a call: its tensors' device (they must all be on one), after checking the context.
const Backend& backend_for_call(const std::vector<validate::Named>& tensors, const ExecutionContext& context);

}  // namespace flat

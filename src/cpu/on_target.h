// The CPU backend's forward and backward on a target of the caller's choice: run as a call runs
// them (its workers, its subnormal mode), on `target` rather than the default one. For flat bench
// (--against, its vector work) and the tests that run a target of their own; the API reaches the
// backend through flat::cpu::backend() (src/backend.h) alone.
#pragma once

#include "cpu/targets.h"
#include "flat/flat.h"
#include "params.h"

namespace flat::cpu {

void forward_on(const Target& target, const Params& p, const ExecutionContext& context);
void backward_on(const Target& target, const Params& p, const ExecutionContext& context);

}  // namespace flat::cpu

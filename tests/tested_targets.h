// The CPU targets the tests run: the library's (cpu::compiled_targets(), CMakeLists.txt's
// FLAT_CPU_TARGETS) and, after them, the targets on the model of the tile unit, which are built
// into the tests alone (FLAT_TILE_MODEL_TARGETS: amx_model, amx_model_avx2; src/cpu/tile_model_target.h).
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "cpu/targets.h"

namespace flat::test {

// Every target the tests have, the library's first.
std::span<const cpu::Target* const> targets();
// Those this CPU runs (cpu::supported).
std::vector<const cpu::Target*> supported_targets();
// The target of this name among targets(), or null.
const cpu::Target* find_target(std::string_view name);
// Whether the target's unit is a software model (the tile unit's, kernels/tiles__model.h): the same
// answers as the hardware, a few hundred times slower, so the tests' long sweeps run it at a few
// of their points.
bool software_model(const cpu::Target& target);

}  // namespace flat::test

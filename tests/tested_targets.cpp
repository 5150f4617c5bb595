#include "tested_targets.h"

#include <algorithm>

namespace flat {
namespace cpu {
// One accessor per target on the model of the tile unit, from the list CMake compiled into the
// tests (FLAT_TILE_MODEL_TARGETS).
#define FLAT_CPU_TARGET(name) const Target& target_##name();
#include "flat_tile_model_targets.inc"
#undef FLAT_CPU_TARGET
}  // namespace cpu

namespace test {
namespace {

const std::vector<const cpu::Target*>& models() {
  static const std::vector<const cpu::Target*> list = {
#define FLAT_CPU_TARGET(name) &cpu::target_##name(),
#include "flat_tile_model_targets.inc"
#undef FLAT_CPU_TARGET
  };
  return list;
}

}  // namespace

std::span<const cpu::Target* const> targets() {
  static const std::vector<const cpu::Target*> all = [] {
    std::vector<const cpu::Target*> out(cpu::compiled_targets().begin(), cpu::compiled_targets().end());
    out.insert(out.end(), models().begin(), models().end());
    return out;
  }();
  return all;
}

std::vector<const cpu::Target*> supported_targets() {
  std::vector<const cpu::Target*> out;
  for (const cpu::Target* t : targets())
    if (cpu::supported(*t)) out.push_back(t);
  return out;
}

const cpu::Target* find_target(std::string_view name) {
  for (const cpu::Target* t : targets())
    if (name == t->name) return t;
  return nullptr;
}

bool software_model(const cpu::Target& target) {
  return std::find(models().begin(), models().end(), &target) != models().end();
}

}  // namespace test
}  // namespace flat

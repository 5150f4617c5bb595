#include "vector_work.h"

#include <string_view>

namespace flat::tool {

// One accessor per target CMake built the stages without products for (vector_work_<target>.cpp).
#define FLAT_VECTOR_WORK_TARGET(name) const cpu::SequenceKernels& vector_work_kernels__##name();
#include "flat_vector_work_targets.inc"
#undef FLAT_VECTOR_WORK_TARGET

std::optional<cpu::Target> vector_work_target(const cpu::Target& target) {
  struct Entry {
    std::string_view name;
    const cpu::SequenceKernels& (*kernels)();
  };
  static constexpr Entry entries[] = {
#define FLAT_VECTOR_WORK_TARGET(name) {#name, vector_work_kernels__##name},
#include "flat_vector_work_targets.inc"
#undef FLAT_VECTOR_WORK_TARGET
      {"", nullptr}};
  for (const Entry& entry : entries)
    if (entry.kernels && entry.name == target.name) {
      cpu::Target stripped = target;
      stripped.sequence = entry.kernels();
      return stripped;
    }
  return std::nullopt;
}

}  // namespace flat::tool

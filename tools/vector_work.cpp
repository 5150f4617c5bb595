#include "vector_work.h"

#include <string_view>

namespace flat::tool {

std::atomic<int64_t> census_on_unit{0}, census_on_fma{0};

// Two accessors per target CMake built the stages without products for (vector_work_<target>.cpp):
// its stages with the products zeroed, and counted.
#define FLAT_VECTOR_WORK_TARGET(name)                          \
  const cpu::SequenceKernels& vector_work_kernels__##name(); \
  const cpu::SequenceKernels& census_kernels__##name();
#include "flat_vector_work_targets.inc"
#undef FLAT_VECTOR_WORK_TARGET

namespace {

struct Entry {
  std::string_view name;
  const cpu::SequenceKernels& (*zeroed)();
  const cpu::SequenceKernels& (*counted)();
};
constexpr Entry kEntries[] = {
#define FLAT_VECTOR_WORK_TARGET(name) {#name, vector_work_kernels__##name, census_kernels__##name},
#include "flat_vector_work_targets.inc"
#undef FLAT_VECTOR_WORK_TARGET
    {"", nullptr, nullptr}};

// `target` with its chunk stages replaced by those `stages` gives, where the build has them.
std::optional<cpu::Target> with_stages(const cpu::Target& target, const cpu::SequenceKernels& (*Entry::*stages)()) {
  for (const Entry& entry : kEntries)
    if (entry.zeroed && entry.name == target.name) {
      cpu::Target replaced = target;
      replaced.sequence = (entry.*stages)();
      return replaced;
    }
  return std::nullopt;
}

}  // namespace

std::optional<cpu::Target> vector_work_target(const cpu::Target& target) { return with_stages(target, &Entry::zeroed); }

std::optional<ProductCensus> product_census(const cpu::Target& target,
                                            const std::function<void(const cpu::Target&)>& pass) {
  const std::optional<cpu::Target> counting = with_stages(target, &Entry::counted);
  if (!counting) return std::nullopt;
  census_on_unit = 0;
  census_on_fma = 0;
  pass(*counting);
  return ProductCensus{census_on_unit.load(), census_on_fma.load()};
}

}  // namespace flat::tool

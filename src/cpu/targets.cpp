#include "cpu/targets.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "flat/flat.h"

namespace flat::cpu {

// One accessor per compiled target, from the list CMake compiled (FLAT_CPU_TARGETS).
#define FLAT_CPU_TARGET(name) const Target& target_##name();
#include "flat_cpu_targets.inc"
#undef FLAT_CPU_TARGET

namespace {

#if defined(__x86_64__) || defined(__i386__)
bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
}
bool has_avx512_bf16() { return has_avx512() && __builtin_cpu_supports("avx512bf16"); }
// vdpbf16ps at twice the FLOP rate of the fp32 FMA units: every AMD core with AVX512-BF16 (Zen 4
// and Zen 5: a 512-bit vdpbf16ps per cycle and port pair where an FMA does half the products).
// Intel's (Cooper Lake, Sapphire Rapids and later) run it at most at the FMA's rate; measured on
// a Sapphire Rapids at half (`flat bench`: 226 against 445 GFLOP/s).
bool prefers_bf16_dot() { return has_avx512_bf16() && __builtin_cpu_is("amd"); }
#endif

bool always() { return true; }

// What each target needs from the CPU and the OS, and whether it is worth taking by default where
// it runs. A target of the list without a row here is never supported.
struct Requirement {
  const char* target;
  bool (*runs)();
  bool (*preferred)();
};
constexpr Requirement kRequirements[] = {
    {"generic", always, always},
#if defined(__x86_64__) || defined(__i386__)
    {"avx2", has_avx2, has_avx2},
    {"avx512", has_avx512, has_avx512},
    {"avx512_bf16", has_avx512_bf16, prefers_bf16_dot},
#endif
};

const Requirement* requirement(const Target& target) {
  for (const Requirement& r : kRequirements)
    if (std::strcmp(r.target, target.name) == 0) return &r;
  return nullptr;
}

}  // namespace

std::span<const Target* const> compiled_targets() {
  static const Target* const targets[] = {
#define FLAT_CPU_TARGET(name) &target_##name(),
#include "flat_cpu_targets.inc"
#undef FLAT_CPU_TARGET
  };
  return targets;
}

bool supported(const Target& target) {
  const Requirement* r = requirement(target);
  return r && r->runs();
}

std::vector<const Target*> supported_targets() {
  std::vector<const Target*> out;
  for (const Target* t : compiled_targets())
    if (supported(*t)) out.push_back(t);
  return out;
}

const Target* find_target(std::string_view name) {
  for (const Target* t : compiled_targets())
    if (name == t->name) return t;
  return nullptr;
}

std::string_view requested_target() {
  const char* name = std::getenv("FLAT_ISA");
  return name ? std::string_view(name) : std::string_view();
}

const Target& default_target() {
  static const Target* const chosen = [] {
    const Target* asked = find_target(requested_target());
    if (asked && supported(*asked)) return asked;
    const Target* best = compiled_targets().front();
    for (const Target* t : compiled_targets()) {
      const Requirement* r = requirement(*t);
      if (r && r->runs() && r->preferred()) best = t;
    }
    return best;
  }();
  return *chosen;
}

}  // namespace flat::cpu

#include "cpu/targets.h"

#include <cstdlib>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "flat/flat.h"

namespace flat::cpu {

// One accessor per compiled target, from the list CMake compiled (FLAT_CPU_TARGETS).
#define FLAT_CPU_TARGET(name) const Target& target_##name();
#include "flat_cpu_targets.inc"
#undef FLAT_CPU_TARGET

namespace {

#if defined(__x86_64__) || defined(__i386__)
// The features from CPUID and XCR0: an instruction set counts only where the OS saves its
// registers (XCR0 bits 1-2, the XMM and YMM state, for AVX2 and FMA; bits 5-7, the opmask and all
// of the ZMM registers, for AVX-512), so that a CPU that has them under an OS that does not
// (or a hypervisor that hides them) gets the next target down.
CpuFeatures read_cpu_features() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return 0;
  const unsigned max_leaf = eax;
  const bool amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;  // "AuthenticAMD"
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const bool fma = ecx & (1u << 12), osxsave = ecx & (1u << 27);
  uint64_t xcr0 = 0;
  if (osxsave) {
    uint32_t low, high;
    __asm__("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
    xcr0 = (uint64_t(high) << 32) | low;
  }
  const bool ymm_saved = (xcr0 & 0x6u) == 0x6u, zmm_saved = ymm_saved && (xcr0 & 0xe0u) == 0xe0u;
  unsigned leaf7_ebx = 0, leaf7_1_eax = 0;
  if (max_leaf >= 7) {
    unsigned subleaves;
    __cpuid_count(7, 0, subleaves, leaf7_ebx, ecx, edx);
    if (subleaves >= 1) __cpuid_count(7, 1, leaf7_1_eax, ebx, ecx, edx);
  }
  const auto bit = [](unsigned reg, int i) { return (reg >> i) & 1u; };
  CpuFeatures f = 0;
  if (ymm_saved) {
    if (fma) f |= kCpuFma;
    if (bit(leaf7_ebx, 5)) f |= kCpuAvx2;
  }
  if (zmm_saved) {
    if (bit(leaf7_ebx, 16)) f |= kCpuAvx512f;
    if (bit(leaf7_ebx, 17)) f |= kCpuAvx512dq;
    if (bit(leaf7_ebx, 30)) f |= kCpuAvx512bw;
    if (bit(leaf7_ebx, 31)) f |= kCpuAvx512vl;
    if (bit(leaf7_1_eax, 5)) f |= kCpuAvx512Bf16;
  }
  if ((f & kCpuAvx512Bf16) && amd) f |= kCpuBf16DotOutrunsFma;
  return f;
}
#else
CpuFeatures read_cpu_features() { return 0; }
#endif

bool has(CpuFeatures wanted) { return (cpu_features() & wanted) == wanted; }

}  // namespace

CpuFeatures cpu_features() {
  static const CpuFeatures features = read_cpu_features();
  return features;
}

std::span<const Target* const> compiled_targets() {
  static const Target* const targets[] = {
#define FLAT_CPU_TARGET(name) &target_##name(),
#include "flat_cpu_targets.inc"
#undef FLAT_CPU_TARGET
  };
  return targets;
}

bool supported(const Target& target) { return has(target.needs); }

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
    for (const Target* t : compiled_targets())
      if (has(t->needs | t->preferred_with)) best = t;
    return best;
  }();
  return *chosen;
}

}  // namespace flat::cpu

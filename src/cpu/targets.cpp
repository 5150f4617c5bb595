#include "cpu/targets.h"

#include <cstdlib>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu/tile_support.h"
#include "flat/flat.h"

namespace flat::cpu {

// One accessor per compiled target, from the list CMake compiled (FLAT_CPU_TARGETS).
#define FLAT_CPU_TARGET(name) const Target& target_##name();
#include "flat_cpu_targets.inc"
#undef FLAT_CPU_TARGET

namespace {

#if defined(__x86_64__)
// What the CPU says of its tile unit: CPUID leaf 7's AMX-TILE (EDX bit 24) and AMX-BF16 (bit 22);
// XCR0, read by xgetbv only where OSXSAVE (leaf 1, ECX bit 27) allows it.
TileSupport read_tile_support() {
  TileSupport support;
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    support.amx_tile = edx & (1u << 24);
    support.amx_bf16 = edx & (1u << 22);
  }
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 27))) {
    support.osxsave = true;
    unsigned xcr0_low, xcr0_high;
    __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    support.xcr0 = uint64_t(xcr0_high) << 32 | xcr0_low;
  }
  return support;
}

// Linux leaves the 8 KiB of tile data out of a thread's state until the process asks for it
// (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, granted for the whole process; without it the
// first tile instruction faults). Elsewhere there is no grant this code knows: no.
bool request_tile_permission() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

#if defined(__x86_64__) || defined(__i386__)
// The features as GCC's runtime reads them from CPUID, which counts an instruction set only where
// the OS saves its registers (XCR0), so that a CPU that has them under an OS that does not (or a
// hypervisor that hides them) gets the next target down.
CpuFeatures read_cpu_features() {
  __builtin_cpu_init();
  CpuFeatures f = 0;
  if (__builtin_cpu_supports("fma")) f |= kCpuFma;
  if (__builtin_cpu_supports("avx2")) f |= kCpuAvx2;
  if (__builtin_cpu_supports("avx512f")) f |= kCpuAvx512f;
  if (__builtin_cpu_supports("avx512bw")) f |= kCpuAvx512bw;
  if (__builtin_cpu_supports("avx512dq")) f |= kCpuAvx512dq;
  if (__builtin_cpu_supports("avx512vl")) f |= kCpuAvx512vl;
  if (__builtin_cpu_supports("avx512bf16")) f |= kCpuAvx512Bf16;
  if ((f & kCpuAvx512Bf16) && __builtin_cpu_is("amd")) f |= kCpuBf16DotOutrunsFma;
#if defined(__x86_64__)
  if (amx_bf16_usable(read_tile_support(), request_tile_permission)) f |= kCpuAmxBf16;
#endif
  return f;
}
#else
CpuFeatures read_cpu_features() { return 0; }
#endif

bool has(CpuFeatures wanted) { return (cpu_features() & wanted) == wanted; }

}  // namespace

bool amx_bf16_usable(const TileSupport& support, bool (*request_permission)()) {
  constexpr uint64_t kTileState = (uint64_t(1) << 17) | (uint64_t(1) << 18);  // XTILECFG, XTILEDATA
  return support.amx_tile && support.amx_bf16 && support.osxsave && (support.xcr0 & kTileState) == kTileState &&
         request_permission();
}

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

bool supported(const Target& target) {
  return has(target.needs) && !(target.replaced_where && has(target.replaced_where));
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

const Target& choose_target(std::string_view requested) {
  if (requested.empty()) {
    const Target* best = compiled_targets().front();
    for (const Target* t : compiled_targets())
      if (!t->only_on_request && has(t->needs | t->preferred_with)) best = t;
    return *best;
  }
  const auto names = [](const auto& targets) {
    std::string list;
    for (const Target* t : targets) list += (list.empty() ? "" : ", ") + std::string(t->name);
    return list;
  };
  const Target* asked = find_target(requested);
  if (!asked)
    throw Error("FLAT_ISA: expected the name of a CPU target of this build (" + names(compiled_targets()) +
                "), got '" + std::string(requested) + "'");
  if (!supported(*asked))
    throw Error("FLAT_ISA: expected a target this CPU and its OS run (" + names(supported_targets()) + "), got '" +
                std::string(requested) + "', which needs an instruction set or OS permission this machine lacks");
  return *asked;
}

// Chosen at the first call that asks; a refused FLAT_ISA is refused again at every call.
const Target& default_target() {
  static const Target& chosen = choose_target(requested_target());
  return chosen;
}

}  // namespace flat::cpu

std::string_view flat::cpu_target() { return cpu::default_target().name; }

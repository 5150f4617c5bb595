// Whether this process may use the tile unit with bf16 products (kCpuAmxBf16, src/cpu/targets.h),
// decided from what the CPU and the OS say (read by src/cpu/targets.cpp), apart from the reading
// so that every refusal can be tested on any machine (tests/test_targets.cpp).
#pragma once

#include <cstdint>

namespace flat::cpu {

// What decides kCpuAmxBf16 (the check of ggml-cpu and oneDNN): the CPU has AMX-TILE and AMX-BF16
// (CPUID), the OS saves the tile configuration and data (XCR0 bits 17 and 18, readable where
// OSXSAVE says), and the OS grants this process the tile data (`request_permission`: Linux's
// arch_prctl, asked last and only when the rest says yes, since it enlarges every signal frame).
// A refusal at any step leaves the feature out, and the next target runs.
struct TileSupport {
  bool amx_tile = false, amx_bf16 = false, osxsave = false;
  uint64_t xcr0 = 0;
};
bool amx_bf16_usable(const TileSupport& support, bool (*request_permission)());

}  // namespace flat::cpu

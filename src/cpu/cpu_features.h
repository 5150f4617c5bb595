// What a CPU target may need from the CPU and its OS (Target::needs, preferred_with,
// replaced_where in src/cpu/targets.h), one bit each, and this CPU's, read once by
// src/cpu/targets.cpp.
#pragma once

#include <cstdint>

namespace flat::cpu {

// Read from GCC's runtime: the instructions, and the OS saving the registers they use.
using CpuFeatures = uint32_t;
enum CpuFeature : CpuFeatures {
  kCpuFma = 1u << 0,
  kCpuAvx2 = 1u << 1,
  kCpuAvx512f = 1u << 2,
  kCpuAvx512bw = 1u << 3,
  kCpuAvx512dq = 1u << 4,
  kCpuAvx512vl = 1u << 5,
  kCpuAvx512Bf16 = 1u << 6,
  // Not a CPUID bit: vdpbf16ps at twice the FLOP rate of the fp32 FMA units, as on every AMD core
  // with AVX512-BF16 (Zen 4 and Zen 5: a 512-bit vdpbf16ps per cycle and port pair where an FMA
  // does half the products). Intel's (Cooper Lake, Sapphire Rapids and later) run it at most at
  // the FMA's rate; measured on a Sapphire Rapids at half (`flat bench`: 226 against 445 GFLOP/s).
  kCpuBf16DotOutrunsFma = 1u << 7,
  // The tile unit with bf16 products (CPUID AMX-TILE and AMX-BF16), its state saved by the OS
  // (XCR0's XTILECFG and XTILEDATA) and this process granted its use (Linux's
  // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once, before any tile instruction).
  kCpuAmxBf16 = 1u << 8,
};
// The AVX-512 subsets the avx512 microkernels use.
constexpr CpuFeatures kCpuAvx512 = kCpuAvx512f | kCpuAvx512bw | kCpuAvx512dq | kCpuAvx512vl | kCpuFma;

// This CPU's features (none off x86). Read once.
CpuFeatures cpu_features();

}  // namespace flat::cpu

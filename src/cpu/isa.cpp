#include "cpu/isa.h"

#include <cstdlib>
#include <cstring>

namespace flat::cpu {
namespace {

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace

Isa active_isa() {
  static const Isa isa = [] {
    const char* forced = std::getenv("FLAT_ISA");
    if (forced && std::strcmp(forced, "generic") == 0) return Isa::generic;
    return cpu_has_avx512() ? Isa::avx512 : Isa::generic;
  }();
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::generic: return "generic";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

// On the CPUs this project targets the fp32 FMA path is the faster one: Intel cores run
// vdpbf16ps at half the FLOP rate of their two FMA ports (measured by `flat bench`).
MatmulUnit matmul_unit(Isa) { return MatmulUnit::fp32_fma; }

}  // namespace flat::cpu

#include "cpu/isa.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>

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

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

// vdpbf16ps at twice the FLOP rate of the fp32 FMA units: every AMD core with AVX512-BF16 (Zen 4
// and Zen 5: a 512-bit vdpbf16ps per cycle and port pair where an FMA does half the products).
// Intel's (Cooper Lake, Sapphire Rapids and later) run it at most at the FMA's rate; measured on
// ours at half (`flat bench`: 226 against 445 GFLOP/s).
bool cpu_prefers_bf16_dot() {
#if defined(__x86_64__) || defined(__i386__)
  return cpu_has_avx512_bf16() && __builtin_cpu_is("amd");
#else
  return false;
#endif
}

}  // namespace

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::generic: return true;
    case Isa::avx512: return cpu_has_avx512();
    case Isa::avx512_bf16: return cpu_has_avx512_bf16();
  }
  return false;
}

bool isa_requested(Isa* isa) {
  const char* forced = std::getenv("FLAT_ISA");
  if (!forced) return false;
  for (Isa candidate : {Isa::generic, Isa::avx512, Isa::avx512_bf16})
    if (std::strcmp(forced, isa_name(candidate)) == 0) {
      *isa = candidate;
      return true;
    }
  return false;
}

Isa active_isa() {
  static const Isa isa = [] {
    Isa requested;
    if (isa_requested(&requested) && isa_supported(requested)) return requested;
    if (cpu_prefers_bf16_dot()) return Isa::avx512_bf16;
    return cpu_has_avx512() ? Isa::avx512 : Isa::generic;
  }();
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::generic: return "generic";
    case Isa::avx512: return "avx512";
    case Isa::avx512_bf16: return "avx512_bf16";
  }
  return "?";
}

}  // namespace flat::cpu

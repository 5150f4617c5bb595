#include "cpu/isa.h"

#include <cstdlib>
#include <cstring>

namespace flat::cpu {

Isa active_isa() {
  static const Isa isa = [] {
    const char* forced = std::getenv("FLAT_ISA");
    if (forced && std::strcmp(forced, "generic") == 0) return Isa::generic;
    return Isa::generic;
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

MatmulUnit matmul_unit(Isa) { return MatmulUnit::fp32_fma; }

}  // namespace flat::cpu

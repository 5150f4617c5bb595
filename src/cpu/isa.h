// Which instruction set the chunk products run on, chosen once at run time from the CPU's
// features.
#pragma once

namespace flat::cpu {

enum class Isa {
  generic,  // portable C++, whatever the compiler vectorises for the baseline target
  avx512,   // AVX-512 fp32 FMA microkernels
};

// The instruction set used on this CPU (FLAT_ISA=generic in the environment forces the
// portable path, for testing).
Isa active_isa();
const char* isa_name(Isa isa);

// What bounds the chunk products' arithmetic on this CPU: fp32 FMA or bf16 dot products.
enum class MatmulUnit { fp32_fma, bf16_dot };
MatmulUnit matmul_unit(Isa isa);

}  // namespace flat::cpu

// Which instruction set the chunk products run on, chosen once at run time from the CPU.
#pragma once

namespace flat::cpu {

enum class Isa {
  generic,  // portable C++, whatever the compiler vectorises for the baseline target
  avx512,   // AVX-512 fp32 FMA microkernels
  // AVX-512 with bf16 dot-product microkernels (AVX512-BF16) for the chunk products of calls whose
  // activations are all bf16; the others run as avx512.
  avx512_bf16,
};

// The instruction set used on this CPU: the fastest it has, where the bf16 dot products count
// only if they outrun its fp32 FMA units (AMD Zen 4 and 5 run vdpbf16ps at twice the FMA's FLOP
// rate; Intel cores at half or the same, so there the exact fp32 path is kept). FLAT_ISA=generic,
// avx512 or avx512_bf16 in the environment asks for one (for testing and benchmarking); an
// instruction set the CPU lacks is not taken.
Isa active_isa();
// What FLAT_ISA asks for, when it names an instruction set.
bool isa_requested(Isa* isa);
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);

}  // namespace flat::cpu

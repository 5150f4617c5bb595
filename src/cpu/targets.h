// The instruction-set targets of the CPU backend. One list, FLAT_CPU_TARGETS in CMakeLists.txt,
// decides what is compiled: each target is a translation unit src/cpu/target_<name>.cpp built
// with the target's flags, which instantiates the chunk stages (src/cpu/stages/) and the
// convolution's and the output norm's leaves (src/cpu/conv_leaf.h, src/cpu/norm_leaf.h) on its
// own microkernels (src/cpu/kernels/) and
// returns a Target, which says what it needs from the CPU and where it is preferred. CMake passes
// the list on (flat_cpu_targets.inc), and from it come the dispatch below, the name flat bench
// prints and the targets the tests run. targets.cpp reads the CPU's features and picks the target
// a call runs on.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "cpu/conv_kernels.h"
#include "cpu/float_mode.h"
#include "cpu/kernels/product.h"
#include "cpu/norm_kernels.h"
#include "cpu/sequence_kernels.h"
#include "validate.h"

namespace flat::cpu {

// A target's primitives, as the chunk stages call them (its Ops) and the microkernel tests check
// them (contracts in src/cpu/kernels/: gemm_f32_1xn__generic.h, elementwise_f32__generic.h,
// diagonal_f32_1xk__generic.h).
struct MicroKernels {
  // The kernel of a product so described (src/cpu/kernels/product.h): the target's choice by the
  // operands (bf16 values on bf16 dot-product units where it has them, exactly), the layout, the
  // size.
  using ChooseGemm = GemmKernel (*)(const GemmDesc& d);
  ChooseGemm gemm;
  // The kernel of products that share B (SharedBProduct), where the target's packs B: null for a
  // target whose kernels read B as it lies, whose products then run one by one (TableOps).
  using ChooseGemmSharedB = GemmSharedBKernel (*)(const SharedBDesc& d);
  ChooseGemmSharedB gemm_shared_b = nullptr;
  void (*transpose)(int rows, int cols, const float* src, int lds, float* dst, int ldd);
  void (*exp)(float* x, int n);
  float (*dot)(const float* a, const float* b, int n);
  void (*diagonal_scores)(int n, int K, const float* q, const float* k, const float* a, float* A, int lda, float* f);
  void (*diagonal_gradients)(int n, int K, const float* q, const float* k, const float* a, const float* dA, int lda,
                             float* dq, float* dk, float* f);
};

// What a target may need from the CPU and its OS, one bit each (targets.cpp reads them once, from
// GCC's runtime: the instructions, and the OS saving the registers they use).
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

// The value scan's leaves (src/cpu/values.cpp): whether any of n contiguous elements breaks the
// rule (src/cpu/kernels/any_broken__generic.h, compiled with the target's flags).
struct ValueKernels {
  bool (*any_broken_f32)(const float* row, int64_t n, validate::Values rule);
  bool (*any_broken_bf16)(const uint16_t* row, int64_t n, validate::Values rule);
};

struct Target {
  const char* name;
  const char* products;  // what its chunk products run on, in words (flat bench's title)
  CpuFeatures needs;           // runs where the CPU has all of these
  CpuFeatures preferred_with;  // taken by default (where it runs) only when the CPU has these too
  // A stand-in's: it does not run where the CPU has all of these, as the target it stands in for
  // runs there (amx_model_avx2 for amx_model); 0 for the others.
  CpuFeatures replaced_where;
  // Why the target runs only where FLAT_ISA names it, never as the default (a software model of a
  // unit, for the tests; a kernel whose speed is not measured yet); null where it may be the default.
  const char* only_on_request;
  // Its chunk products run on the tile unit (kernels/gemm_bf16_32x32__amx.h), whose DAZ and FTZ
  // ignore the call's subnormal mode and which splits fp32 operands into bf16 parts.
  bool tile_products = false;
  // Its unit is a software model (the tile unit's, kernels/tiles__model.h): the same answers as the
  // hardware, a few hundred times slower; the tests' long sweeps run it at a few of their points.
  bool software_model = false;
  SequenceKernels sequence;
  ConvKernels conv;
  NormGateKernels norm;
  MicroKernels micro;
  ValueKernels values;
  // The per-thread scope: entered by the drivers on each worker thread before its range of work
  // and left after it, for state a target keeps per thread (a tile configuration); may be null.
  void (*enter_thread)() = nullptr;
  void (*leave_thread)() = nullptr;
};

// The per-thread scope of a call's work: subnormals flushed (src/cpu/float_mode.h) when the call
// asks, then the target's own per-thread state, both undone in reverse order at the end.
class ThreadScope {
 public:
  ThreadScope(const Target& target, bool flush_subnormals) : mode_(flush_subnormals), target_(target) {
    if (target_.enter_thread) target_.enter_thread();
  }
  ~ThreadScope() {
    if (target_.leave_thread) target_.leave_thread();
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  const FlushSubnormals mode_;
  const Target& target_;
};

// Every compiled target, in the list's order: the portable one first.
std::span<const Target* const> compiled_targets();
// Whether this CPU (and its OS) runs the target.
bool supported(const Target& target);
// The compiled targets this CPU runs.
std::vector<const Target*> supported_targets();
// The target FLAT_ISA's value `requested` asks for, or, when it is empty, the last supported
// target of the list that is preferred here (its preferred_with present: a target with bf16 dot
// products only where they outrun the FMA units) and not only_on_request. Throws flat::Error
// naming FLAT_ISA for a name no compiled target has (names are lower case) and for a target
// this CPU or its OS does not run: a run that asked for amx measures amx or nothing.
const Target& choose_target(std::string_view requested);
// The target every operation runs on by default: choose_target(requested_target()), chosen once.
const Target& default_target();
// The compiled target of this name, or null.
const Target* find_target(std::string_view name);
// What FLAT_ISA asks for (empty when unset).
std::string_view requested_target();

}  // namespace flat::cpu

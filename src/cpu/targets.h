// The instruction-set targets of the CPU backend. One list, FLAT_CPU_TARGETS in CMakeLists.txt,
// decides what is compiled: each target is a translation unit src/cpu/target_<name>.cpp built
// with the target's flags, which instantiates the chunk stages (src/cpu/stages/) and the
// convolution's and the output norm's leaves (src/cpu/conv_leaf.h, src/cpu/norm_leaf.h) on its
// own microkernels (src/cpu/kernels/) and
// returns a Target. CMake passes the list on (flat_cpu_targets.inc), and from it come the dispatch
// below, the name flat bench prints and the targets the tests run. targets.cpp says which ones
// the CPU runs and which one a call runs on.
#pragma once

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
  // C[m, n] (+)= A B, A(i, p) = a[i*a_rs + p*a_cs], B row-major; gemm_bf16_values where every
  // operand is a bf16 value (on bf16 dot-product units where the target has them, exactly).
  using Gemm = void (*)(int m, int n, int k, const float* a, int a_rs, int a_cs, const float* b, int ldb, float* c,
                        int ldc, bool accumulate, Triangle tri);
  Gemm gemm, gemm_bf16_values;
  void (*transpose)(int rows, int cols, const float* src, int lds, float* dst, int ldd);
  void (*exp)(float* x, int n);
  float (*dot)(const float* a, const float* b, int n);
  void (*diagonal_scores)(int n, int K, const float* q, const float* k, const float* a, float* A, int lda, float* f);
  void (*diagonal_gradients)(int n, int K, const float* q, const float* k, const float* a, const float* dA, int lda,
                             float* dq, float* dk, float* f);
};

// The value scan's leaves (src/cpu/values.cpp): whether any of n contiguous elements breaks the
// rule (src/cpu/kernels/any_broken__generic.h, compiled with the target's flags).
struct ValueKernels {
  bool (*any_broken_f32)(const float* row, int64_t n, validate::Values rule);
  bool (*any_broken_bf16)(const uint16_t* row, int64_t n, validate::Values rule);
};

struct Target {
  const char* name;
  const char* products;  // what its chunk products run on, in words (flat bench's title)
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
// The target every operation runs on by default: the one FLAT_ISA names in the environment when
// this CPU runs it; otherwise the last supported target of the list that is preferred here (a
// target with bf16 dot products only where they outrun the FMA units). Chosen once.
const Target& default_target();
// The compiled target of this name, or null.
const Target* find_target(std::string_view name);
// What FLAT_ISA asks for (empty when unset).
std::string_view requested_target();

}  // namespace flat::cpu

// The instruction-set targets of the CPU backend. One list, FLAT_CPU_TARGETS in CMakeLists.txt,
// decides what is compiled: each target is a translation unit src/cpu/target_<name>.cpp built
// with the target's flags, which instantiates the chunk stages (src/cpu/stages/) and the
// convolution's and the output norm's leaves (src/cpu/conv_leaf.h, src/cpu/norm_leaf.h) on its
// own microkernels (src/cpu/kernels/) and
// returns a Target, which says what it needs from the CPU (src/cpu/cpu_features.h) and where it
// is preferred. CMake passes the list on (flat_cpu_targets.inc), and from it come the dispatch
// below and the targets flat bench and the tests run. targets.cpp reads the CPU's features and
// picks the target a call runs on.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "cpu/conv_kernels.h"
#include "cpu/cpu_features.h"
#include "cpu/float_mode.h"
#include "cpu/kernels/micro_kernels.h"
#include "cpu/norm_kernels.h"
#include "cpu/sequence_kernels.h"
#include "validate.h"

namespace flat::cpu {

// The value scan's leaves (src/cpu/values.cpp): whether any of n contiguous elements breaks the
// rule (src/cpu/kernels/any_broken__generic.h, compiled with the target's flags).
struct ValueKernels {
  bool (*any_broken_f32)(const float* row, int64_t n, validate::Values rule);
  bool (*any_broken_bf16)(const uint16_t* row, int64_t n, validate::Values rule);
};

// A target: what it says of itself (its name, the CPU features it needs and where it is the
// default), then its tables, which make_target (src/cpu/make_target.h) fills from its
// microkernels.
struct Target {
  const char* name;
  CpuFeatures needs = 0;           // runs where the CPU has all of these
  CpuFeatures preferred_with = 0;  // taken by default (where it runs) only when the CPU has these too
  // A stand-in's: it does not run where the CPU has all of these, as the target it stands in for
  // runs there (amx_model_avx2 for amx_model); 0 for the others.
  CpuFeatures replaced_where = 0;
  // Why the target runs only where FLAT_ISA names it, never as the default (a software model of a
  // unit, for the tests; a kernel whose speed is not measured yet); null where it may be the default.
  const char* only_on_request = nullptr;
  // Its chunk products run on the tile unit (kernels/gemm_bf16_32x32__amx.h), whose DAZ and FTZ
  // ignore the call's subnormal mode and which splits fp32 operands into bf16 parts.
  bool tile_products = false;
  SequenceKernels sequence = {};
  ConvKernels conv = {};
  NormGateKernels norm = {};
  MicroKernels micro = {};
  ValueKernels values = {};
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

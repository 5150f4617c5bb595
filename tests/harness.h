// Test harness: random problems, the kernel run on rounded inputs, the float64 oracle on the
// same rounded values, and the relative L2 error of every output.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "flat/flat.h"
#include "cpu/run.h"
#include "params.h"
#include "ref/reference.h"
#include "tested_targets.h"
#include "variants.h"

namespace flat {

// Readable test parameters in gtest's output (found by argument-dependent lookup).
inline void PrintTo(Variant variant, std::ostream* os) { *os << variant_name(variant); }
inline void PrintTo(DType dtype, std::ostream* os) { *os << dtype_name(dtype); }

}  // namespace flat

namespace flat::test {

// How strong the forget gate is, as the range log-decays are drawn from.
enum class Decay {
  mild,    // g in [-0.1, 0]: long memory
  medium,  // g in [-2, 0]
  strong,  // every other gate value in [-1000, -1], the rest in [-1, 0]
};

struct Case {
  Variant variant = Variant::gla;
  DType dtype = DType::f32;
  int B = 1, S = 1, Nq = 1, Nk = 1, Nv = 1, Ng = 1, K = 16, V = 16;
  int Nb = 1, Nw = 1;  // delta family: heads of beta or b, and of w (gdn2)
  // Channels per gate value of kda, gdn2 and sla, passed as Options::gate_group; 0 leaves it to
  // the library: 64 for sla, and one value per channel for kda and gdn2 here.
  int G = 0;
  // Delta family: beta (gdn2: b and w) drawn from [0, beta_max); 1 or up to 2.
  double beta_max = 1.0;
  Solve solve = Solve::automatic;
  Precision precision = Precision::exact;
  int chunk = 64;
  bool h0 = false, dht = false;
  bool strided = false;  // q, k, v, beta, b, w (and y, their gradients) as column blocks of fused buffers
  bool l2norm = false;
  bool y_f32 = false;  // y in fp32 whatever the inputs' dtype
  Decay decay = Decay::medium;
  int threads = 2;
  uint64_t seed = 1;
  // Also on the targets whose unit is a software model (test::software_model); a sweep over many
  // lengths runs them at a few of its points.
  bool on_models = true;

  bool is_delta() const;
  int gate_group() const;  // G as the library resolves it
  std::string name() const;
};

// The variants of the table (src/variants.h) that satisfy `keep`: sweeps take their variants from
// here, so that a new row of the table is tested like the others.
std::vector<Variant> variants_where(bool (*keep)(const VariantInfo&));
inline bool additive(const VariantInfo& v) { return !v.is_delta(); }
inline bool delta_rule(const VariantInfo& v) { return v.is_delta(); }
inline bool gated(const VariantInfo& v) { return v.has_gate(); }
inline bool any_variant(const VariantInfo&) { return true; }

// A variant whose default number of channels per gate value does not divide K (sla's 64) gets
// the largest power of two up to 64 that does.
void fit_gate_group(Case& c);

// A sweep of cases, for every variant given and both dtypes: cases(base, add) gets the base case
// of the pair (K = V = 64, the rest Case's defaults; it may change it) and calls add(edit) once per
// case. Each case is the base edited, then finish(case) when given, seeded by its position.
using CaseEdit = std::function<void(Case&)>;
std::vector<Case> build_sweep(const std::vector<Variant>& variants,
                              const std::function<void(Case& base, const std::function<void(const CaseEdit&)>& add)>& cases,
                              const CaseEdit& finish = {});

// Relative L2 errors per output; NaN where the output had a NaN. Zero for gradients of inputs
// the variant does not take.
struct Errors {
  double y = 0, ht = 0, dq = 0, dk = 0, dv = 0, dg = 0, dh0 = 0;
  double dbeta = 0, db = 0, dw = 0;
  bool padding_intact = true;  // nothing written outside the strided views
};

// Relative L2 error ||got - want|| / ||want|| (absolute where want is all zero); NaN if got has
// a NaN or an infinity.
double relative_error(const std::vector<double>& got, const std::vector<double>& want);

// The errors of each target this CPU supports, by the target's name.
using ErrorsByTarget = std::vector<std::pair<std::string, Errors>>;

// The spec's bounds, as gtest expectations: fp32 1e-5 for y and ht and 1e-4 for every gradient,
// bf16 5e-3 and 1e-2; at Precision::fast, FLA's own tests' bounds for either dtype (its delta rule's
// tests/ops/test_delta.py: 6e-3 for y and ht, 8e-3 for dq, dk, dv and dh0; 2e-2 for the gate's and
// the delta rule's gradients dg, dbeta, db, dw);
// NaN fails; and nothing written outside the views. On every target.
void expect_within_bounds(const Errors& errors, DType dtype, Precision precision = Precision::exact);
void expect_within_bounds(const ErrorsByTarget& errors, DType dtype, Precision precision = Precision::exact);


// g's shape for the case's variant; empty without a gate.
std::vector<int64_t> gate_shape(const Case& c);

// A problem instance: inputs rounded to the case's dtype, as float (kernel) and double (oracle).
// Gates stay fp32; beta, b and w are rounded like q, k and v.
struct Problem {
  explicit Problem(const Case& c);

  Case c;
  ref::Problem ref;
  ref::Inputs in;                   // rounded values in float64
  std::vector<double> dy, dht;      // rounded, dht empty when absent
  int N = 1;
};

// Raw outputs of the kernel converted to float64 in the oracle's dense layouts.
struct KernelOutputs {
  std::vector<double> y, ht, dq, dk, dv, dg, dh0;
  std::vector<double> dbeta, db, dw;  // empty where the variant takes no such input
  bool padding_intact = true;  // strided buffers: nothing written outside the views
};

// Every output of KernelOutputs with its name, for checks that treat them alike.
inline constexpr std::pair<const char*, std::vector<double> KernelOutputs::*> kKernelOutputs[] = {
    {"y", &KernelOutputs::y},     {"ht", &KernelOutputs::ht},       {"dq", &KernelOutputs::dq},
    {"dk", &KernelOutputs::dk},   {"dv", &KernelOutputs::dv},       {"dg", &KernelOutputs::dg},
    {"dh0", &KernelOutputs::dh0}, {"dbeta", &KernelOutputs::dbeta}, {"db", &KernelOutputs::db},
    {"dw", &KernelOutputs::dw}};

// What run_kernel runs on the Params that describe_forward / describe_backward make of the
// arguments: the library's drivers, or another implementation (the benchmark's baselines).
struct Implementation {
  const char* name;
  void (*forward)(const Params&, const cpu::Run&);
  void (*backward)(const Params&, const cpu::Run&);
};
Implementation library();
// The library's forward with every sequence sent down the decode path (src/cpu/stages/step.h, the
// recurrence token by token from a state in memory) at any length, and the library's backward.
Implementation decode_path();
// The library's drivers with every token output streamed past the caches (Params::
// streamed_outputs, which the API sets for large outputs alone).
Implementation streamed_outputs();

// Runs forward and, when `backward`, backward on one target and `threads` threads, on poisoned
// output buffers.
KernelOutputs run_kernel(const Problem& problem, bool backward, int threads, const cpu::Target& target,
                         const Implementation& implementation = library());

// Runs the oracle once and the implementation on `targets` (by default every target of the tests
// this CPU runs: tested_targets.h), and returns the errors of each.
ErrorsByTarget compare(const Case& c);
ErrorsByTarget compare(const Problem& problem, const Implementation& implementation = library(),
                       const std::vector<const cpu::Target*>& targets = supported_targets());

void PrintTo(const Case& c, std::ostream* os);
inline void PrintTo(const Implementation& implementation, std::ostream* os) { *os << implementation.name; }

}  // namespace flat::test

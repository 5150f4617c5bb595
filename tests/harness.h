// Test harness: random problems, the kernel run on rounded inputs, the float64 oracle on the
// same rounded values, and the relative L2 error of every output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flat/flat.h"
#include "ref/reference.h"

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
  int chunk = 64;
  bool h0 = false, dht = false;
  bool strided = false;  // q, k, v (and y, dq, dk, dv) as column blocks of fused buffers
  bool l2norm = false;
  Decay decay = Decay::medium;
  int threads = 2;
  uint64_t seed = 1;

  std::string name() const;
};

// Relative L2 errors per output; NaN where the output had a NaN.
struct Errors {
  double y = 0, ht = 0, dq = 0, dk = 0, dv = 0, dg = 0, dh0 = 0;
  bool padding_intact = true;  // nothing written outside the strided views
};

// Relative L2 error ||got - want|| / ||want|| (absolute where want is all zero); NaN if got has
// a NaN or an infinity.
double relative_error(const std::vector<double>& got, const std::vector<double>& want);

// A problem instance: inputs rounded to the case's dtype, as float (kernel) and double (oracle).
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
  bool padding_intact = true;  // strided buffers: nothing written outside the views
};

// Runs forward and, when `backward`, backward of the kernel on poisoned output buffers.
KernelOutputs run_kernel(const Problem& problem, bool backward, int threads);

// Runs kernel and oracle, returns the errors.
Errors compare(const Case& c);
Errors compare(const Problem& problem);

}  // namespace flat::test

// Test harness of the short convolution: random problems, the kernels run on poisoned output
// buffers (strided views of wider buffers when asked), and the float64 oracle on the same
// rounded inputs.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cpu/targets.h"
#include "flat/flat.h"
#include "ref/conv_reference.h"

namespace flat::test {

struct ConvCase {
  DType x_dtype = DType::f32;  // x and dx
  DType y_dtype = DType::f32;  // y and dy
  int B = 1, S = 1, C = 16, W = 4;
  bool bias = true;
  bool state0 = false, state = false;    // initial state in, final state out
  bool dstate = false, dstate0 = false;  // their gradients (in, out)
  Activation activation = Activation::silu;
  bool strided = false;  // x, y, dy, dx as column blocks of wider rows, batches apart
  int threads = 2;
  uint64_t seed = 1;
  double x_scale = 1.0;  // of the inputs: large values drive the SiLU far into its tails

  std::string name() const;
};

inline void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.name(); }

// Inputs rounded to their dtypes, as float64 for the oracle.
struct ConvData {
  explicit ConvData(const ConvCase& c);

  ConvCase c;
  ref::ConvProblem problem;
  ref::ConvInputs in;
  std::vector<double> dy, dstate;  // dstate empty when absent
};

// Kernel outputs in float64, dense; empty where not computed.
struct ConvResults {
  std::vector<double> y, state, dx, dweight, dbias, dstate0;
  bool padding_intact = true;  // nothing written outside the strided views
};

// Forward (and backward) on poisoned buffers: through the public API when `target` is null, else
// through the driver on that target's leaves.
ConvResults run_conv(const ConvData& data, bool backward, int threads, const cpu::Target* target);

}  // namespace flat::test

// The portable target: the chunk stages and the convolution's leaves in plain C++, vectorised by
// the compiler for the baseline instruction set. Runs on any CPU.
#include "cpu/kernels/conv_rows__generic.h"
#include "cpu/kernels/micro_kernels__generic.h"
#include "cpu/make_target.h"

namespace flat::cpu {

const Target& target_generic() {
  static constexpr Target target = make_target<micro_kernels__generic, conv_generic::ConvRowsGeneric>(
      {.name = "generic"});
  return target;
}

}  // namespace flat::cpu

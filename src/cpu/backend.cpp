// The CPU backend: every call on the default target (src/cpu/targets.h), on the context's
// threads, or on the host framework's parallel-for when the context gives one.
#include <algorithm>
#include <thread>

#include "backend.h"
#include "conv/conv.h"
#include "cpu/recurrence.h"
#include "norm/norm.h"

namespace flat::cpu {
namespace {

Workers workers_of(const ExecutionContext& context) {
  const int threads = context.threads > 0 ? context.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  return {threads, context.parallel_for ? &context.parallel_for : nullptr};
}

Run run_of(const ExecutionContext& context) { return {default_target(), workers_of(context)}; }

void check_values(const char* name, const Tensor& tensor, validate::Values rule, const ExecutionContext& context) {
  validate::check_values(name, tensor, rule, workers_of(context));
}

void forward(const Params& p, const ExecutionContext& context) { recurrence_forward(p, run_of(context)); }
void backward(const Params& p, const ExecutionContext& context) { recurrence_backward(p, run_of(context)); }
void forward_conv(const ConvParams& p, const ExecutionContext& context) { conv_forward(p, run_of(context)); }
void backward_conv(const ConvParams& p, const ExecutionContext& context) { conv_backward(p, run_of(context)); }
void forward_norm_gate(const NormGateParams& p, const ExecutionContext& context) { norm_gate_forward(p, run_of(context)); }
void backward_norm_gate(const NormGateParams& p, const ExecutionContext& context) {
  norm_gate_backward(p, run_of(context));
}

}  // namespace

const Backend& backend() {
  static const Backend cpu{Device::cpu,  check_values,      forward,           backward,
                           forward_conv, backward_conv,     forward_norm_gate, backward_norm_gate};
  return cpu;
}

}  // namespace flat::cpu

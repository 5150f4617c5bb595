// The CPU backend: every call on the default target (src/cpu/targets.h), on the context's
// threads, or on the host framework's parallel-for when the context gives one. An empty call (no
// token) runs through the drivers as any other: each sequence's final state is its initial one,
// each state's gradient passes through, and a gradient summed over no token is written as zero.
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "backend.h"
#include "cpu/conv.h"
#include "cpu/float_mode.h"
#include "cpu/norm.h"
#include "cpu/on_target.h"
#include "cpu/recurrence.h"
#include "cpu/values.h"

namespace flat::cpu {
namespace {

Workers workers_of(const ExecutionContext& context) {
  const int threads = context.threads > 0 ? context.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  return {threads, context.parallel_for ? &context.parallel_for : nullptr};
}

// FLAT_SUBNORMALS=keep in the environment: every call runs in the threads' own floating-point
// mode, as ExecutionContext::flush_subnormals = false asks for one call. Read once.
bool subnormals_kept_by_environment() {
  static const bool kept = [] {
    const char* value = std::getenv("FLAT_SUBNORMALS");
    return value && std::string_view(value) == "keep";
  }();
  return kept;
}

Run run_of(const Target& target, const ExecutionContext& context) {
  return {target, workers_of(context), context.flush_subnormals && !subnormals_kept_by_environment()};
}

void check_values(const char* name, const Tensor& tensor, validate::Values rule, const ExecutionContext& context) {
  cpu::check_values(name, tensor, rule, default_target(), workers_of(context));
}

// A driver on the call's run. The calling thread's own share of the work (a range, the
// reductions after the ranges) runs in the call's floating-point mode too, its mode restored
// after; the worker threads' ranges each in their per-thread scope (src/cpu/run.h).
template <class Problem>
void run_driver(void (*driver)(const Problem&, const Run&), const Problem& p, const ExecutionContext& context,
                const Target& target = default_target()) {
  const Run run = run_of(target, context);
  const FlushSubnormals mode(run.flush_subnormals);
  driver(p, run);
}

void forward(const Params& p, const ExecutionContext& context) { run_driver(recurrence_forward, p, context); }
void backward(const Params& p, const ExecutionContext& context) { run_driver(recurrence_backward, p, context); }
void forward_conv(const ConvParams& p, const ExecutionContext& context) { run_driver(conv_forward, p, context); }
void backward_conv(const ConvParams& p, const ExecutionContext& context) { run_driver(conv_backward, p, context); }
void forward_norm_gate(const NormGateParams& p, const ExecutionContext& context) {
  run_driver(norm_gate_forward, p, context);
}
void backward_norm_gate(const NormGateParams& p, const ExecutionContext& context) {
  run_driver(norm_gate_backward, p, context);
}

}  // namespace

void forward_on(const Target& target, const Params& p, const ExecutionContext& context) {
  run_driver(recurrence_forward, p, context, target);
}
void backward_on(const Target& target, const Params& p, const ExecutionContext& context) {
  run_driver(recurrence_backward, p, context, target);
}

const Backend& backend() {
  static const Backend cpu{.device = Device::cpu,
                           .check_values = check_values,
                           .forward = forward,
                           .backward = backward,
                           .conv_forward = forward_conv,
                           .conv_backward = backward_conv,
                           .norm_gate_forward = forward_norm_gate,
                           .norm_gate_backward = backward_norm_gate};
  return cpu;
}

}  // namespace flat::cpu

// The library as XLA custom calls on the CPU (JAX's typed FFI): one handler per entry point, on
// XLA's buffers (dense, row-major) and on XLA's intra-op thread pool. A tensor the call does not
// have comes as an array of shape (0,) (a tensor of an empty batch has its rank, 3 or 4); flags
// come as int64 attributes, the scale with default_scale (1: K^-1/2, scale unread); flat::Sequences'
// arrays come as integer buffers (traced values, not attributes), 0 elements where not given (flat.jax
// refuses an empty cu_seqlens before it gets here). A pool
// updated in place is an input aliased to an output (ffi_call's input_output_aliases): the two
// buffers are one. Built only where jaxlib's FFI headers were found (FLAT_WITH_JAX_FFI);
// flat/jax.py registers the handlers.
#include "jax_ffi.h"

#ifdef FLAT_WITH_JAX_FFI

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flat/flat.h"
#include "options.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace flat::python {
namespace {

// A buffer as a dense view; absent (no tensor) when of shape (0,).
Tensor tensor_of(const ffi::AnyBuffer& buffer, const char* name) {
  const auto dims = buffer.dimensions();
  if (dims.size() == 1 && dims[0] == 0) return {};
  if (dims.size() == 0 || dims.size() > 4)
    throw Error(std::string("flat: ") + name + ": expected an array of rank 1 to 4, got rank " +
                std::to_string(dims.size()));
  Tensor t;
  t.data = buffer.untyped_data();
  switch (buffer.element_type()) {
    case ffi::DataType::F32: t.dtype = DType::f32; break;
    case ffi::DataType::BF16: t.dtype = DType::bf16; break;
    default: throw Error(std::string("flat: ") + name + ": dtype not supported (expected float32 or bfloat16)");
  }
  t.rank = int(dims.size());
  int64_t step = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.shape[size_t(d)] = dims[size_t(d)];
    t.stride[size_t(d)] = step;
    step *= dims[size_t(d)];
  }
  return t;
}

Tensor output_of(ffi::Result<ffi::AnyBuffer>& result, const char* name) { return tensor_of(*result, name); }

// An integer buffer's values as the library reads them, int64 (JAX's integers are int32 unless
// x64 is enabled); empty when it has no elements.
std::vector<int64_t> ints_of(const ffi::AnyBuffer& buffer, const char* name) {
  const size_t n = buffer.element_count();
  if (n == 0) return {};
  switch (buffer.element_type()) {
    case ffi::DataType::S32: {
      const auto* values = static_cast<const int32_t*>(buffer.untyped_data());
      return {values, values + n};
    }
    case ffi::DataType::S64: {
      const auto* values = static_cast<const int64_t*>(buffer.untyped_data());
      return {values, values + n};
    }
    default: throw Error(std::string("flat: ") + name + ": expected int32 or int64 values");
  }
}

// flat::Sequences' values; view() points at them.
struct SequenceValues {
  std::vector<int64_t> cu_seqlens, reads, writes, tokens;

  Sequences view() const { return {cu_seqlens, reads, writes, tokens}; }
};

// A backward's: cu_seqlens and initial_state_indices.
SequenceValues reads_of(const ffi::AnyBuffer& cu_seqlens, const ffi::AnyBuffer& reads) {
  return {ints_of(cu_seqlens, "cu_seqlens"), ints_of(reads, "initial_state_indices"), {}, {}};
}

// A forward's: those and final_state_indices, token_state_indices.
SequenceValues sequences_of(const ffi::AnyBuffer& cu_seqlens, const ffi::AnyBuffer& reads,
                            const ffi::AnyBuffer& writes, const ffi::AnyBuffer& tokens) {
  SequenceValues values = reads_of(cu_seqlens, reads);
  values.writes = ints_of(writes, "final_state_indices");
  values.tokens = ints_of(tokens, "token_state_indices");
  return values;
}

// Runs the parts on XLA's intra-op threads. Each thread, the caller's included, takes parts until
// none is left, so the call finishes even when no pool thread is free (a task that starts after
// that finds nothing to do); the state lives until the last task has looked at it.
struct PoolRun {
  std::atomic<int> next{0};
  int parts = 0, done = 0;
  std::mutex mutex;
  std::condition_variable finished;
  const std::function<void(int)>* run_part = nullptr;

  void work() {
    for (int part; (part = next.fetch_add(1)) < parts;) {
      (*run_part)(part);
      std::lock_guard<std::mutex> lock(mutex);
      if (++done == parts) finished.notify_all();
    }
  }
};

ExecutionContext context_of(ffi::ThreadPool& pool) {
  ExecutionContext context;
  context.threads = int(pool.num_threads() > 0 ? pool.num_threads() : 1);
  context.parallel_for = [&pool](int parts, const std::function<void(int)>& run_part) {
    auto run = std::make_shared<PoolRun>();
    run->parts = parts;
    run->run_part = &run_part;
    for (int t = 1; t < parts; ++t) pool.Schedule([run] { run->work(); });
    run->work();
    std::unique_lock<std::mutex> lock(run->mutex);
    run->finished.wait(lock, [&] { return run->done == run->parts; });
  };
  return context;
}

// The recurrence's attributes as flat::Options.
Options attribute_options(float scale, int64_t default_scale, int64_t chunk, int64_t l2norm, std::string_view solve,
                          int64_t gate_group, int64_t check_values) {
  return options_of(default_scale != 0 ? std::nullopt : std::optional<float>(scale), chunk, l2norm != 0, solve,
                    gate_group, check_values != 0);
}

// The library's errors (flat::Error) as XLA's, which JAX raises with the message.
template <class Body>
ffi::Error guarded(Body&& body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error::InvalidArgument(e.what());
  }
}

// The recurrence's inputs, as the forward and the backward handler both read them.
Inputs inputs_of(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v, const ffi::AnyBuffer& g,
                 const ffi::AnyBuffer& beta, const ffi::AnyBuffer& b, const ffi::AnyBuffer& w, const ffi::AnyBuffer& h0,
                 const SequenceValues& sequences) {
  Inputs in;
  in.sequences = sequences.view();
  in.q = tensor_of(q, "q");
  in.k = tensor_of(k, "k");
  in.v = tensor_of(v, "v");
  in.g = tensor_of(g, "g");
  in.beta = tensor_of(beta, "beta");
  in.b = tensor_of(b, "b");
  in.w = tensor_of(w, "w");
  in.h0 = tensor_of(h0, "initial_state");
  return in;
}

ffi::Error forward_impl(ffi::ThreadPool pool, std::string_view variant, float scale, int64_t default_scale,
                        int64_t chunk, int64_t l2norm, std::string_view solve, int64_t gate_group,
                        int64_t check_values, ffi::AnyBuffer q,
                        ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer g, ffi::AnyBuffer beta, ffi::AnyBuffer b,
                        ffi::AnyBuffer w, ffi::AnyBuffer h0, ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer reads,
                        ffi::AnyBuffer writes, ffi::AnyBuffer tokens, ffi::Result<ffi::AnyBuffer> y,
                        ffi::Result<ffi::AnyBuffer> ht) {
  return guarded([&] {
    const SequenceValues sequences = sequences_of(cu_seqlens, reads, writes, tokens);
    ForwardArgs args(inputs_of(q, k, v, g, beta, b, w, h0, sequences));
    args.y = output_of(y, "o");
    args.ht = output_of(ht, "final_state");
    forward(parse_variant(variant), args,
            attribute_options(scale, default_scale, chunk, l2norm, solve, gate_group, check_values), context_of(pool));
  });
}

ffi::Error backward_impl(ffi::ThreadPool pool, std::string_view variant, float scale, int64_t default_scale,
                         int64_t chunk, int64_t l2norm, std::string_view solve, int64_t gate_group,
                         int64_t check_values, ffi::AnyBuffer q,
                         ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer g, ffi::AnyBuffer beta, ffi::AnyBuffer b,
                         ffi::AnyBuffer w, ffi::AnyBuffer h0, ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer reads,
                         ffi::AnyBuffer dy, ffi::AnyBuffer dht, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                         ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dg,
                         ffi::Result<ffi::AnyBuffer> dbeta, ffi::Result<ffi::AnyBuffer> db,
                         ffi::Result<ffi::AnyBuffer> dw, ffi::Result<ffi::AnyBuffer> dh0) {
  return guarded([&] {
    const SequenceValues sequences = reads_of(cu_seqlens, reads);
    BackwardArgs args(inputs_of(q, k, v, g, beta, b, w, h0, sequences));
    args.dy = tensor_of(dy, "dy");
    args.dht = tensor_of(dht, "dht");
    args.dq = output_of(dq, "dq");
    args.dk = output_of(dk, "dk");
    args.dv = output_of(dv, "dv");
    args.dg = output_of(dg, "dg");
    args.dbeta = output_of(dbeta, "dbeta");
    args.db = output_of(db, "db");
    args.dw = output_of(dw, "dw");
    args.dh0 = output_of(dh0, "dh0");
    backward(parse_variant(variant), args,
             attribute_options(scale, default_scale, chunk, l2norm, solve, gate_group, check_values), context_of(pool));
  });
}

ffi::Error conv_forward_impl(ffi::ThreadPool pool, std::string_view activation, ffi::AnyBuffer x,
                             ffi::AnyBuffer weight, ffi::AnyBuffer bias, ffi::AnyBuffer state0,
                             ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer reads, ffi::AnyBuffer writes,
                             ffi::AnyBuffer tokens, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> state) {
  return guarded([&] {
    const SequenceValues sequences = sequences_of(cu_seqlens, reads, writes, tokens);
    ConvArgs args;
    args.sequences = sequences.view();
    args.x = tensor_of(x, "x");
    args.weight = tensor_of(weight, "weight");
    args.bias = tensor_of(bias, "bias");
    args.state0 = tensor_of(state0, "initial_state");
    args.y = output_of(y, "y");
    args.state = output_of(state, "final_state");
    ConvOptions options;
    options.activation = parse_activation(activation);
    conv_forward(args, options, context_of(pool));
  });
}

ffi::Error conv_backward_impl(ffi::ThreadPool pool, std::string_view activation, ffi::AnyBuffer x,
                              ffi::AnyBuffer weight, ffi::AnyBuffer bias, ffi::AnyBuffer state0,
                              ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer reads, ffi::AnyBuffer dy,
                              ffi::AnyBuffer dstate, ffi::Result<ffi::AnyBuffer> dx,
                              ffi::Result<ffi::AnyBuffer> dweight, ffi::Result<ffi::AnyBuffer> dbias,
                              ffi::Result<ffi::AnyBuffer> dstate0) {
  return guarded([&] {
    const SequenceValues sequences = reads_of(cu_seqlens, reads);
    ConvBackwardArgs args;
    args.sequences = sequences.view();
    args.x = tensor_of(x, "x");
    args.weight = tensor_of(weight, "weight");
    args.bias = tensor_of(bias, "bias");
    args.state0 = tensor_of(state0, "initial_state");
    args.dy = tensor_of(dy, "dy");
    args.dstate = tensor_of(dstate, "dstate");
    args.dx = output_of(dx, "dx");
    args.dweight = output_of(dweight, "dweight");
    args.dbias = output_of(dbias, "dbias");
    args.dstate0 = output_of(dstate0, "dstate0");
    ConvOptions options;
    options.activation = parse_activation(activation);
    conv_backward(args, options, context_of(pool));
  });
}

NormGateOptions norm_gate_options(std::string_view activation, int64_t norm_before_gate, float eps) {
  NormGateOptions options;
  options.activation = parse_activation(activation);
  options.norm_before_gate = norm_before_gate != 0;
  options.eps = eps;
  return options;
}

ffi::Error norm_gate_forward_impl(ffi::ThreadPool pool, std::string_view activation, int64_t norm_before_gate,
                                  float eps, ffi::AnyBuffer x, ffi::AnyBuffer g, ffi::AnyBuffer weight,
                                  ffi::Result<ffi::AnyBuffer> y) {
  return guarded([&] {
    NormGateArgs args;
    args.x = tensor_of(x, "x");
    args.g = tensor_of(g, "g");
    args.weight = tensor_of(weight, "weight");
    args.y = output_of(y, "y");
    norm_gate_forward(args, norm_gate_options(activation, norm_before_gate, eps), context_of(pool));
  });
}

ffi::Error norm_gate_backward_impl(ffi::ThreadPool pool, std::string_view activation, int64_t norm_before_gate,
                                   float eps, ffi::AnyBuffer x, ffi::AnyBuffer g, ffi::AnyBuffer weight,
                                   ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dg,
                                   ffi::Result<ffi::AnyBuffer> dweight) {
  return guarded([&] {
    NormGateBackwardArgs args;
    args.x = tensor_of(x, "x");
    args.g = tensor_of(g, "g");
    args.weight = tensor_of(weight, "weight");
    args.dy = tensor_of(dy, "dy");
    args.dx = output_of(dx, "dx");
    args.dg = output_of(dg, "dg");
    args.dweight = output_of(dweight, "dweight");
    norm_gate_backward(args, norm_gate_options(activation, norm_before_gate, eps), context_of(pool));
  });
}

// The norm's attributes and inputs x, g, weight.
template <class Binding>
auto with_norm_gate(Binding binding) {
  return std::move(binding)
      .template Attr<std::string_view>("activation")
      .template Attr<int64_t>("norm_before_gate")
      .template Attr<float>("eps")
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>();
}

// The attributes of the recurrence's calls, in their order.
template <class Binding>
auto with_options(Binding binding) {
  return std::move(binding)
      .template Attr<std::string_view>("variant")
      .template Attr<float>("scale")
      .template Attr<int64_t>("default_scale")
      .template Attr<int64_t>("chunk")
      .template Attr<int64_t>("l2norm")
      .template Attr<std::string_view>("solve")
      .template Attr<int64_t>("gate_group")
      .template Attr<int64_t>("check_values");
}

// q, k, v, g, beta, b, w, h0.
template <class Binding>
auto with_inputs(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>();
}

// The arrays of flat::Sequences a call takes: cu_seqlens and initial_state_indices (a backward),
// then final_state_indices and token_state_indices (a forward).
template <class Binding>
auto with_reads(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>();
}

template <class Binding>
auto with_sequences(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>();
}

// x, weight, bias, state0 after the convolution's attribute.
template <class Binding>
auto with_conv_inputs(Binding binding) {
  return std::move(binding)
      .template Attr<std::string_view>("activation")
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlatForward, forward_impl,
                              with_sequences(with_inputs(with_options(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>())))
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlatBackward, backward_impl,
                              with_reads(with_inputs(with_options(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>())))
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlatConvForward, conv_forward_impl,
                              with_sequences(with_conv_inputs(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()))
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlatConvBackward, conv_backward_impl,
                              with_reads(with_conv_inputs(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()))
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlatNormGateForward, norm_gate_forward_impl,
                              with_norm_gate(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()).Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlatNormGateBackward, norm_gate_backward_impl,
                              with_norm_gate(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>())
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

std::vector<std::pair<std::string, void*>> jax_ffi_handlers() {
  return {{"flat_forward", reinterpret_cast<void*>(FlatForward)},
          {"flat_backward", reinterpret_cast<void*>(FlatBackward)},
          {"flat_conv_forward", reinterpret_cast<void*>(FlatConvForward)},
          {"flat_conv_backward", reinterpret_cast<void*>(FlatConvBackward)},
          {"flat_norm_gate_forward", reinterpret_cast<void*>(FlatNormGateForward)},
          {"flat_norm_gate_backward", reinterpret_cast<void*>(FlatNormGateBackward)}};
}

}  // namespace flat::python

#else

namespace flat::python {
std::vector<std::pair<std::string, void*>> jax_ffi_handlers() { return {}; }
}  // namespace flat::python

#endif

// The library as one XLA custom call on the CPU (JAX's typed FFI), `flat_call`: flat::call on
// XLA's buffers (dense, row-major) and on XLA's intra-op thread pool, the operation and its
// options as attributes by the library's names (flat/call.h; an option left out takes its
// default). A tensor the call does not have comes as an array of shape (0,) (a tensor of an empty
// batch has its rank, 3 or 4); flat::Sequences' arrays come as integer buffers (traced values, not
// attributes), 0 elements where not given (flat.jax refuses an empty cu_seqlens before it gets
// here). A pool updated in place is an input aliased to an output (ffi_call's
// input_output_aliases): the two buffers are one. Built only where jaxlib's FFI headers were found
// (FLAT_WITH_JAX_FFI); flat/jax.py registers the handler.
#include "jax_ffi.h"

#ifdef FLAT_WITH_JAX_FFI

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "flat/call.h"
#include "names.h"
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

// The library's errors (flat::Error) as XLA's, which JAX raises with the message, its argument
// named as flat.jax names it (names.h).
template <class Body>
ffi::Error guarded(Body&& body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error::InvalidArgument(python_names(e.what()));
  }
}

// An attribute's value as an option of flat::call (read by name: jaxlib's read by iterator does
// not compile).
OptionValue option_of(const ffi::Dictionary& attrs, const ffi::Dictionary::Iterator& at) {
  const std::string_view name = *at;
  if (attrs.isa<bool>(at)) return *attrs.get<bool>(name);
  if (attrs.isa<int64_t>(at)) return *attrs.get<int64_t>(name);
  if (attrs.isa<int32_t>(at)) return int64_t(*attrs.get<int32_t>(name));
  if (attrs.isa<double>(at)) return *attrs.get<double>(name);
  if (attrs.isa<float>(at)) return double(*attrs.get<float>(name));
  if (attrs.isa<std::string_view>(at)) return std::string(*attrs.get<std::string_view>(name));
  throw Error("flat: " + std::string(name) + ": expected a bool, an integer, a number or a string attribute");
}

// One handler for every operation (flat::call): the attributes `operation`, `variant` (forward and
// backward) and the operation's options by the library's names; the operands are the operation's
// input tensors in tensor_slots' order, then (where it takes them) the four arrays of
// flat::Sequences; the results its outputs in that order.
ffi::Error call_impl(ffi::ThreadPool pool, ffi::Dictionary attrs, ffi::RemainingArgs operands,
                     ffi::RemainingRets results) {
  return guarded([&] {
    NamedCall call;
    for (auto at = attrs.begin(); at != attrs.end(); ++at) {
      const OptionValue value = option_of(attrs, at);
      if (*at != "operation" && *at != "variant") {
        call.options.emplace_back(std::string(*at), value);
        continue;
      }
      const std::string* name = std::get_if<std::string>(&value);
      if (!name) throw Error("flat: " + std::string(*at) + ": expected a string attribute");
      if (*at == "operation") call.operation = parse_operation(*name);
      else call.variant = parse_variant(*name);
    }
    const std::span<const TensorSlot> slots = tensor_slots(call.operation);
    const size_t outputs = size_t(std::count_if(slots.begin(), slots.end(), [](const TensorSlot& s) { return s.output; }));
    const size_t inputs = slots.size() - outputs;
    const bool has_sequences = call.operation != Operation::norm_gate_forward &&
                               call.operation != Operation::norm_gate_backward;
    if (operands.size() != inputs + (has_sequences ? 4 : 0) || results.size() != outputs)
      throw Error("flat: " + std::string(operation_name(call.operation)) + ": expected " + std::to_string(inputs) +
                  " tensors" + (has_sequences ? " and 4 sequence arrays" : "") + " as operands and " +
                  std::to_string(outputs) + " results, got " + std::to_string(operands.size()) + " and " +
                  std::to_string(results.size()));
    size_t operand = 0, result = 0;
    for (const TensorSlot& slot : slots) {
      const std::string name(slot.name);
      const ffi::AnyBuffer buffer = slot.output ? **results.get<ffi::AnyBuffer>(result++)
                                                : *operands.get<ffi::AnyBuffer>(operand++);
      call.tensors.emplace_back(name, tensor_of(buffer, name.c_str()));
    }
    std::vector<int64_t> cu_seqlens, reads, writes, tokens;
    if (has_sequences) {
      cu_seqlens = ints_of(*operands.get<ffi::AnyBuffer>(operand++), "cu_seqlens");
      reads = ints_of(*operands.get<ffi::AnyBuffer>(operand++), "initial_state_indices");
      writes = ints_of(*operands.get<ffi::AnyBuffer>(operand++), "final_state_indices");
      tokens = ints_of(*operands.get<ffi::AnyBuffer>(operand++), "token_state_indices");
    }
    call.sequences = {cu_seqlens, reads, writes, tokens};
    flat::call(call, context_of(pool));
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlatCall, call_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Attrs<ffi::Dictionary>()
                                  .RemainingArgs()
                                  .RemainingRets());

std::vector<std::pair<std::string, void*>> jax_ffi_handlers() {
  return {{"flat_call", reinterpret_cast<void*>(FlatCall)}};
}

}  // namespace flat::python

#else

namespace flat::python {
std::vector<std::pair<std::string, void*>> jax_ffi_handlers() { return {}; }
}  // namespace flat::python

#endif

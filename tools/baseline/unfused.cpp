// The chunkwise algorithm left unfused, as a framework runs it (FLA's chunk_fwd_h + chunk_fwd_o,
// chunk_bwd_dh + chunk_bwd_dqkwg): the same chunk stages as the fused kernels, but every
// chunk-start state (and in the backward every chunk-end dH) is written to memory by one pass
// and read back by the next, which runs over (item, chunk).
#include <cstring>
#include <string>
#include <string_view>

#include "baseline/baselines.h"
#include "baseline/unfused_stages.h"
#include "cpu/recurrence.h"
#include "cpu/buffer.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"
#include "flat/flat.h"

namespace flat::baseline {
namespace {

using cpu::AlignedBuffer;

// [items, chunks + 1, K, pack * V]: the state before every chunk and after the last.
struct StateSequence {
  explicit StateSequence(const Params& p)
      : per_item(cpu::state_bytes(p) / sizeof(float) * size_t(cpu::chunk_count(p) + 1)),
        memory(sizeof(float) * per_item * size_t(cpu::item_count(p))) {}
  float* item(int64_t index) const { return memory.floats() + size_t(index) * per_item; }
  const size_t per_item;
  AlignedBuffer memory;
};

// Runs body(b, m, item) over every item, each thread with its own workspace.
template <class Body>
void over_items(const Params& p, const cpu::Run& run, Body&& body) {
  const UnfusedStages& kernels = unfused_stages(run.target);
  const int items = p.N / p.pack;
  cpu::run_ranges(run, cpu::item_count(p), [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p)), state(cpu::state_bytes(p));
    for (int64_t item = begin; item < end; ++item)
      body(int(item / items), int(item % items), item, workspace.data, state.floats());
  });
}

// Runs body(b, m, c, item, workspace) over every (item, chunk).
template <class Body>
void over_chunks(const Params& p, const cpu::Run& run, Body&& body) {
  const UnfusedStages& kernels = unfused_stages(run.target);
  const int chunks = cpu::chunk_count(p), items = p.N / p.pack;
  cpu::run_ranges(run, cpu::item_count(p) * chunks, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t item = i / chunks;
      body(int(item / items), int(item % items), int(i % chunks), item, workspace.data);
    }
  });
}

// Pass 1, state passing: the chunk-start states of every item to memory (and ht when asked).
void pass_states(const Params& p, const cpu::Run& run, const StateSequence& states) {
  over_items(p, run, [&](int, int, int64_t item, void* workspace, float*) {
    run.target.sequence.forward(p, item, 1, workspace, states.item(item), true, nullptr, false);
  });
}

}  // namespace

const UnfusedStages& unfused_stages(const cpu::Target& target) {
#define FLAT_CPU_TARGET(isa) \
  if (std::string_view(target.name) == #isa) return unfused_stages_##isa();
#include "flat_cpu_targets.inc"
#undef FLAT_CPU_TARGET
  throw Error(std::string("flat bench: no unfused baseline for the target '") + target.name + "'");
}

void unfused_forward(const Params& p, const cpu::Run& run) {
  const UnfusedStages& kernels = unfused_stages(run.target);
  const size_t state = cpu::state_bytes(p) / sizeof(float);
  const StateSequence states(p);
  pass_states(p, run, states);
  // Pass 2, outputs: each chunk reads its start state back from memory.
  over_chunks(p, run, [&](int b, int m, int c, int64_t item, void* workspace) {
    kernels.chunk_output(p, b, m, c, workspace, states.item(item) + size_t(c) * state);
  });
}

void unfused_backward(const Params& p, const cpu::Run& run) {
  const UnfusedStages& kernels = unfused_stages(run.target);
  const size_t state = cpu::state_bytes(p) / sizeof(float);
  const int chunks = cpu::chunk_count(p);
  const StateSequence states(p);
  pass_states(p, run, states);

  // Pass 2, state gradients: dH at the end of every chunk to memory, walking back from dht.
  const StateSequence dstates(p);
  over_items(p, run, [&](int b, int m, int64_t item, void* workspace, float* dH) {
    kernels.initial_state_gradient(p, item, dH);
    for (int c = chunks - 1; c >= 0; --c) {
      std::memcpy(dstates.item(item) + size_t(c + 1) * state, dH, sizeof(float) * state);
      kernels.chunk_state_gradient(p, b, m, c, workspace, dH);
    }
    kernels.final_state_gradient(p, item, dH);
  });

  // Pass 3, gradients of every chunk from its start state and end-state gradient in memory.
  cpu::Gradients grads(p);
  over_chunks(p, run, [&](int b, int m, int c, int64_t item, void* workspace) {
    kernels.chunk_gradients(p, b, m, c, workspace, states.item(item) + size_t(c) * state,
                            dstates.item(item) + size_t(c + 1) * state, grads.sinks);
  });
  grads.finish(run);
}

}  // namespace flat::baseline

// The chunkwise algorithm left unfused, as a framework runs it (FLA's chunk_fwd_h + chunk_fwd_o,
// chunk_bwd_dh + chunk_bwd_dqkwg): the same chunk stages as the fused kernels, but every
// chunk-start state (and in the backward every chunk-end dH) is written to memory by one pass
// and read back by the next, which runs over (batch, head, chunk).
#include <cstring>

#include "baseline/baselines.h"
#include "cpu/additive.h"
#include "cpu/buffer.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace flat::baseline {
namespace {

using cpu::AlignedBuffer;

// [B*N, chunks + 1, K, V]: the state before every chunk and after the last.
struct StateSequence {
  explicit StateSequence(const AdditiveParams& p)
      : per_item(size_t(cpu::chunk_count(p) + 1) * p.K * p.V), memory(sizeof(float) * per_item * p.B * p.N) {}
  float* item(int64_t index) const { return memory.floats() + size_t(index) * per_item; }
  const size_t per_item;
  AlignedBuffer memory;
};

// Pass 1, state passing: the chunk-start states of every (batch, head) to memory.
void pass_states(const AdditiveParams& p, const cpu::SequenceKernels& kernels, const StateSequence& states) {
  cpu::parallel_ranges(int64_t(p.B) * p.N, p.threads, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p)), H(cpu::state_bytes(p));
    for (int64_t item = begin; item < end; ++item)
      kernels.forward(p, int(item / p.N), int(item % p.N), workspace.data, H.floats(), states.item(item), false);
  });
}

// Runs body(b, n, c, workspace) over every (batch, head, chunk).
template <class Body>
void over_chunks(const AdditiveParams& p, const cpu::SequenceKernels& kernels, Body&& body) {
  const int chunks = cpu::chunk_count(p);
  cpu::parallel_ranges(int64_t(p.B) * p.N * chunks, p.threads, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t item = i / chunks;
      body(int(item / p.N), int(item % p.N), int(i % chunks), item, workspace.data);
    }
  });
}

}  // namespace

void unfused_forward(const AdditiveParams& p) {
  const cpu::SequenceKernels& kernels = cpu::sequence_kernels(cpu::active_isa());
  const size_t KV = size_t(p.K) * p.V;
  const StateSequence states(p);
  pass_states(p, kernels, states);
  // Pass 2, outputs: each chunk reads its start state back from memory.
  over_chunks(p, kernels, [&](int b, int n, int c, int64_t item, void* workspace) {
    kernels.chunk_output(p, b, n, c, workspace, states.item(item) + size_t(c) * KV);
  });
  if (p.ht.present())
    for (int64_t item = 0; item < int64_t(p.B) * p.N; ++item)
      cpu::store_state(p.ht, int(item / p.N), int(item % p.N), states.item(item) + size_t(cpu::chunk_count(p)) * KV,
                       p.K, p.V);
}

void unfused_backward(const AdditiveParams& p) {
  const cpu::SequenceKernels& kernels = cpu::sequence_kernels(cpu::active_isa());
  const size_t KV = size_t(p.K) * p.V;
  const int chunks = cpu::chunk_count(p);
  const StateSequence states(p);
  pass_states(p, kernels, states);

  // Pass 2, state gradients: dH at the end of every chunk to memory, walking back from dht.
  const StateSequence dstates(p);
  cpu::parallel_ranges(int64_t(p.B) * p.N, p.threads, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p)), dH(cpu::state_bytes(p));
    for (int64_t item = begin; item < end; ++item) {
      const int b = int(item / p.N), n = int(item % p.N);
      float* d = dH.floats();
      std::memset(d, 0, sizeof(float) * KV);
      if (p.dht.present())
        for (int c = 0; c < p.K; ++c) cpu::load_row(p.dht, b, n, c, d + size_t(c) * p.V, p.V);
      for (int c = chunks - 1; c >= 0; --c) {
        std::memcpy(dstates.item(item) + size_t(c + 1) * KV, d, sizeof(float) * KV);
        kernels.chunk_state_gradient(p, b, n, c, workspace.data, d);
      }
      if (p.dh0.present()) cpu::store_state(p.dh0, b, n, d, p.K, p.V);
    }
  });

  // Pass 3, gradients of every chunk from its start state and end-state gradient in memory.
  cpu::Gradients grads(p);
  over_chunks(p, kernels, [&](int b, int n, int c, int64_t item, void* workspace) {
    kernels.chunk_gradients(p, b, n, c, workspace, states.item(item) + size_t(c) * KV,
                            dstates.item(item) + size_t(c + 1) * KV, grads.sinks);
  });
  grads.finish();
}

}  // namespace flat::baseline

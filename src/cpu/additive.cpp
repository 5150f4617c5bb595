// Drivers of the additive family: thread partition over (batch, head), per-thread workspaces,
// and the fixed-order reductions over heads that share an input. The math of one (batch, head)
// lives in the stages (stages.inc), compiled per instruction set and picked at run time.
#include "cpu/additive.h"

#include <algorithm>
#include <vector>

#include "cpu/buffer.h"

#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace flat::cpu {

const SequenceKernels& sequence_kernels(Isa isa) {
  return isa == Isa::avx512 ? avx512::sequence_kernels() : generic::sequence_kernels();
}

size_t state_bytes(const AdditiveParams& p) { return sizeof(float) * size_t(p.K) * p.V; }
int chunk_count(const AdditiveParams& p) { return (p.S + p.chunk - 1) / p.chunk; }

void store_state(const RowView& view, int b, int n, const float* H, int K, int V) {
  for (int c = 0; c < K; ++c) store_row(view, b, n, c, H + size_t(c) * V, V);
}

namespace {


// out(b, s, x) = sum over the heads n = x*group .. x*group+group-1 of scratch(b, s, n), in that
// order. With over_sequence (retnet's per-head gate) out(x) also sums over b, then s.
void reduce_heads(const AdditiveParams& p, const RowView& scratch, const RowView& out, int group, int width,
                  bool over_sequence) {
  const int Nx = p.N / group;
  if (over_sequence) {
    // Thousands of terms of both signs: summed in float64, rounded once.
    std::vector<double> acc(static_cast<size_t>(width));
    std::vector<float> row(static_cast<size_t>(width)), result(static_cast<size_t>(width));
    for (int x = 0; x < Nx; ++x) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int b = 0; b < p.B; ++b)
        for (int s = 0; s < p.S; ++s)
          for (int r = 0; r < group; ++r) {
            load_row(scratch, b, s, x * group + r, row.data(), width);
            for (int c = 0; c < width; ++c) acc[size_t(c)] += row[size_t(c)];
          }
      for (int c = 0; c < width; ++c) result[size_t(c)] = float(acc[size_t(c)]);
      store_row(out, 0, 0, x, result.data(), width);
    }
    return;
  }
  parallel_ranges(int64_t(p.B) * p.S, p.threads, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(width)), row(static_cast<size_t>(width));
    for (int64_t bs = begin; bs < end; ++bs) {
      const int b = int(bs / p.S), s = int(bs % p.S);
      for (int x = 0; x < Nx; ++x) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int r = 0; r < group; ++r) {
          load_row(scratch, b, s, x * group + r, row.data(), width);
          for (int c = 0; c < width; ++c) acc[size_t(c)] += row[size_t(c)];
        }
        store_row(out, b, s, x, acc.data(), width);
      }
    }
  });
}

}  // namespace

Gradients::Gradients(const AdditiveParams& p)
    : p_(p),
      gate_width_(p.gate == GateKind::channel ? p.K : 1),
      gate_reduced_(p.gate != GateKind::none && (p.group_g > 1 || p.gate_per_sequence)) {
  sinks.dq = sink(q_, p.dq, p.group_q > 1, p.K);
  sinks.dk = sink(k_, p.dk, p.group_k > 1, p.K);
  sinks.dv = sink(v_, p.dv, p.group_v > 1, p.V);
  sinks.dg = sink(g_, p.dg, gate_reduced_, gate_width_);
}

RowView Gradients::sink(std::vector<float>& scratch, const RowView& out, bool reduced, int width) {
  if (!reduced) return out;
  scratch.resize(size_t(p_.B) * p_.S * p_.N * width);
  RowView r;
  r.base = reinterpret_cast<char*>(scratch.data());
  r.dtype = DType::f32;
  r.stride0 = int64_t(p_.S) * p_.N * width;
  r.stride1 = int64_t(p_.N) * width;
  r.stride2 = width;
  return r;
}

void Gradients::finish() const {
  if (p_.group_q > 1) reduce_heads(p_, sinks.dq, p_.dq, p_.group_q, p_.K, false);
  if (p_.group_k > 1) reduce_heads(p_, sinks.dk, p_.dk, p_.group_k, p_.K, false);
  if (p_.group_v > 1) reduce_heads(p_, sinks.dv, p_.dv, p_.group_v, p_.V, false);
  if (gate_reduced_) reduce_heads(p_, sinks.dg, p_.dg, p_.group_g, gate_width_, p_.gate_per_sequence);
}

void additive_forward(const AdditiveParams& p) {
  const SequenceKernels& kernels = sequence_kernels(active_isa());
  parallel_ranges(int64_t(p.B) * p.N, p.threads, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p)), H(state_bytes(p));
    for (int64_t item = begin; item < end; ++item) {
      const int b = int(item / p.N), n = int(item % p.N);
      kernels.forward(p, b, n, workspace.data, H.floats(), nullptr, true);
      if (p.ht.present()) store_state(p.ht, b, n, H.floats(), p.K, p.V);
    }
  });
}

void additive_backward(const AdditiveParams& p) {
  const SequenceKernels& kernels = sequence_kernels(active_isa());
  Gradients grads(p);
  parallel_ranges(int64_t(p.B) * p.N, p.threads, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p)), H(state_bytes(p)), dH(state_bytes(p));
    AlignedBuffer states(state_bytes(p) * size_t(chunk_count(p) + 1));
    for (int64_t item = begin; item < end; ++item) {
      const int b = int(item / p.N), n = int(item % p.N);
      kernels.forward(p, b, n, workspace.data, H.floats(), states.floats(), false);
      kernels.backward(p, b, n, workspace.data, states.floats(), dH.floats(), grads.sinks);
    }
  });
  grads.finish();
}

}  // namespace flat::cpu

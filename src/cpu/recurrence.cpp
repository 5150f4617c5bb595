// Drivers of the recurrences: thread partition over items (batch, pack of heads), per-thread
// workspaces, and the fixed-order reductions over items that share an input. The math of one
// item lives in the stages (src/cpu/stages/), instantiated per target (src/cpu/targets.h); the
// call's Run says which target and which workers.
#include "cpu/recurrence.h"

#include <algorithm>
#include <vector>

#include "cpu/buffer.h"

#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace flat::cpu {

size_t state_bytes(const Params& p) { return sizeof(float) * size_t(p.K) * p.V * p.pack; }
int chunk_count(const Params& p) { return (p.S + p.chunk - 1) / p.chunk; }
int64_t item_count(const Params& p) { return int64_t(p.B) * (p.N / p.pack); }

namespace {

// out(b, s, x) = sum over the scratch rows x*group .. x*group+group-1 of scratch(b, s, .), in that
// order. With over_sequence (retnet's per-head gate) out(x) also sums over b, then s.
void reduce_heads(const Params& p, const Workers& workers, const RowView& scratch, const RowView& out, int rows,
                  int group, int width, bool over_sequence) {
  const int Nx = rows / group;
  // acc += the group's rows at (b, s), through `row` ([width] scratch of the calling thread).
  auto sum_group = [&](int b, int s, int x, float* row, auto* acc) {
    for (int r = 0; r < group; ++r) {
      load_row(scratch, b, s, x * group + r, row, width);
      for (int c = 0; c < width; ++c) acc[c] += row[c];
    }
  };
  if (over_sequence) {
    // Thousands of terms of both signs: summed in float64, rounded once.
    std::vector<double> acc(static_cast<size_t>(width));
    std::vector<float> row(static_cast<size_t>(width));
    for (int x = 0; x < Nx; ++x) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int b = 0; b < p.B; ++b)
        for (int s = 0; s < p.S; ++s) sum_group(b, s, x, row.data(), acc.data());
      for (int c = 0; c < width; ++c) row[size_t(c)] = float(acc[size_t(c)]);
      store_row(out, 0, 0, x, row.data(), width);
    }
    return;
  }
  parallel_ranges(int64_t(p.B) * p.S, workers, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(width)), row(static_cast<size_t>(width));
    for (int64_t bs = begin; bs < end; ++bs) {
      const int b = int(bs / p.S), s = int(bs % p.S);
      for (int x = 0; x < Nx; ++x) {
        std::fill(acc.begin(), acc.end(), 0.f);
        sum_group(b, s, x, row.data(), acc.data());
        store_row(out, b, s, x, acc.data(), width);
      }
    }
  });
}

}  // namespace

// Per-item gradients (inputs the packed heads share: q, k, g, beta, b) are rows of item m; per-head
// ones (v, w) rows of head n. Either goes straight to its output when exactly one row feeds each
// output row, else to scratch that finish() reduces.
Gradients::Gradients(const Params& p) : p_(p) {
  const int items = p.N / p.pack;
  const int gate_width = p.gate == GateKind::channel ? p.K / p.gate_group : 1;
  add(sinks.dq, p.dq, items, p.group_q / p.pack, p.K, false);
  add(sinks.dk, p.dk, items, p.group_k / p.pack, p.K, false);
  add(sinks.dv, p.dv, p.N, p.group_v, p.V, false);
  if (p.gate != GateKind::none)
    add(sinks.dg, p.dg, items, p.group_g / p.pack, gate_width, p.gate_per_sequence);
  if (p.delta == Delta::beta) add(sinks.dbeta, p.dbeta, items, p.group_b / p.pack, 1, false);
  if (p.delta == Delta::erase_write) {
    add(sinks.db, p.db, items, p.group_b / p.pack, p.K, false);
    add(sinks.dw, p.dw, p.N, p.group_w, p.V, false);
  }
}

void Gradients::add(RowView& sink, const RowView& out, int rows, int group, int width, bool over_sequence) {
  if (group == 1 && !over_sequence) {
    sink = out;
    return;
  }
  Reduction& r = reductions_.emplace_back(Reduction{{}, {}, out, rows, group, width, over_sequence});
  r.scratch.resize(size_t(p_.B) * p_.S * rows * width);
  r.view.base = reinterpret_cast<char*>(r.scratch.data());
  r.view.dtype = DType::f32;
  r.view.stride0 = int64_t(p_.S) * rows * width;
  r.view.stride1 = int64_t(rows) * width;
  r.view.stride2 = width;
  sink = r.view;
}

void Gradients::finish(const Workers& workers) const {
  for (const Reduction& r : reductions_)
    reduce_heads(p_, workers, r.view, r.out, r.rows, r.group, r.width, r.over_sequence);
}

// The forward runs up to kLockstepItems items in lockstep (SequenceKernels::forward), their states
// side by side in L2 (8 x 64 KiB at K = V = 128). Measured at the bench's shape, 2 threads, against
// one item at a time: gla forward 72-75 against 78-79 ms, kda 120-122 against 124-134 ms (4 and
// 16 items in between or no better). The backward, which keeps every chunk-start state of its
// items, ran no faster with 4 items and slower with 8 (more states streamed through L2), so it
// runs one item at a time.
constexpr int kLockstepItems = 8;

void recurrence_forward(const Params& p, const Run& run) {
  const SequenceKernels& kernels = run.target.sequence;
  run_ranges(run, item_count(p), [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p)), H(state_bytes(p) * kLockstepItems);
    for (int64_t first = begin; first < end; first += kLockstepItems) {
      const int count = int(std::min<int64_t>(kLockstepItems, end - first));
      kernels.forward(p, first, count, workspace.data, H.floats(), nullptr, true);
    }
  });
}

void recurrence_backward(const Params& p, const Run& run) {
  const SequenceKernels& kernels = run.target.sequence;
  Gradients grads(p);
  run_ranges(run, item_count(p), [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p)), H(state_bytes(p)), dH(state_bytes(p));
    AlignedBuffer states(state_bytes(p) * size_t(chunk_count(p) + 1));
    for (int64_t item = begin; item < end; ++item) {
      kernels.forward(p, item, 1, workspace.data, H.floats(), states.floats(), false);
      kernels.backward(p, item, workspace.data, states.floats(), dH.floats(), grads.sinks);
    }
  });
  grads.finish(run.workers);
}

}  // namespace flat::cpu

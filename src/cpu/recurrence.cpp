// Drivers of the recurrences: thread partition over items (sequence, pack of heads), per-thread
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
void reduce_heads(const Params& p, const Run& run, const RowView& scratch, const RowView& out, int rows,
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
  run_ranges(run, int64_t(p.B) * p.S, [&](int64_t begin, int64_t end) {
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

void Gradients::finish(const Run& run) const {
  for (const Reduction& r : reductions_)
    reduce_heads(p_, run, r.view, r.out, r.rows, r.group, r.width, r.over_sequence);
}

namespace {

// Sequence i of a call that splits its rows (Params::sequences) as a problem of its own, which
// the stages run as they run a call of one batch row: its tokens, its state rows (absent where
// an index is -1), S = 0 for an empty sequence (no chunk: the final state is the initial one,
// dh0 is dht).
Params sequence_params(const Params& p, int64_t i) {
  using P = Params;
  // A per-head gate (retnet) has zero batch and token strides and stays where it is.
  return sequence_problem(p, i,
                          {{&P::q, &P::k, &P::v, &P::g, &P::beta, &P::b, &P::w, &P::y, &P::dy, &P::dq, &P::dk, &P::dv,
                            &P::dg, &P::dbeta, &P::db, &P::dw},
                           &P::h0, &P::ht, &P::dht, &P::dh0});
}

// The call's work items, (sequence, pack of heads). A call whose rows are its sequences is one
// problem, p itself, whose items are the stages' own (batch, pack), so that neighbouring batch
// rows go in lockstep; a call that splits its rows is one problem per sequence, of N / pack
// items each.
struct Work {
  explicit Work(const Params& p)
      : p(p),
        split(p.sequences.split()),
        problems(split ? p.sequences.count(p.B) : 1),
        per_problem(split ? p.N / p.pack : item_count(p)) {}

  int64_t items() const { return problems * per_problem; }
  Params problem(int64_t i) const { return split ? sequence_params(p, i) : p; }
  // The gradients' sinks, moved to sequence i's tokens.
  GradSinks sinks(const GradSinks& all, int64_t i) const {
    if (!split) return all;
    GradSinks one = all;
    for (RowView* view : {&one.dq, &one.dk, &one.dv, &one.dg, &one.dbeta, &one.db, &one.dw})
      *view = view->from(p.sequences.batch(i), p.sequences.start(i));
    return one;
  }
  // The longest problem's tokens: what a per-thread buffer of chunk-start states must hold.
  int longest() const {
    int S = split ? 0 : p.S;
    for (int64_t i = 0; split && i < problems; ++i) S = std::max(S, p.sequences.length(i, p.S));
    return S;
  }
  // Calls body(begin, end) on the workers, on contiguous ranges of the items. Sequences of a call
  // differ in length, so its ranges are cut to about equal tokens (an item costs its sequence's
  // length plus one, for the state it moves even when empty) rather than items. The cut depends on
  // the thread count; the results do not, every item being computed alike wherever it runs.
  template <class Body>
  void ranges(const Run& run, Body&& body) const {
    if (!split) return run_ranges(run, items(), body);
    std::vector<int64_t> before(size_t(items()) + 1, 0);  // the cost of the items before each
    for (int64_t item = 0; item < items(); ++item)
      before[size_t(item) + 1] = before[size_t(item)] + p.sequences.length(item / per_problem, p.S) + 1;
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>({run.workers.threads, items(), max_threads()}));
    const auto cut = [&](int64_t part) {
      return int64_t(std::lower_bound(before.begin(), before.end(), before.back() * part / parts) - before.begin());
    };
    run_ranges(run, parts, [&](int64_t first, int64_t last) {
      for (int64_t part = first; part < last; ++part) body(cut(part), cut(part + 1));
    });
  }

  const Params& p;
  bool split;
  int64_t problems, per_problem;
};

}  // namespace

// The forward runs up to kLockstepItems items in lockstep (SequenceKernels::forward), their states
// side by side in L2 (8 x 64 KiB at K = V = 128). Measured at the bench's shape, 2 threads, against
// one item at a time: gla forward 72-75 against 78-79 ms, kda 120-122 against 124-134 ms (4 and
// 16 items in between or no better). The backward runs both its passes kLockstepBackwardItems
// at a time: fewer, since each item also keeps every chunk-start state (4 MiB at the bench's
// shape) for the gradient pass to stream back. Measured on an EPYC Zen 3 (avx2, 2 threads, the
// bench's shape) against one item at a time: gla backward 304-306 against 336-339 ms, mamba2
// 255-256 against 279-282, gated_deltanet 445-448 against 471-480, kda 498-512 against 541-542;
// with the products removed (their cost on a tile unit), 10-16% less; 2, 3 and 8 items no better.
// Its groups hold heads of one batch row: with one head per row (B = 32, N = 1, gla, 1 thread)
// groups across rows ran the backward in 505-516 ms against 524-535 one at a time, in 199-202
// against 216-221 without products. (The forward's groups measured the same either way.)
constexpr int kLockstepItems = 8;
constexpr int kLockstepBackwardItems = 4;

// The backward's items in lockstep: kLockstepBackwardItems, fewer where a group's records (its
// items' chunk-start states, or their kept solves) would outgrow a kept buffer (kKeptScratchBytes)
// and be allocated for the call alone, their pages faulted in and zeroed anew every call. sla's
// state (K = 256, 4 value heads: 512 KiB) keeps 32.5 MiB of states an item at S = 4096: 4 items
// took 130 MiB a thread, and the kernel's page faults a fifth of the backward. Measured (an AMX
// Xeon, amx, fast, 2 threads, the bench's sla shape): 297-312 ms at 4 items, 205-236 at 1; with
// the buffers kept at any size, 4, 2 and 1 items the same (200-225): an item of that size fills
// L2 alone, so its lockstep gains nothing. Long sequences come to the same at K = 128
// (S = 16384: 16 MiB of states an item, 3 in lockstep; la's backward there, B = 1, 158-164 ms at 4
// against 133-139 at 3).
int backward_lockstep(size_t item_states_bytes, size_t item_solves_bytes) {
  const size_t largest = std::max(item_states_bytes, item_solves_bytes);
  return int(std::clamp<size_t>(kKeptScratchBytes / std::max<size_t>(largest, 1), 1, kLockstepBackwardItems));
}

// A problem of at most kStepTokens tokens runs token by token (the decode path, stages/step.h):
// from memory to memory with no chunk's products, where the chunkwise form pays for forming a
// whole chunk's working set. Measured (64 sequences x 16 heads, K = V = 128, bf16, 2 threads, the
// forward from the zero state, ms, token by token against chunkwise): gated_deltanet S = 1 1.48
// against 5.03, S = 2 1.80 / 2.75, S = 4 4.38 / 3.82, S = 8 9.36 / 6.71; gla S = 1 0.81 / 2.77,
// S = 2 1.59 / 2.10, S = 4 6.04 / 3.07. The state's own traffic (h0 read, ht written) is the same
// on both paths.
constexpr int kStepTokens = 2;

// An empty sequence (S = 0) takes the chunkwise path, which passes its initial state on.
bool runs_step(const Params& p) { return p.token_states.any() || (p.S >= 1 && p.S <= kStepTokens); }

// Items in lockstep belong to one problem (one sequence, or a call whose rows are its sequences).
void recurrence_forward(const Params& p, const Run& run) {
  const SequenceKernels& kernels = run.target.sequence;
  const Work work(p);
  work.ranges(run, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p)), H(state_bytes(p) * kLockstepItems);
    for (int64_t item = begin; item < end;) {
      const int64_t problem = item / work.per_problem, first = item % work.per_problem;
      const int count = int(std::min<int64_t>({kLockstepItems, end - item, work.per_problem - first}));
      const Params one = work.problem(problem);
      if (runs_step(one)) {
        kernels.step(one, first, count, workspace.data, H.floats());
      } else {
        kernels.forward(one, first, count, workspace.data, H.floats(), false, nullptr, true);
      }
      item += count;
    }
  });
}

void recurrence_backward(const Params& p, const Run& run) {
  const SequenceKernels& kernels = run.target.sequence;
  const Work work(p);
  Gradients grads(p);
  Params longest = p;
  longest.S = work.longest();
  // The delta rule's state pass also keeps each chunk's solve for the gradient pass
  // (solve_record_floats): 48 KiB a chunk at C = 64 and V = 128, beside its 64 KiB chunk-start
  // state, for about a tenth of the backward's time (docs/performance.md, "Kept solves").
  const size_t states_bytes = state_bytes(p) * size_t(chunk_count(longest) + 1);
  const size_t solves_bytes = sizeof(float) * solve_record_floats(p) * size_t(chunk_count(longest));
  const int group = backward_lockstep(states_bytes, solves_bytes);
  work.ranges(run, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(kernels.workspace_bytes(p)), dH(state_bytes(p) * size_t(group));
    KeptScratch states(ScratchSlot::chunk_states, states_bytes * size_t(group));
    KeptScratch solves(ScratchSlot::kept_solves, solves_bytes * size_t(group));  // none for the additive family
    for (int64_t item = begin; item < end;) {
      const int64_t problem = item / work.per_problem, first = item % work.per_problem;
      // Heads of one batch row only: another row's share no pages with them.
      const int64_t row_items = p.N / p.pack, rest_of_row = row_items - first % row_items;
      const int count =
          int(std::min<int64_t>({group, end - item, work.per_problem - first, rest_of_row}));
      const Params one = work.problem(problem);
      kernels.forward(one, first, count, workspace.data, states.floats(), true, solves.floats(), false);
      kernels.backward(one, first, count, workspace.data, states.floats(), solves.floats(), dH.floats(),
                       work.sinks(grads.sinks, problem));
      item += count;
    }
  });
  grads.finish(run);
}

}  // namespace flat::cpu

// Inside a chunk of L <= C tokens, with a_t = exp(g_t) in [0, 1] (per channel or per head),
//   P_i = prod_{s<=i} a_s        (decay from the chunk start through token i)
//   R_j = prod_{j<s<L} a_s       (decay from token j to the chunk end)
//   F_ij = prod_{j<s<=i} a_s     (decay from key j to query i, j <= i)
// the forward is
//   y_i   = scale * ( (q_i * P_i)^T H0 + sum_{j<=i} <q_i * F_ij, k_j> v_j )
//   H_end = P_{L-1} * H0 + sum_j (k_j * R_j) v_j^T
// Every factor is a product of numbers in [0, 1]: no exponent of a positive log-decay is ever
// formed, so any finite g <= 0 gives finite results (products underflow to 0 gracefully).
// Per-channel F is factored through the last row r of a 16-token block for all queries after the
// block (F_ij = F_ir * F_rj, both <= 1), which makes the cross-block scores one matrix product;
// inside the diagonal blocks the pairwise factors are exact running products.
// docs/algorithm.md has the derivation and the backward.
//
// This header: the forward of one chunk (output and state update) and the fused forward of a run of
// items chunk by chunk.
//
// Everything here has internal linkage (an anonymous namespace): each target's translation unit
// (src/cpu/target_<name>.cpp) compiles its own copy with its own flags, so no out-of-line copy
// built for one instruction set is picked by the linker for another. For the same reason it uses
// no standard-library templates but header-only ones that inline.
#pragma once

#include <cstring>

#include "cpu/sequence_kernels.h"
#include "cpu/stages/loader.h"
#include "cpu/stages/solve.h"

namespace flat::cpu::stages {
namespace {

// ---- Chunk stages shared by both families -----------------------------------------------------

// The chunk's products with its start state H0 [K, VW]: bp H0 into dz (the delta rule) and, with
// the output, (q * P) H0 into out, both on one pass over H0 (the target packs it once).
template <class Ops>
void state_products(Chunk& ch, const float* H0, bool with_output) {
  const int L = ch.L, VW = ch.VW;
  if (with_output) ch.decayed_queries = decayed(ch, ch.queries, ch.q, ch.prefix, ch.qg_factor, ch.qg);
  if (ch.delta && with_output)
    gemm_scaled_nn_sharing_b<Ops>(ch, L, VW, ch.decayed_erase, ch.dz, ch.decayed_queries, ch.out, H0, VW);
  else if (ch.delta)
    gemm_scaled_nn<Ops>(ch, L, VW, ch.decayed_erase, H0, VW, ch.dz);
  else if (with_output)
    gemm_scaled_nn<Ops>(ch, L, VW, ch.decayed_queries, H0, VW, ch.out);
}

// Writes y = scale * out over the loaded chunk's tokens, scaled as they are stored (streamed past the
// caches where the call's outputs are large, Params::streamed_outputs).
void store_output(const Params& p, const Item& item, int t0, const Chunk& ch) {
  for (int i = 0; i < ch.L; ++i) item.store_wide(p.y, t0 + i, 1, ch.out + size_t(i) * ch.VW, ch.V, p.scale);
}

// y of the loaded chunk, out holding (q * P) H0 (state_products): scale * ((q * P) H0 + A values);
// the scores A formed here unless `scores_formed` (prepare_delta).
template <class Ops>
void output(const Params& p, const Item& item, int t0, Chunk& ch, bool scores_formed = false) {
  if (!scores_formed) intra_scores<Ops>(ch, ch.q, ch.k, ch.queries, ch.keys, ch.scores, false);
  gemm_nn<Ops>(ch, ch.L, ch.VW, ch.L, ch.scores, ch.C, ch.values(), ch.VW, ch.out, ch.VW, true, Triangle::a_lower,
               Operands::f32, ch.values_values, Layout::rows, {}, ch.values_bf16);
  store_output(p, item, t0, ch);
}

// (k * R) as the state update beside the output reads it. At Precision::fast, where products of
// any values run as one call (one_call), rows with factors (a scalar gate's, the L2 norm's) are
// formed (into ch.kd), so that the update shares the output's call and the values are packed
// once (on an AMX Xeon, docs/performance.md, "One pack of the values at fast precision"); the
// factors then round with k rather than with the values.
ScaledRows update_keys(Chunk& ch, const ScaledRows& kd) {
  if (ch.precision != Precision::fast || !kd.factor) return kd;
  if (kd.bf16.present())
    scale_bf16_rows(ch.kd, kd.bf16, kd.factor, ch.L, ch.K);
  else
    scale_rows(ch.kd, kd.rows, kd.factor, ch.L, ch.K, 1);
  return {ch.kd, nullptr, Operands::f32};
}

// output (with `write_y`), then H_end = P_{L-1} * H0 + (k * R)^T values over the loaded chunk
// (H_end may be H0, updated in place). Where (k * R) is rows without factors that can share a call
// with the scores (one_call: fp32 rows, from a per-channel gate or fp32 inputs without one; any
// rows at Precision::fast, update_keys), the two products that read the values, A values into out
// and (k * R)^T values into H_end, are one call, so a target that packs B packs the values once
// (Ops::gemm_shared_b); otherwise (k * R) is bf16 rows of k (no gate) or k with factors, which go
// on the update's B (gemm_scaled_tn), packed again.
template <class Ops>
void output_and_update(const Params& p, const Item& item, int t0, Chunk& ch, const float* H0, float* H_end,
                       bool write_y, bool scores_formed) {
  const int C = ch.C, K = ch.K, VW = ch.VW, L = ch.L;
  const ScaledRows decayed_keys = decayed(ch, ch.keys, ch.k, ch.suffix, ch.kd_factor, ch.kd);
  const ScaledRows kd = write_y ? update_keys(ch, decayed_keys) : decayed_keys;
  decay_state(ch, H0, H_end);
  if (!write_y || kd.factor || !one_call(ch, Operands::f32, kd.values)) {
    if (write_y) output<Ops>(p, item, t0, ch, scores_formed);
    gemm_scaled_tn<Ops>(ch, VW, L, kd, ch.values(), VW, ch.values_values, H_end, VW, true, ch.values_bf16);
    return;
  }
  if (!scores_formed) intra_scores<Ops>(ch, ch.q, ch.k, ch.queries, ch.keys, ch.scores, false);
  const SharedBProduct products[2] = {{L, ch.scores, C, ch.out, VW, Layout::rows, Triangle::a_lower},
                                      {K, kd.rows, K, H_end, VW, Layout::columns, Triangle::none, kd.bf16}};
  Ops::gemm_shared_b(chunk_products(ch, Operands::f32, ch.values_values, true), 2, products, VW, L, ch.values(), VW,
                     ch.values_bf16);
  store_output(p, item, t0, ch);
}

// Keeps the loaded chunk's solve T and new values rv in its solve record (solve_record_floats),
// streamed past the caches as the chunk-start states are (keep_state).
void keep_solve(const Params& p, const Chunk& ch, float* record) {
  const SolveRecord<float> kept = solve_record(p, record);
  stream_elements<DType::f32>(reinterpret_cast<char*>(kept.solved), ch.solved, ch.L * ch.C);
  stream_elements<DType::f32>(reinterpret_cast<char*>(kept.new_values), ch.rv, ch.L * ch.VW);
}

// Whether the state pass keeps each chunk-start state rounded to bf16 ([K, VW] bf16 in the first
// half of its slot, Records) rather than as fp32, at half the records' traffic: where the gradient
// pass reads it through products that round it to bf16 as they pack it (the same results), and
// through a gate's boundary term <dH, H0> (boundary_row, backward.h), which then reads that
// rounding too, as GPU kernels keep their chunk states in the inputs' dtype. That is at
// Precision::fast (one part) on a target whose products read rows kept as bf16
// (MicroKernels::reads_bf16_rows, which read any one-part B by columns, as the gradient pass's
// H0^T), and with the delta rule only where the solves are kept (else the gradient pass forms bp H0
// again on the fp32 state).
template <class Ops>
bool states_kept_as_bf16(const Params& p, bool solves_kept) {
  return Ops::reads_bf16_rows && p.precision == Precision::fast && (p.delta == Delta::none || solves_kept);
}

// A copy of the chunk-start state H [K, VW] kept for the gradient pass (Records), as fp32 or bf16
// (states_kept_as_bf16), streamed past the caches: a cached store would read each line of the
// record from memory first, and the gradient pass reads the records back long after, in reverse.
// The records' traffic is most of what it costs (la's backward at fast on an AMX Xeon: 64 ms with
// fp32 records, 55 with none written, 61 with half of them: docs/performance.md, stop 63).
void keep_state(const Chunk& ch, const float* H, float* record, bool as_bf16) {
  char* to = reinterpret_cast<char*>(record);
  if (as_bf16)
    stream_elements<DType::bf16>(to, H, ch.K * ch.VW);
  else
    stream_elements<DType::f32>(to, H, ch.K * ch.VW);
}

// Where a run of items in lockstep keeps its states and solve records (SequenceKernels::forward):
// item i's state at the start of chunk c (its final state at c = chunks), one state per item
// updated in place or, with `every_chunk`, each chunk's apart (fp32, or bf16 in the slot's first
// half: states_kept_as_bf16), the state updated in place in the last; item i's solve record of
// chunk c.
struct Records {
  Records(const Params& p, bool every_chunk)
      : chunk_state(every_chunk ? size_t(p.K) * p.pack * p.V : 0),
        item_states(size_t(p.K) * p.pack * p.V * (every_chunk ? size_t(chunk_count(p)) + 1 : 1)),
        record(solve_record_floats(p)),
        item_records(record * size_t(chunk_count(p))) {}
  template <class Float>
  Float* state(Float* states, int i, int c) const {
    return states + size_t(i) * item_states + size_t(c) * chunk_state;
  }
  template <class Float>
  Float* solve(Float* solves, int i, int c) const {
    return solves + size_t(i) * item_records + size_t(c) * record;
  }
  size_t chunk_state, item_states, record, item_records;
};

template <class Ops>
void forward_sequence(const Params& p, int64_t first, int count, void* workspace, float* states, bool every_chunk,
                      float* solves, bool write_y) {
  Chunk ch(p, workspace);
  const Records records(p, every_chunk);
  const int parts = Loader<Ops>::keys_values | (write_y ? Loader<Ops>::with_queries : 0) |
                    (Ops::reads_bf16_rows ? Loader<Ops>::rows_as_bf16 : 0);
  // Each item's state is updated in place in its last slot, which stays in cache; with
  // `every_chunk`, each chunk-start state is streamed from it into its own slot (keep_state).
  const int last = chunk_count(p);
  const bool bf16_states = every_chunk && states_kept_as_bf16<Ops>(p, solves != nullptr);
  for (int i = 0; i < count; ++i) item_at(p, first + i).load_state(p.h0, records.state(states, i, last));
  for (int c = 0, t0 = 0; t0 < p.S; ++c, t0 += ch.C)
    for (int i = 0; i < count; ++i) {
      const Item item = item_at(p, first + i);
      Loader<Ops>{p, item}.chunk(ch, t0, parts);
      prefetch_next<Ops>(p, first, count, i, t0, t0 + ch.C, parts);
      float* H = records.state(states, i, last);
      if (every_chunk) keep_state(ch, H, records.state(states, i, c), bf16_states);
      const bool scores_formed = ch.delta && prepare_delta<Ops>(p, ch, write_y);
      state_products<Ops>(ch, H, write_y);
      if (ch.delta) delta_values<Ops>(p, ch);
      if (ch.delta && solves) keep_solve(p, ch, records.solve(solves, i, c));
      output_and_update<Ops>(p, item, t0, ch, H, H, write_y, scores_formed);
    }
  if (p.ht.present())
    for (int i = 0; i < count; ++i) item_at(p, first + i).store_state(p.ht, records.state(states, i, last));
  finish_streamed_stores();
}

}  // namespace
}  // namespace flat::cpu::stages

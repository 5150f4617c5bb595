// Internal problem description shared by the API layer and the kernels, in the spirit of
// flash-attention's flash.h: plain data with explicit strides, already validated.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>

#include "flat/flat.h"

namespace flat {

// How the kernels see the forget gate (src/variants.h has the variants' own description): absent,
// one value per head and token (a per-sequence gate too, with zero batch and sequence strides), or
// one value per channel or group of channels.
enum class GateKind { none, scalar, channel };

// The state update: additive (H = D H + k v^T), or the delta rule with the erase and write
// strengths given as one beta per token (b = w = beta) or as vectors b [K] and w [V] (gdn2).
enum class Delta { none, beta, erase_write };

// Rows of `width` contiguous elements addressed by three indices: for a [B, S, N, D] tensor the
// row (b, s, n); for a [B, N, K, V] state the row (b, n, k) with the strides given in that order.
struct RowView {
  char* base = nullptr;
  DType dtype = DType::f32;
  int64_t stride0 = 0, stride1 = 0, stride2 = 0;  // in elements

  bool present() const { return base != nullptr; }
  int64_t element_bytes() const { return dtype == DType::bf16 ? 2 : 4; }
  char* row(int64_t i0, int64_t i1, int64_t i2) const {
    return base + (i0 * stride0 + i1 * stride1 + i2 * stride2) * element_bytes();
  }
  // The view whose row (0, 0, i2) is this one's (i0, i1, i2): one batch row from token i1 on, or
  // one row of a state. An absent view stays absent.
  RowView from(int64_t i0, int64_t i1) const {
    RowView r = *this;
    if (base) r.base = row(i0, i1, 0);
    return r;
  }
};

// A validated tensor's rows: (i0, i1, i2) along its first three axes (of [B, S, N, D] rows, of
// [B, S, C] elements, of [B, C, W-1] or [B, N, K, V] states), or the width-1 rows of a gate of rank
// below 4, whose missing leading axes get stride 0; absent for no tensor.
inline RowView rows_of(const Tensor& t) {
  RowView r;
  if (!t.present()) return r;
  r.base = static_cast<char*>(t.data);
  r.dtype = t.dtype;
  int64_t s[3] = {0, 0, 0};
  const int leading = t.rank == 4 ? 3 : t.rank;
  for (int d = 0; d < leading; ++d) s[3 - leading + d] = t.stride[size_t(d)];
  r.stride0 = s[0];
  r.stride1 = s[1];
  r.stride2 = s[2];
  return r;
}

// A call's sequences (flat::Sequences, validated) as the drivers walk them, the recurrence's and
// the convolution's alike. Sequence i is batch row batch(i), tokens [start(i), start(i) +
// length(i)): tokens of row 0 between cu_seqlens, or without them the whole row i. Its initial
// state is row read_row(i) of h0 (state0), its final one goes to row write_row(i) of ht (state):
// the indices (-1: none), or without them row i (none when only the tokens' states are kept).
// The state after its token t goes to row token_rows(i, S)[t] of ht (state), where asked.
struct SequenceLayout {
  std::span<const int64_t> cu_seqlens, read_rows, write_rows, token_state_rows;

  SequenceLayout() = default;
  explicit SequenceLayout(const Sequences& s)
      : cu_seqlens(s.cu_seqlens),
        read_rows(s.initial_state_indices),
        write_rows(s.final_state_indices),
        token_state_rows(s.token_state_indices) {}
  // Whether the call's rows are not simply its sequences: then each sequence runs as a problem of
  // its own (one row, its tokens, its state rows), else the call runs as one.
  bool split() const {
    return !cu_seqlens.empty() || !read_rows.empty() || !write_rows.empty() || !token_state_rows.empty();
  }
  int64_t count(int B) const { return cu_seqlens.empty() ? B : int64_t(cu_seqlens.size()) - 1; }
  int64_t batch(int64_t i) const { return cu_seqlens.empty() ? i : 0; }
  int64_t start(int64_t i) const { return cu_seqlens.empty() ? 0 : cu_seqlens[size_t(i)]; }
  int length(int64_t i, int S) const {
    return cu_seqlens.empty() ? S : int(cu_seqlens[size_t(i) + 1] - cu_seqlens[size_t(i)]);
  }
  int64_t read_row(int64_t i) const { return read_rows.empty() ? i : read_rows[size_t(i)]; }
  int64_t write_row(int64_t i) const {
    if (!write_rows.empty()) return write_rows[size_t(i)];
    return token_state_rows.empty() ? i : -1;
  }
  // Sequence i's entries of token_state_indices (empty when not given).
  std::span<const int64_t> token_rows(int64_t i, int S) const {
    if (token_state_rows.empty()) return {};
    return token_state_rows.subspan(size_t(batch(i) * S + start(i)), size_t(length(i, S)));
  }
};

// Row `row` of a state view, absent for -1 (a sequence with no state to read or write there).
inline RowView state_row(const RowView& view, int64_t row) { return row < 0 ? RowView{} : view.from(row, 0); }

// The states a problem of one sequence keeps after its tokens (Sequences::token_state_indices), the
// recurrence's and the convolution's alike: the pool (ht's or state's tensor) and the row there of
// the state after each of its S tokens (-1: not kept); nothing without token_state_indices.
struct TokenStates {
  RowView pool;
  std::span<const int64_t> rows;

  bool any() const { return !rows.empty(); }
  // The pool's row of the state after token t, absent where it is not kept.
  RowView after(int t) const { return rows.empty() ? RowView{} : state_row(pool, rows[size_t(t)]); }
};

// What a problem's sequence moves (sequence_problem): its token rows (inputs, outputs and their
// gradients, [B, S, ...]) and its four states: the initial one and the final one, in rows of the
// state tensors or pools, and their gradients, a row per sequence.
template <class P>
struct SequenceRows {
  std::initializer_list<RowView P::*> tokens;
  RowView P::*initial;
  RowView P::*final;
  RowView P::*final_gradient;
  RowView P::*initial_gradient;
};

// Sequence i of a call that splits its rows (P::sequences), as a call of its own, the recurrence's
// (Params) and the convolution's (ConvParams) alike: one batch row of its tokens, its state rows
// (absent where an index is -1), the pool rows its tokens' states go to; S = 0 for an empty one.
template <class P>
P sequence_problem(const P& p, int64_t i, const SequenceRows<P>& rows) {
  const SequenceLayout& s = p.sequences;
  P one = p;
  one.B = 1;
  one.S = s.length(i, p.S);
  one.sequences = {};
  for (RowView P::*view : rows.tokens) one.*view = (p.*view).from(s.batch(i), s.start(i));
  one.*rows.initial = state_row(p.*rows.initial, s.read_row(i));
  one.*rows.final = state_row(p.*rows.final, s.write_row(i));
  one.*rows.final_gradient = (p.*rows.final_gradient).from(i, 0);
  one.*rows.initial_gradient = (p.*rows.initial_gradient).from(i, 0);
  one.token_states = {p.*rows.final, s.token_rows(i, p.S)};
  return one;
}

// Token outputs at least this large are streamed (Params::streamed_outputs): a cached store of a
// line first reads it from memory, which streaming saves, and an output this large stays in no
// core's L2 for the next operation to read.
constexpr int64_t kStreamedOutputBytes = int64_t(16) << 20;

struct Params {
  GateKind gate = GateKind::none;
  int B = 0, S = 0, N = 0, K = 0, V = 0;
  // Head sharing: head n reads input head n / group_x.
  int group_q = 1, group_k = 1, group_v = 1, group_g = 1, group_b = 1, group_w = 1;
  bool gate_per_sequence = false;  // retnet: one gate per head for every batch and token
  int gate_group = 1;              // channel gates: channels per gate value (rows of K / gate_group)
  // Heads computed together: consecutive heads that share q, k, g and beta / b, their values and
  // states side by side (a divisor of N; the gcd of those inputs' groups).
  int pack = 1;
  Delta delta = Delta::none;
  Solve solve = Solve::doubling;
  Precision precision = Precision::exact;
  float scale = 1.0f;
  int chunk = 64;
  bool l2norm_qk = false;
  // The token outputs (y; dq, dk, dv and the gates' and strengths' gradients) are stored past the
  // caches, with non-temporal stores (cpu::Stores::streamed), where they are too large for the
  // caches to keep for the caller: at least kStreamedOutputBytes for one of them, bf16 counted
  // (describe_forward, describe_backward).
  bool streamed_outputs = false;

  RowView q, k, v, g;  // [B, S, Nx, D]; g rows are K / gate_group wide (channel) or 1 wide (scalar)
  RowView beta, b, w;  // delta rule: beta rows 1 wide; gdn2's b rows K wide, w rows V wide
  RowView h0;          // [B, N, K, V] rows (b, n, k), fp32, optional
  RowView y, ht;       // forward outputs
  RowView dy, dht;     // backward inputs
  RowView dq, dk, dv, dg, dh0;  // backward outputs
  RowView dbeta, db, dw;
  // With sequences, h0 and ht are [num_seqs, N, K, V] or pools addressed through them, dht and
  // dh0 [num_seqs, N, K, V].
  SequenceLayout sequences;
  TokenStates token_states;  // a problem of one sequence (B = 1) that keeps its tokens' states
};

// Validates the arguments of forward / backward exactly as the public entry points do (throwing
// flat::Error, writing nothing) and describes the problem. For internal callers such as the
// benchmark's baselines, which run other implementations on the same arguments.
Params describe_forward(Variant variant, const ForwardArgs& args, const Options& options);
Params describe_backward(Variant variant, const BackwardArgs& args, const Options& options);
// The same for the inputs shared by forward and backward alone (what their outputs' shapes follow
// from: flat::output_shapes). final_states: the call writes final states (a forward, which may
// take final_state_indices). Data pointers are checked to be there, not read.
Params describe_inputs(Variant variant, const Inputs& inputs, const Options& options, bool final_states);

}  // namespace flat

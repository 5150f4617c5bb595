// Drivers of the short convolution (conv.h): thread partition over (sequence, block of
// positions, block of channels), taps packed once per call, per-thread workspaces, the
// fixed-order reduction of the weight and bias gradients, and the final state.
#include "cpu/conv.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/buffer.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace flat::cpu {
namespace {

int round16(int n) { return (n + 15) & ~15; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The taps and the bias in the leaves' layout (ConvTaps).
class PackedTaps {
 public:
  explicit PackedTaps(const ConvParams& p) : buffer_(sizeof(float) * packed_size(p.C, p.W + 1)) {
    float* packed = buffer_.floats();
    std::memset(packed, 0, sizeof(float) * packed_size(p.C, p.W + 1));
    for (int c = 0; c < p.C; ++c) {
      const float* row = p.weight + int64_t(c) * p.weight_stride;
      for (int w = 0; w < p.W; ++w) packed[packed_index(c, w, p.W + 1)] = row[w];
      if (p.bias) packed[packed_index(c, p.W, p.W + 1)] = p.bias[c];
    }
  }
  ConvTaps view() const { return {buffer_.floats()}; }

 private:
  AlignedBuffer buffer_;
};

// Sequence i of a call that splits its rows: one row of its positions, its state rows.
ConvParams sequence_params(const ConvParams& p, int64_t i) {
  using P = ConvParams;
  return sequence_problem(p, i, {{&P::x, &P::y, &P::dy, &P::dx}, &P::state0, &P::state, &P::dstate, &P::dstate0});
}

// The problems of a call: itself when its rows are its sequences, else each sequence.
int64_t problem_count(const ConvParams& p) { return p.sequences.split() ? p.sequences.count(p.B) : 1; }
ConvParams problem(const ConvParams& p, int64_t i) { return p.sequences.split() ? sequence_params(p, i) : p; }

int64_t blocks_of(int S) { return std::max<int64_t>(1, ceil_div(S, kConvSeqBlock)); }

// Item `item` of the partition: its problem and its block there.
std::pair<ConvParams, ConvBlock> block_of(const ConvParams& p, const ConvPartition& part, int64_t item) {
  const int cb = int(item % part.channel_blocks);
  const int64_t row = item / part.channel_blocks;
  const int64_t i = std::upper_bound(part.first_row.begin(), part.first_row.end(), row) - part.first_row.begin() - 1;
  ConvParams one = problem(p, i);
  const int64_t in_problem = row - part.first_row[size_t(i)], per_batch = blocks_of(one.S);
  ConvBlock blk;
  blk.b = int(in_problem / per_batch);
  blk.t0 = int(in_problem % per_batch) * kConvSeqBlock;
  blk.t1 = std::min(one.S, blk.t0 + kConvSeqBlock);
  blk.c0 = cb * part.channel_block;
  blk.c1 = std::min(p.C, blk.c0 + part.channel_block);
  return {one, blk};
}

// The states a problem keeps: after its last position (state[b, c, j] = the input at position
// S - (W-1) + j: x, or before 0 state0, or zero) and, where token_states asks, after each position t
// (the inputs at t - (W-1) + 1 .. t). Formed in full before anything is stored, so they may go to
// the memory of state0. An input row of x is read whole (converted from bf16 by rows) and spread
// over the state's [C, W-1] layout; a state row of C x (W-1) contiguous floats is stored at once.
// scratch: the calling thread's, grown as needed and kept from call to call.
void write_states(const ConvParams& p, std::vector<float>& scratch) {
  const int K = p.W - 1, C = p.C;
  // A state to write: its rows (channel c at c * stride floats), the batch row and the last
  // position it follows.
  struct Kept {
    float* base;
    int64_t stride;
    int b, last;
  };
  std::vector<Kept> kept;
  for (int b = 0; b < p.B && p.state.present(); ++b)
    kept.push_back({reinterpret_cast<float*>(p.state.row(b, 0, 0)), p.state.stride1, b, p.S - 1});
  for (int t = 0; t < int(p.token_states.rows.size()); ++t)
    if (const RowView row = p.token_states.after(t); row.present())
      kept.push_back({reinterpret_cast<float*>(row.row(0, 0, 0)), row.stride1, 0, t});
  // Per state: the inputs at its positions from 0 on, rows of x [K, C] (converted from bf16 by
  // rows); then channel by channel its W-1 values, from those rows or, before 0, from state0.
  scratch.resize(std::max(scratch.size(), (1 + kept.size()) * size_t(C) * K));
  float *inputs = scratch.data(), *states = inputs + size_t(K) * C;  // every value written before read
  for (size_t i = 0; i < kept.size(); ++i) {
    // The state's first position; its values before position 0, the first `carried`, are state0's
    // from value first + K on (or zeros).
    const int b = kept[i].b, first = kept[i].last + 1 - K, carried = std::max(0, -first);
    for (int j = carried; j < K; ++j) load_row(p.x, b, first + j, 0, inputs + size_t(j) * C, C);
    const float* before = p.state0.present() ? reinterpret_cast<const float*>(p.state0.row(b, 0, 0)) + first + K : nullptr;
    float* state = states + i * size_t(C) * K;
    for (int c = 0; c < C; ++c) {
      float* out = state + size_t(c) * K;
      for (int j = 0; j < carried; ++j) out[j] = before ? before[c * p.state0.stride1 + j] : 0.0f;
      for (int j = carried; j < K; ++j) out[j] = inputs[size_t(j) * C + c];
    }
  }
  for (size_t i = 0; i < kept.size(); ++i) {
    const float* state = states + i * size_t(C) * K;
    if (kept[i].stride == K) {
      std::memcpy(kept[i].base, state, sizeof(float) * size_t(C) * K);
      continue;
    }
    for (int c = 0; c < C; ++c)
      for (int j = 0; j < K; ++j) kept[i].base[c * kept[i].stride + j] = state[size_t(c) * K + j];
  }
}

// The backward of a call of no position (S = 0: every sequence empty): no block runs; each
// sequence's state gradient passes through (dstate0 = dstate, zeros without it) and the weight's
// and the bias's sums over no position are zero.
void backward_of_no_position(const ConvParams& p) {
  const int K = p.W - 1;
  for (int64_t i = 0; p.dstate0.present() && i < p.sequences.count(p.B); ++i)
    for (int c = 0; c < p.C; ++c) {
      float* to = reinterpret_cast<float*>(p.dstate0.row(i, c, 0));
      if (p.dstate.present()) std::memmove(to, p.dstate.row(i, c, 0), sizeof(float) * size_t(K));
      else std::fill(to, to + K, 0.0f);
    }
  for (int c = 0; c < p.C; ++c) {
    std::fill(p.dweight + int64_t(c) * p.dweight_stride, p.dweight + int64_t(c) * p.dweight_stride + p.W, 0.0f);
    if (p.dbias) p.dbias[c] = 0.0f;
  }
}

}  // namespace

ConvPartition conv_partition(const ConvParams& p) {
  ConvPartition part;
  part.first_row.push_back(0);
  for (int64_t i = 0; i < problem_count(p); ++i) {
    const ConvParams one = problem(p, i);
    part.first_row.push_back(part.first_row.back() + one.B * blocks_of(one.S));
  }
  // Whole rows (up to kConvMaxChannelBlock channels); narrower blocks (down to 16 channels) where
  // the rows of positions alone are fewer than 8 blocks, so that threads have work at any shape. A
  // call of no batch row (B = 0) has no row and no item.
  constexpr int64_t kMinItems = 8;
  int64_t channel_blocks = ceil_div(p.C, kConvMaxChannelBlock);
  const int64_t rows = part.rows();
  if (rows > 0 && rows * channel_blocks < kMinItems)
    channel_blocks = std::min<int64_t>(ceil_div(p.C, 16), ceil_div(kMinItems, rows));
  part.channel_block = round16(int(ceil_div(p.C, channel_blocks)));
  part.channel_blocks = int(ceil_div(p.C, part.channel_block));
  return part;
}

void conv_forward(const ConvParams& p, const Run& run) {
  const ConvKernels& kernels = run.target.conv;
  const ConvPartition part = conv_partition(p);
  const PackedTaps taps(p);
  run_ranges(run, part.items(), [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(sizeof(float) * kernels.workspace_floats(p.W, part.channel_block));
    for (int64_t item = begin; item < end; ++item) {
      const auto [one, block] = block_of(p, part, item);
      kernels.forward(one, taps.view(), block, workspace.floats());
    }
  });
  // After every block has read its state0 rows: a pool updated in place has no row that one
  // sequence reads and another writes (validated), but may have rows read and written by one; so
  // the sequences' states are written in parallel, each by one thread.
  run_ranges(run, problem_count(p), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t i = begin; i < end; ++i) {
      const ConvParams one = problem(p, i);
      if (one.state.present() || one.token_states.any()) write_states(one, scratch);
    }
  });
}

void conv_backward(const ConvParams& p, const Run& run) {
  if (p.S == 0) return backward_of_no_position(p);
  const ConvKernels& kernels = run.target.conv;
  const ConvPartition part = conv_partition(p);
  const PackedTaps taps(p);
  const int64_t items = part.items();
  const size_t per_item = packed_size(part.channel_block, p.W + 1);
  AlignedBuffer partials(sizeof(float) * per_item * size_t(items));
  run_ranges(run, items, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(sizeof(float) * kernels.workspace_floats(p.W, part.channel_block));
    for (int64_t item = begin; item < end; ++item) {
      const auto [one, block] = block_of(p, part, item);
      kernels.backward(one, taps.view(), block, workspace.floats(), partials.floats() + per_item * size_t(item));
    }
  });

  // dweight[c, w] and dbias[c]: the blocks' fp32 partial sums added in float64, sequence by
  // sequence (batch row by batch row) and block by block in order, whatever the thread count.
  std::vector<double> acc(per_item);
  for (int cb = 0; cb < part.channel_blocks; ++cb) {
    const int c0 = cb * part.channel_block, n = std::min(p.C, c0 + part.channel_block) - c0;
    const size_t used = packed_size(n, p.W + 1);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t row = 0; row < part.rows(); ++row) {
      const float* partial = partials.floats() + per_item * size_t(row * part.channel_blocks + cb);
      for (size_t i = 0; i < used; ++i) acc[i] += double(partial[i]);
    }
    for (int i = 0; i < n; ++i) {
      float* row = p.dweight + int64_t(c0 + i) * p.dweight_stride;
      for (int w = 0; w < p.W; ++w) row[w] = float(acc[packed_index(i, w, p.W + 1)]);
      if (p.dbias) p.dbias[c0 + i] = float(acc[packed_index(i, p.W, p.W + 1)]);
    }
  }
}

}  // namespace flat::cpu

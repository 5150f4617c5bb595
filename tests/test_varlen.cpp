// Variable-length batches and the state pool (flat::Sequences), for every variant and the short
// convolution, forward and backward, on every target this CPU runs: a packed batch computes,
// bitwise, what its sequences compute run one by one (lengths 0, 1, C-1, C, C+1, ...); a pool is
// read and written at the indexed rows only, in place, its other rows untouched; bad sequences
// and indices are refused, naming the argument, before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "checks.h"
#include "conv_params.h"
#include "cpu/conv.h"
#include "cpu/recurrence.h"
#include "cpu/targets.h"
#include "harness.h"
#include "params.h"
#include "tested_targets.h"
#include "variants.h"

namespace flat::test {
namespace {

int64_t product(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

// A contiguous tensor (absent when its shape is empty), NaN-poisoned until filled, with views of
// its rows along the first or second axis.
struct Array {
  Array() : buffer(DType::f32, 0) {}
  Array(DType dtype, std::vector<int64_t> shape) : buffer(dtype, size_t(product(shape))), shape(std::move(shape)) {}

  bool present() const { return !shape.empty(); }
  size_t element_bytes() const { return buffer.dtype == DType::bf16 ? 2 : 4; }
  char* bytes() { return static_cast<char*>(buffer.data()); }
  const char* bytes() const { return const_cast<Array*>(this)->bytes(); }
  // Bytes of one index of `axis` (everything after it).
  size_t step(int axis) const {
    return size_t(product(std::vector<int64_t>(shape.begin() + axis + 1, shape.end()))) * element_bytes();
  }
  Tensor tensor() { return present() ? Tensor::contiguous(buffer.data(), buffer.dtype, shape) : Tensor{}; }
  // Indices [first, first + count) of `axis` (0 or 1) as a tensor of their own.
  Tensor rows(int axis, int64_t first, int64_t count) {
    if (!present()) return {};
    std::vector<int64_t> s = shape;
    s[size_t(axis)] = count;
    return Tensor::contiguous(bytes() + size_t(first) * step(axis), buffer.dtype, s);
  }
  void fill(std::mt19937& rng, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    for (size_t i = 0; i < buffer.size(); ++i) buffer.set(i, dist(rng));
  }
  bool has_nan() const {
    for (size_t i = 0; i < buffer.size(); ++i)
      if (buffer.is_nan(i)) return true;
    return false;
  }

  Buffer buffer;
  std::vector<int64_t> shape;
};

// (No memcmp of 0 bytes: an absent array has no data pointer.)
bool same_bytes(const void* a, const void* b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

// The sequences of a call: cu_seqlens over one row of S tokens, or without them B rows of S.
struct Layout {
  int64_t B = 1, S = 0;
  std::vector<int64_t> cu;

  int64_t count() const { return cu.empty() ? B : int64_t(cu.size()) - 1; }
  int64_t length(int64_t i) const { return cu.empty() ? S : cu[size_t(i) + 1] - cu[size_t(i)]; }
  // Sequence i of a [B, S, ...] array, as a tensor of one row; a rank-1 array (retnet's gate) whole.
  Tensor view(Array& a, int64_t i) const {
    if (a.shape.size() == 1) return a.tensor();
    return cu.empty() ? a.rows(0, i, 1) : a.rows(1, cu[size_t(i)], length(i));
  }
  // The bytes of sequence i in a [B, S, ...] array.
  const char* at(const Array& a, int64_t i) const {
    return a.bytes() + (cu.empty() ? size_t(i) * a.step(0) : size_t(cu[size_t(i)]) * a.step(1));
  }
};

Layout packed_layout(const std::vector<int64_t>& lengths) {
  Layout l;
  l.cu.push_back(0);
  for (int64_t n : lengths) l.cu.push_back(l.cu.back() + n);
  l.S = l.cu.back();
  return l;
}

// ---- The recurrence -------------------------------------------------------------------------

// Head sharing that sends dk, dg, dbeta, db through the gradients' scratch (summed over the two
// heads), so that the scratch is moved along the sequences too.
constexpr int64_t kNq = 2, kNk = 1, kNv = 2, kNg = 1, kNb = 1, kNw = 2, kN = 2;

// The inputs a variant may take and their gradients, in one order.
constexpr Tensor Inputs::*kInputs[] = {&Inputs::q,    &Inputs::k, &Inputs::v, &Inputs::g,
                                       &Inputs::beta, &Inputs::b, &Inputs::w};
constexpr Tensor BackwardArgs::*kGradients[] = {&BackwardArgs::dq, &BackwardArgs::dk,    &BackwardArgs::dv,
                                                &BackwardArgs::dg, &BackwardArgs::dbeta, &BackwardArgs::db,
                                                &BackwardArgs::dw};
constexpr const char* kNames[] = {"q", "k", "v", "g", "beta", "b", "w"};
constexpr int kGate = 3;

struct Recurrence {
  Variant variant;
  DType dtype;
  int K, V;
  Layout layout;
  Options options;
  Array in[7], h0, dy, dht;

  Recurrence(Variant variant, DType dtype, int K, int V, int chunk, Layout layout, uint64_t seed)
      : variant(variant), dtype(dtype), K(K), V(V), layout(std::move(layout)) {
    const VariantInfo& vi = info(variant);
    const int64_t B = this->layout.B, S = this->layout.S;
    options.chunk = chunk;
    options.l2norm_qk = true;  // keeps the delta rule's state bounded for any draw
    if (vi.gate == Gate::grouped) options.gate_group = 4;
    std::mt19937 rng{uint32_t(seed)};
    in[0] = Array(dtype, {B, S, kNq, K});
    in[1] = Array(dtype, {B, S, kNk, K});
    in[2] = Array(dtype, {B, S, kNv, V});
    if (vi.has_gate()) in[kGate] = Array(DType::f32, vi.gate_shape(B, S, kNg, K, 4));
    if (vi.has_beta()) in[4] = Array(dtype, {B, S, kNb});
    if (vi.has_erase_write()) {
      in[5] = Array(dtype, {B, S, kNb, K});
      in[6] = Array(dtype, {B, S, kNw, V});
    }
    // q, k, v in [-1, 1); log-decays in [-1, -0.01); strengths beta, b, w in [0, 1).
    for (int x = 0; x < 7; ++x) in[x].fill(rng, x <= kGate ? -1.0 : 0.0, x == kGate ? -0.01 : 1.0);
    dy = Array(dtype, {B, S, kN, V});
    dy.fill(rng, -1, 1);
    dht = Array(DType::f32, {this->layout.count(), kN, K, V});
    dht.fill(rng, -1, 1);
  }

  // The inputs of sequence i alone (i = -1: the whole call, with its sequences).
  Inputs inputs(int64_t i) {
    Inputs a;
    for (int x = 0; x < 7; ++x) a.*kInputs[x] = i < 0 ? in[x].tensor() : layout.view(in[x], i);
    if (i < 0) a.sequences.cu_seqlens = layout.cu;
    return a;
  }
  std::vector<int64_t> output_shape(int64_t i) const {
    return i < 0 ? std::vector<int64_t>{layout.B, layout.S, kN, V} : std::vector<int64_t>{1, layout.length(i), kN, V};
  }
  std::vector<int64_t> state_shape(int64_t rows) const { return {rows, kN, K, V}; }
};

struct Forward {
  Array y, ht;
};

void run_forward(const Recurrence& r, const ForwardArgs& a, const cpu::Target& target, int threads) {
  cpu::recurrence_forward(describe_forward(r.variant, a, r.options), cpu::Run{target, {threads}});
}
void run_backward(const Recurrence& r, const BackwardArgs& a, const cpu::Target& target, int threads) {
  cpu::recurrence_backward(describe_backward(r.variant, a, r.options), cpu::Run{target, {threads}});
}

struct Backward {
  Array grad[7], dh0;
};

// The backward of sequence i alone (i = -1: the whole call, h0 read through `reads` when given)
// on poisoned gradients.
Backward backward_of(Recurrence& r, int64_t i, const Tensor& h0, const cpu::Target& target, int threads,
                     std::span<const int64_t> reads = {}) {
  BackwardArgs a(r.inputs(i));
  a.h0 = h0;
  a.sequences.initial_state_indices = reads;
  Backward out;
  for (int x = 0; x < 7; ++x) {
    if (!r.in[x].present()) continue;
    std::vector<int64_t> shape = r.in[x].shape;
    if (i >= 0 && shape.size() > 1) {
      shape[0] = 1;
      shape[1] = r.layout.length(i);
    }
    out.grad[x] = Array(r.in[x].buffer.dtype, shape);
    a.*kGradients[x] = out.grad[x].tensor();
  }
  out.dh0 = Array(DType::f32, r.state_shape(i < 0 ? r.layout.count() : 1));
  a.dh0 = out.dh0.tensor();
  a.dy = i < 0 ? r.dy.tensor() : r.layout.view(r.dy, i);
  a.dht = i < 0 ? r.dht.tensor() : r.dht.rows(0, i, 1);
  run_backward(r, a, target, threads);
  return out;
}

// retnet's dg sums over every token of every sequence, in float64 rounded once: the packed call's
// equals the sum of the sequences' own up to their roundings.
void expect_summed(const Array& packed, const std::vector<double>& sum, const std::string& what) {
  for (size_t e = 0; e < sum.size(); ++e)
    EXPECT_NEAR(packed.buffer.get(e), sum[e], 1e-5 * (1 + std::abs(sum[e]))) << what << "[" << e << "]";
}

using RecurrenceParam = std::tuple<Variant, DType>;
class VarlenRecurrence : public ::testing::TestWithParam<RecurrenceParam> {};

// Packed sequences of lengths 0, 1, C-1, C, C+1, 2C+3 and 0 (odd K and V at C = 16), with and
// without initial states: y, the final states and every gradient bitwise those of each sequence
// run alone; an empty sequence passes its state through (ht = h0, dh0 = dht).
TEST_P(VarlenRecurrence, PackedEqualsOneByOne) {
  const auto [variant, dtype] = GetParam();
  struct Shape {
    int K, V, chunk;
  };
  for (const Shape shape : {Shape{12, 7, 16}, Shape{32, 24, 32}}) {
    const int C = shape.chunk;
    for (const bool with_h0 : {false, true}) {
      Recurrence r(variant, dtype, shape.K, shape.V, C, packed_layout({0, 1, C - 1, C, C + 1, 2 * C + 3, 0}),
                   uint64_t(C * 2 + with_h0));
      const int64_t count = r.layout.count();
      if (with_h0) {
        std::mt19937 rng(7);
        r.h0 = Array(DType::f32, r.state_shape(count));
        r.h0.fill(rng, -1, 1);
      }
      for (const cpu::Target* target : test::supported_targets()) {
        SCOPED_TRACE(std::string(variant_name(variant)) + " " + std::string(dtype_name(dtype)) + " K" +
                     std::to_string(shape.K) + " V" + std::to_string(shape.V) + " C" + std::to_string(C) +
                     (with_h0 ? " h0 " : " ") + target->name);
        ForwardArgs a(r.inputs(-1));
        a.h0 = r.h0.tensor();
        Forward packed{Array(dtype, r.output_shape(-1)), Array(DType::f32, r.state_shape(count))};
        a.y = packed.y.tensor();
        a.ht = packed.ht.tensor();
        run_forward(r, a, *target, 3);
        EXPECT_FALSE(packed.y.has_nan() || packed.ht.has_nan()) << "an output left unwritten";
        const Backward grads = backward_of(r, -1, r.h0.tensor(), *target, 3);
        for (const Array& g : grads.grad) EXPECT_FALSE(g.present() && g.has_nan()) << "a gradient left unwritten";
        EXPECT_FALSE(grads.dh0.has_nan());

        std::vector<double> dg_sum(r.in[kGate].present() ? size_t(product(r.in[kGate].shape)) : 0);
        const size_t state = packed.ht.step(0);
        for (int64_t i = 0; i < count; ++i) {
          SCOPED_TRACE("sequence " + std::to_string(i));
          const Tensor h0 = r.h0.rows(0, i, 1);
          if (r.layout.length(i) == 0) {  // no call of its own: the state passes through
            std::vector<char> zero(state, 0);
            EXPECT_TRUE(same_bytes(packed.ht.bytes() + size_t(i) * state,
                                   with_h0 ? r.h0.bytes() + size_t(i) * state : zero.data(), state));
            EXPECT_TRUE(same_bytes(grads.dh0.bytes() + size_t(i) * state, r.dht.bytes() + size_t(i) * state, state));
            continue;
          }
          ForwardArgs one(r.inputs(i));
          one.h0 = h0;
          Forward alone{Array(dtype, r.output_shape(i)), Array(DType::f32, r.state_shape(1))};
          one.y = alone.y.tensor();
          one.ht = alone.ht.tensor();
          run_forward(r, one, *target, 1);
          EXPECT_TRUE(
              same_bytes(r.layout.at(packed.y, i), alone.y.bytes(), alone.y.buffer.size() * alone.y.element_bytes()))
              << "y";
          EXPECT_TRUE(same_bytes(packed.ht.bytes() + size_t(i) * state, alone.ht.bytes(), state)) << "ht";

          const Backward own = backward_of(r, i, h0, *target, 1);
          for (int x = 0; x < 7; ++x) {
            if (!own.grad[x].present()) continue;
            if (r.in[x].shape.size() == 1) {  // retnet's per-head gate: one parameter
              for (size_t e = 0; e < dg_sum.size(); ++e) dg_sum[e] += own.grad[x].buffer.get(e);
              continue;
            }
            EXPECT_TRUE(same_bytes(r.layout.at(grads.grad[x], i), own.grad[x].bytes(),
                                   own.grad[x].buffer.size() * own.grad[x].element_bytes()))
                << "d" << kNames[x];
          }
          EXPECT_TRUE(same_bytes(grads.dh0.bytes() + size_t(i) * state, own.dh0.bytes(), state)) << "dh0";
        }
        if (r.in[kGate].shape.size() == 1) expect_summed(grads.grad[kGate], dg_sum, "dg");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenRecurrence,
                         ::testing::Combine(::testing::ValuesIn(variants_where(any_variant)),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         [](const ::testing::TestParamInfo<RecurrenceParam>& p) {
                           return std::string(variant_name(std::get<0>(p.param))) + "_" +
                                  std::string(dtype_name(std::get<1>(p.param)));
                         });

// A pool of P = 9 rows read and written through shuffled indices with -1 entries (empty
// sequences too), in place (h0 and ht one view) or into a second pool: each written row holds the
// final state of its sequence started from its read row (or zero), every other row keeps its
// bytes (NaN in the rows nobody reads, which the value scan must not see); the backward reads h0
// through the same indices. Also indices without cu_seqlens, one per batch row.
struct PoolCase {
  Layout layout;
  std::vector<int64_t> reads, writes;
  int64_t P;
};

std::vector<PoolCase> pool_cases() {
  return {{packed_layout({0, 1, 15, 16, 17, 35, 0}), {3, -1, 7, 0, 5, 8, -1}, {3, 2, -1, 0, 6, 8, 1}, 9},
          {Layout{3, 20, {}}, {2, -1, 0}, {2, 1, 0}, 4}};
}

// The pool's original rows, poisoned (NaN) where no sequence reads them.
Array make_pool(const Recurrence& r, const PoolCase& c, std::mt19937& rng) {
  Array pool(DType::f32, r.state_shape(c.P));
  Array values(DType::f32, r.state_shape(c.P));
  values.fill(rng, -1, 1);
  const size_t state = pool.step(0);
  for (int64_t row : c.reads)
    if (row >= 0) std::memcpy(pool.bytes() + size_t(row) * state, values.bytes() + size_t(row) * state, state);
  return pool;
}

class VarlenPool : public ::testing::TestWithParam<Variant> {};

TEST_P(VarlenPool, ReadsAndWritesIndexedRowsInPlace) {
  const Variant variant = GetParam();
  for (const PoolCase& c : pool_cases()) {
    for (const bool in_place : {true, false}) {
      Recurrence r(variant, DType::f32, 12, 7, 16, c.layout, 11);
      std::mt19937 rng(5);
      const Array original = make_pool(r, c, rng);
      const size_t state = original.step(0);
      for (const cpu::Target* target : test::supported_targets()) {
        SCOPED_TRACE(std::string(variant_name(variant)) + (c.layout.cu.empty() ? " rows" : " cu_seqlens") +
                     (in_place ? " in place " : " two pools ") + target->name);
        // What each written row must hold, from the sequences run alone; every other row as it was.
        Array expected = in_place ? original : Array(DType::f32, r.state_shape(c.P));
        std::vector<Array> alone_y(size_t(r.layout.count()));
        for (int64_t i = 0; i < r.layout.count(); ++i) {
          const int64_t read = c.reads[size_t(i)], write = c.writes[size_t(i)];
          Array final_state(DType::f32, r.state_shape(1));
          std::memset(final_state.bytes(), 0, state);
          if (read >= 0) std::memcpy(final_state.bytes(), original.bytes() + size_t(read) * state, state);
          if (r.layout.length(i) > 0) {
            ForwardArgs one(r.inputs(i));
            Array start = final_state;
            one.h0 = read >= 0 ? start.tensor() : Tensor{};
            alone_y[size_t(i)] = Array(DType::f32, r.output_shape(i));
            one.y = alone_y[size_t(i)].tensor();
            one.ht = final_state.tensor();
            run_forward(r, one, *target, 1);
          }
          if (write >= 0) std::memcpy(expected.bytes() + size_t(write) * state, final_state.bytes(), state);
        }
        // The packed call, through the driver on this target, and through the public API on the
        // default one (its value scan reads only the indexed rows, not the NaN of the others).
        for (const bool api : {false, true}) {
          if (api && target != &cpu::default_target()) continue;
          Array h0 = original, second(DType::f32, r.state_shape(c.P)), y(DType::f32, r.output_shape(-1));
          ForwardArgs a(r.inputs(-1));
          a.sequences.initial_state_indices = c.reads;
          a.sequences.final_state_indices = c.writes;
          a.h0 = h0.tensor();
          a.ht = in_place ? a.h0 : second.tensor();
          a.y = y.tensor();
          if (api) {
            ExecutionContext context;
            context.threads = 3;
            forward(variant, a, r.options, context);
          } else {
            run_forward(r, a, *target, 3);
          }
          const Array& pool = in_place ? h0 : second;
          for (int64_t row = 0; row < c.P; ++row)
            EXPECT_TRUE(same_bytes(pool.bytes() + size_t(row) * state, expected.bytes() + size_t(row) * state, state))
                << "pool row " << row << (api ? " (api)" : "");
          EXPECT_FALSE(y.has_nan());
          for (int64_t i = 0; i < r.layout.count(); ++i) {
            if (r.layout.length(i) == 0) continue;
            EXPECT_TRUE(same_bytes(r.layout.at(y, i), alone_y[size_t(i)].bytes(), alone_y[size_t(i)].buffer.size() * 4))
                << "y of sequence " << i;
          }
        }

        // The backward reads h0 through the same indices; dh0 has a row per sequence.
        Array pool = original;
        const Backward grads = backward_of(r, -1, pool.tensor(), *target, 3, c.reads);
        for (int64_t i = 0; i < r.layout.count(); ++i) {
          const int64_t read = c.reads[size_t(i)];
          if (r.layout.length(i) == 0) continue;
          const Backward own = backward_of(r, i, read >= 0 ? pool.rows(0, read, 1) : Tensor{}, *target, 1);
          EXPECT_TRUE(same_bytes(grads.dh0.bytes() + size_t(i) * state, own.dh0.bytes(), state)) << "dh0 of " << i;
          for (int x = 0; x < 7; ++x) {
            if (!own.grad[x].present() || r.in[x].shape.size() == 1) continue;
            EXPECT_TRUE(same_bytes(r.layout.at(grads.grad[x], i), own.grad[x].bytes(), own.grad[x].buffer.size() * 4))
                << "d" << kNames[x] << " of sequence " << i;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenPool, ::testing::Values(Variant::gla, Variant::gated_deltanet, Variant::retnet),
                         [](const ::testing::TestParamInfo<Variant>& p) { return std::string(variant_name(p.param)); });

// ---- The convolution ------------------------------------------------------------------------

struct Conv {
  DType x_dtype, y_dtype;
  int C, W;
  Layout layout;
  Array x, weight, bias, dy, dstate;

  Conv(DType x_dtype, DType y_dtype, int C, int W, Layout layout, uint64_t seed)
      : x_dtype(x_dtype), y_dtype(y_dtype), C(C), W(W), layout(std::move(layout)) {
    std::mt19937 rng{uint32_t(seed)};
    const int64_t B = this->layout.B, S = this->layout.S;
    x = Array(x_dtype, {B, S, C});
    x.fill(rng, -2, 2);
    weight = Array(DType::f32, {C, W});
    weight.fill(rng, -1, 1);
    bias = Array(DType::f32, {C});
    bias.fill(rng, -1, 1);
    dy = Array(y_dtype, {B, S, C});
    dy.fill(rng, -1, 1);
    if (W > 1) {
      dstate = Array(DType::f32, state_shape(this->layout.count()));
      dstate.fill(rng, -1, 1);
    }
  }

  std::vector<int64_t> state_shape(int64_t rows) const { return {rows, C, W - 1}; }
  std::vector<int64_t> sequence_shape(int64_t i) const {
    return i < 0 ? std::vector<int64_t>{layout.B, layout.S, C} : std::vector<int64_t>{1, layout.length(i), C};
  }
  // The inputs of sequence i alone (i = -1: the whole call, with its cu_seqlens).
  ConvInputs inputs(int64_t i) {
    ConvInputs a;
    a.x = i < 0 ? x.tensor() : layout.view(x, i);
    a.weight = weight.tensor();
    a.bias = bias.tensor();
    if (i < 0) a.sequences.cu_seqlens = layout.cu;
    return a;
  }
};

void run_conv_forward(const ConvArgs& a, const cpu::Target& target, int threads) {
  cpu::conv_forward(describe_conv_forward(a, {}), cpu::Run{target, {threads}});
}

struct ConvGrads {
  Array dx, dweight, dbias, dstate0;
};

// The backward of sequence i alone (i = -1: the whole call, state0 read through `reads`).
ConvGrads conv_backward_of(Conv& c, int64_t i, const Tensor& state0, const cpu::Target& target, int threads,
                           std::span<const int64_t> reads = {}) {
  ConvBackwardArgs a(c.inputs(i));
  a.state0 = state0;
  a.sequences.initial_state_indices = reads;
  ConvGrads g{Array(c.x_dtype, c.sequence_shape(i)), Array(DType::f32, {c.C, c.W}), Array(DType::f32, {c.C}), {}};
  a.dy = i < 0 ? c.dy.tensor() : c.layout.view(c.dy, i);
  a.dx = g.dx.tensor();
  a.dweight = g.dweight.tensor();
  a.dbias = g.dbias.tensor();
  if (c.W > 1) {
    a.dstate = i < 0 ? c.dstate.tensor() : c.dstate.rows(0, i, 1);
    g.dstate0 = Array(DType::f32, c.state_shape(i < 0 ? c.layout.count() : 1));
    a.dstate0 = g.dstate0.tensor();
  }
  cpu::conv_backward(describe_conv_backward(a, {}), cpu::Run{target, {threads}});
  return g;
}

using ConvParam = std::tuple<DType, DType>;
class VarlenConv : public ::testing::TestWithParam<ConvParam> {};

// Packed sequences shorter than the window, as long as it, past a block of positions (256) and
// empty, 40 channels (a partial vector), W = 1, 3, 4, with and without initial states: y, the
// final states, dx and dstate0 bitwise those of each sequence alone; dweight and dbias, summed
// over every sequence, their sum.
TEST_P(VarlenConv, PackedEqualsOneByOne) {
  const auto [x_dtype, y_dtype] = GetParam();
  for (const int W : {1, 3, 4}) {
    for (const bool with_state0 : {false, true}) {
      if (W == 1 && with_state0) continue;
      Conv c(x_dtype, y_dtype, 40, W, packed_layout({0, 1, 2, 3, 4, 300, 0, 5}), uint64_t(W * 2 + with_state0));
      const int64_t count = c.layout.count();
      Array state0;
      if (with_state0) {
        std::mt19937 rng(3);
        state0 = Array(DType::f32, c.state_shape(count));
        state0.fill(rng, -1, 1);
      }
      for (const cpu::Target* target : test::supported_targets()) {
        SCOPED_TRACE(std::to_string(W) + " taps" + (with_state0 ? " state0 " : " ") + target->name);
        ConvArgs a(c.inputs(-1));
        a.state0 = state0.tensor();
        Array y(y_dtype, c.sequence_shape(-1)), state;
        a.y = y.tensor();
        if (W > 1) {
          state = Array(DType::f32, c.state_shape(count));
          a.state = state.tensor();
        }
        run_conv_forward(a, *target, 3);
        EXPECT_FALSE(y.has_nan() || state.has_nan());
        const ConvGrads grads = conv_backward_of(c, -1, state0.tensor(), *target, 3);
        EXPECT_FALSE(grads.dx.has_nan() || grads.dstate0.has_nan());

        std::vector<double> dweight(size_t(c.C * W), 0.0), dbias(size_t(c.C), 0.0);
        const size_t row = W > 1 ? state.step(0) : 0;
        for (int64_t i = 0; i < count; ++i) {
          SCOPED_TRACE("sequence " + std::to_string(i));
          if (c.layout.length(i) == 0) {  // the state passes through
            std::vector<char> zero(row, 0);
            EXPECT_TRUE(same_bytes(state.bytes() + size_t(i) * row,
                                   with_state0 ? state0.bytes() + size_t(i) * row : zero.data(), row));
            EXPECT_TRUE(same_bytes(grads.dstate0.bytes() + size_t(i) * row, c.dstate.bytes() + size_t(i) * row, row));
            continue;
          }
          ConvArgs one(c.inputs(i));
          one.state0 = state0.rows(0, i, 1);
          Array y1(y_dtype, c.sequence_shape(i)), state1;
          one.y = y1.tensor();
          if (W > 1) {
            state1 = Array(DType::f32, c.state_shape(1));
            one.state = state1.tensor();
          }
          run_conv_forward(one, *target, 1);
          EXPECT_TRUE(same_bytes(c.layout.at(y, i), y1.bytes(), y1.buffer.size() * y1.element_bytes())) << "y";
          EXPECT_TRUE(same_bytes(state.bytes() + size_t(i) * row, state1.bytes(), row)) << "state";
          const ConvGrads own = conv_backward_of(c, i, state0.rows(0, i, 1), *target, 1);
          EXPECT_TRUE(
              same_bytes(c.layout.at(grads.dx, i), own.dx.bytes(), own.dx.buffer.size() * own.dx.element_bytes()))
              << "dx";
          EXPECT_TRUE(same_bytes(grads.dstate0.bytes() + size_t(i) * row, own.dstate0.bytes(), row)) << "dstate0";
          for (size_t e = 0; e < dweight.size(); ++e) dweight[e] += own.dweight.buffer.get(e);
          for (size_t e = 0; e < dbias.size(); ++e) dbias[e] += own.dbias.buffer.get(e);
        }
        expect_summed(grads.dweight, dweight, "dweight");
        expect_summed(grads.dbias, dbias, "dbias");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenConv,
                         ::testing::Values(ConvParam{DType::f32, DType::f32}, ConvParam{DType::bf16, DType::bf16},
                                           ConvParam{DType::bf16, DType::f32}),
                         [](const ::testing::TestParamInfo<ConvParam>& p) {
                           return "x_" + std::string(dtype_name(std::get<0>(p.param))) + "_y_" +
                                  std::string(dtype_name(std::get<1>(p.param)));
                         });

// The convolution's states through a pool, as the recurrence's (VarlenPool).
TEST(VarlenConvPool, ReadsAndWritesIndexedRowsInPlace) {
  for (const PoolCase& pc : pool_cases()) {
    for (const bool in_place : {true, false}) {
      Conv c(DType::bf16, DType::bf16, 24, 4, pc.layout, 13);
      std::mt19937 rng(9);
      Array values(DType::f32, c.state_shape(pc.P)), original(DType::f32, c.state_shape(pc.P));
      values.fill(rng, -1, 1);
      const size_t row = original.step(0);
      for (int64_t r : pc.reads)
        if (r >= 0) std::memcpy(original.bytes() + size_t(r) * row, values.bytes() + size_t(r) * row, row);
      for (const cpu::Target* target : test::supported_targets()) {
        SCOPED_TRACE(std::string(pc.layout.cu.empty() ? "rows" : "cu_seqlens") +
                     (in_place ? " in place " : " two pools ") + target->name);
        Array expected = in_place ? original : Array(DType::f32, c.state_shape(pc.P));
        Array pool = original, second(DType::f32, c.state_shape(pc.P)), y(DType::bf16, c.sequence_shape(-1));
        for (int64_t i = 0; i < c.layout.count(); ++i) {
          const int64_t read = pc.reads[size_t(i)], write = pc.writes[size_t(i)];
          Array final_state(DType::f32, c.state_shape(1));
          std::memset(final_state.bytes(), 0, row);
          if (read >= 0) std::memcpy(final_state.bytes(), original.bytes() + size_t(read) * row, row);
          if (c.layout.length(i) > 0) {
            ConvArgs one(c.inputs(i));
            Array start = final_state;
            one.state0 = read >= 0 ? start.tensor() : Tensor{};
            Array y1(DType::bf16, c.sequence_shape(i));
            one.y = y1.tensor();
            one.state = final_state.tensor();
            run_conv_forward(one, *target, 1);
          }
          if (write >= 0) std::memcpy(expected.bytes() + size_t(write) * row, final_state.bytes(), row);
        }
        ConvArgs a(c.inputs(-1));
        a.sequences.initial_state_indices = pc.reads;
        a.sequences.final_state_indices = pc.writes;
        a.state0 = pool.tensor();
        a.state = in_place ? a.state0 : second.tensor();
        a.y = y.tensor();
        run_conv_forward(a, *target, 3);
        const Array& written = in_place ? pool : second;
        for (int64_t r = 0; r < pc.P; ++r)
          EXPECT_TRUE(same_bytes(written.bytes() + size_t(r) * row, expected.bytes() + size_t(r) * row, row))
              << "pool row " << r;

        Array pool_in = original;
        const ConvGrads grads = conv_backward_of(c, -1, pool_in.tensor(), *target, 3, pc.reads);
        for (int64_t i = 0; i < c.layout.count(); ++i) {
          const int64_t read = pc.reads[size_t(i)];
          const size_t drow = grads.dstate0.step(0);
          if (c.layout.length(i) == 0) {
            EXPECT_TRUE(
                same_bytes(grads.dstate0.bytes() + size_t(i) * drow, c.dstate.bytes() + size_t(i) * drow, drow));
            continue;
          }
          const ConvGrads own = conv_backward_of(c, i, read >= 0 ? pool_in.rows(0, read, 1) : Tensor{}, *target, 1);
          EXPECT_TRUE(same_bytes(c.layout.at(grads.dx, i), own.dx.bytes(), own.dx.buffer.size() * 2)) << "dx of " << i;
          EXPECT_TRUE(same_bytes(grads.dstate0.bytes() + size_t(i) * drow, own.dstate0.bytes(), drow))
              << "dstate0 of " << i;
        }
      }
    }
  }
}

// ---- Speculative decoding: every token's state kept --------------------------------------------

// Tokens [first, first + n) of sequence i of a packed [1, S, ...] array, as a tensor of one row; a
// rank-1 array (retnet's gate) whole.
Tensor tokens_of(Array& a, const Layout& l, int64_t i, int64_t first, int64_t n) {
  if (a.shape.size() == 1) return a.tensor();
  return a.rows(1, l.cu[size_t(i)] + first, n);
}

// A pool of P rows, random in `rows`, NaN elsewhere.
Array pool_with(const std::vector<int64_t>& shape, const std::vector<int64_t>& rows, std::mt19937& rng) {
  Array pool(DType::f32, shape), values(DType::f32, shape);
  values.fill(rng, -1, 1);
  const size_t row = pool.step(0);
  for (int64_t r : rows)
    if (r >= 0) std::memcpy(pool.bytes() + size_t(r) * row, values.bytes() + size_t(r) * row, row);
  return pool;
}

// One speculative step: per packed token the pool row its state goes to (rows from 4 on, a few
// -1), each sequence's start row and final row (in a pool of P rows). Lengths 3, 1, 4 and 19 (past
// a chunk of 16: the decode path loads its rows chunk by chunk).
struct SpeculativeStep {
  Layout layout = packed_layout({3, 1, 4, 19});
  std::vector<int64_t> reads{0, 1, -1, 2}, finals{31, -1, 32, 3};
  std::vector<int64_t> tokens;
  int64_t P = 33;
  SpeculativeStep() {
    for (int64_t t = 0; t < layout.S; ++t) tokens.push_back(t == 1 || t == 9 ? -1 : 4 + t);
  }
  // The pool row the state after token t of sequence i went to.
  int64_t token_row(int64_t i, int64_t t) const { return tokens[size_t(layout.cu[size_t(i)] + t)]; }
};

class VarlenTokenStates : public ::testing::TestWithParam<Variant> {};

// The pool (in place: h0 and ht one view) gets, at each kept token's row, bitwise the final state
// of that sequence's tokens up to it run alone through the decode path, at each final row the
// whole sequence's, and nothing anywhere else (NaN rows stay NaN); y is each sequence's alone.
// Then the next step, one token per sequence started from the row of its last accepted token
// (num_accepted = 1, 1, 3, 10), gives what one token from that state gives: the rejected tokens
// are rolled back with no copy.
TEST_P(VarlenTokenStates, KeepsEachTokensStateAndRollsBack) {
  const Variant variant = GetParam();
  const SpeculativeStep step;
  Recurrence r(variant, DType::f32, 12, 7, 16, step.layout, 21);
  std::mt19937 rng(8);
  const Array original = pool_with(r.state_shape(step.P), step.reads, rng);
  const size_t state = original.step(0);
  // The decode path of a call of one sequence: every token_state_indices entry -1, the final
  // state to row 0 of a one-row pool.
  static const std::vector<int64_t> row0{0};
  const auto alone = [&](Inputs in, int64_t read, const Array& from, const cpu::Target& target, Array& y) {
    const int64_t n = in.q.shape[1];
    const std::vector<int64_t> none(size_t(n), -1);
    ForwardArgs a(in);
    Array h0(DType::f32, r.state_shape(1)), ht(DType::f32, r.state_shape(1));
    if (read >= 0) std::memcpy(h0.bytes(), from.bytes() + size_t(read) * state, state);
    a.h0 = read >= 0 ? h0.tensor() : Tensor{};
    y = Array(DType::f32, {1, n, kN, r.V});
    a.y = y.tensor();
    a.ht = ht.tensor();
    a.sequences.token_state_indices = none;
    a.sequences.final_state_indices = row0;
    run_forward(r, a, target, 1);
    return ht;
  };
  for (const cpu::Target* target : test::supported_targets()) {
    SCOPED_TRACE(std::string(variant_name(variant)) + " " + target->name);
    Array pool = original, y(DType::f32, r.output_shape(-1));
    ForwardArgs a(r.inputs(-1));
    a.h0 = a.ht = pool.tensor();
    a.y = y.tensor();
    a.sequences.initial_state_indices = step.reads;
    a.sequences.final_state_indices = step.finals;
    a.sequences.token_state_indices = step.tokens;
    run_forward(r, a, *target, 3);

    Array expected = original;
    for (int64_t i = 0; i < r.layout.count(); ++i) {
      Array y_alone;
      for (int64_t t = 0; t < r.layout.length(i); ++t) {
        Inputs prefix;
        for (int x = 0; x < 7; ++x) prefix.*kInputs[x] = tokens_of(r.in[x], r.layout, i, 0, t + 1);
        const Array after = alone(prefix, step.reads[size_t(i)], original, *target, y_alone);
        if (step.token_row(i, t) >= 0)
          std::memcpy(expected.bytes() + size_t(step.token_row(i, t)) * state, after.bytes(), state);
        if (t + 1 == r.layout.length(i) && step.finals[size_t(i)] >= 0)
          std::memcpy(expected.bytes() + size_t(step.finals[size_t(i)]) * state, after.bytes(), state);
      }
      EXPECT_TRUE(same_bytes(r.layout.at(y, i), y_alone.bytes(), y_alone.buffer.size() * 4)) << "y of " << i;
    }
    for (int64_t row = 0; row < step.P; ++row)
      EXPECT_TRUE(same_bytes(pool.bytes() + size_t(row) * state, expected.bytes() + size_t(row) * state, state))
          << "pool row " << row;

    // The next step from the last accepted tokens' rows, its final states to fresh rows.
    const std::vector<int64_t> accepted{1, 1, 3, 10}, next_final{0, 1, 2, 30};
    std::vector<int64_t> next_read;
    for (int64_t i = 0; i < r.layout.count(); ++i) next_read.push_back(step.token_row(i, accepted[size_t(i)] - 1));
    Recurrence next(variant, DType::f32, 12, 7, 16, packed_layout({1, 1, 1, 1}), 22);
    Array y_next(DType::f32, next.output_shape(-1));
    ForwardArgs b(next.inputs(-1));
    b.h0 = b.ht = pool.tensor();
    b.y = y_next.tensor();
    b.sequences.initial_state_indices = next_read;
    b.sequences.final_state_indices = next_final;
    run_forward(next, b, *target, 3);
    for (int64_t i = 0; i < next.layout.count(); ++i) {
      Array y_alone;
      const Array after = alone(next.inputs(i), next_read[size_t(i)], expected, *target, y_alone);
      EXPECT_TRUE(same_bytes(pool.bytes() + size_t(next_final[size_t(i)]) * state, after.bytes(), state))
          << "next state of " << i;
      EXPECT_TRUE(same_bytes(next.layout.at(y_next, i), y_alone.bytes(), y_alone.buffer.size() * 4))
          << "next y of " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenTokenStates, ::testing::ValuesIn(variants_where(any_variant)),
                         [](const ::testing::TestParamInfo<Variant>& p) { return std::string(variant_name(p.param)); });

// The convolution's states after each token: its last W-1 inputs, from state0 before the first.
TEST(VarlenConvTokenStates, KeepsEachTokensState) {
  const SpeculativeStep step;
  Conv c(DType::bf16, DType::bf16, 24, 4, step.layout, 17);
  std::mt19937 rng(10);
  const Array original = pool_with(c.state_shape(step.P), step.reads, rng);
  const size_t row = original.step(0);
  for (const cpu::Target* target : test::supported_targets()) {
    SCOPED_TRACE(target->name);
    Array pool = original, y(DType::bf16, c.sequence_shape(-1));
    ConvArgs a(c.inputs(-1));
    a.state0 = a.state = pool.tensor();
    a.y = y.tensor();
    a.sequences.initial_state_indices = step.reads;
    a.sequences.final_state_indices = step.finals;
    a.sequences.token_state_indices = step.tokens;
    run_conv_forward(a, *target, 3);
    Array expected = original;
    for (int64_t i = 0; i < c.layout.count(); ++i)
      for (int64_t t = 0; t < c.layout.length(i); ++t) {
        ConvArgs one(c.inputs(-1));
        one.sequences = {};
        one.x = tokens_of(c.x, c.layout, i, 0, t + 1);
        Array start(DType::f32, c.state_shape(1)), after(DType::f32, c.state_shape(1)), y1(DType::bf16, {1, t + 1, c.C});
        const int64_t read = step.reads[size_t(i)];
        if (read >= 0) std::memcpy(start.bytes(), original.bytes() + size_t(read) * row, row);
        one.state0 = read >= 0 ? start.tensor() : Tensor{};
        one.state = after.tensor();
        one.y = y1.tensor();
        run_conv_forward(one, *target, 1);
        for (const int64_t to : {step.token_row(i, t), t + 1 == c.layout.length(i) ? step.finals[size_t(i)] : -1})
          if (to >= 0) std::memcpy(expected.bytes() + size_t(to) * row, after.bytes(), row);
      }
    for (int64_t r = 0; r < step.P; ++r)
      EXPECT_TRUE(same_bytes(pool.bytes() + size_t(r) * row, expected.bytes() + size_t(r) * row, row)) << "pool row " << r;
  }
}

// ---- Bad sequences --------------------------------------------------------------------------

// Outputs whose bytes must stay as they were.
struct Watched {
  std::vector<const Array*> arrays;
  std::vector<std::vector<char>> saved;
  void watch(const Array& a) {
    arrays.push_back(&a);
    saved.emplace_back(a.bytes(), a.bytes() + a.buffer.size() * a.element_bytes());
  }
  bool outputs_untouched() const {
    for (size_t i = 0; i < arrays.size(); ++i)
      if (!same_bytes(arrays[i]->bytes(), saved[i].data(), saved[i].size())) return false;
    return true;
  }
};

TEST(VarlenErrors, RecurrenceRefusesBadSequencesWritingNothing) {
  Recurrence r(Variant::gla, DType::f32, 16, 16, 16, packed_layout({2, 0, 3}), 1);  // 3 sequences, S = 5
  std::mt19937 rng(2);
  Array pool(DType::f32, r.state_shape(4)), ht(DType::f32, r.state_shape(3)), y(DType::f32, r.output_shape(-1));
  pool.fill(rng, -1, 1);
  Watched out;
  for (const Array* a : {&pool, &ht, &y}) out.watch(*a);
  const auto check = [&](const std::string& fragment, const std::function<void(ForwardArgs&)>& edit) {
    ForwardArgs a(r.inputs(-1));
    a.y = y.tensor();
    edit(a);
    expect_error([&] { forward(Variant::gla, a, r.options); }, fragment, out);
  };
  const std::vector<int64_t> not_from_0{1, 2, 5}, decreasing{0, 3, 2, 5}, past{0, 7, 5}, short_of{0, 2, 4}, one{0},
      two{0, 1}, below{0, -2, 1}, beyond{0, 4, 1}, all{0, 1, 2}, twice{1, -1, 1}, reads{0, 1, 2}, writes{1, 3, -1};
  for (const auto& [offsets, fragment] :
       {std::pair{&not_from_0, "cu_seqlens: expected the first offset to be 0, got cu_seqlens[0] = 1"},
        std::pair{&decreasing,
                  "cu_seqlens: expected non-decreasing offsets, got cu_seqlens[1] = 3 > cu_seqlens[2] = 2"},
        std::pair{&past,
                  "cu_seqlens: expected offsets up to S = 5 (the length of q), got cu_seqlens[1] = 7, past the end"},
        std::pair{&short_of, "cu_seqlens: expected the last offset to be S = 5"},
        std::pair{&one, "cu_seqlens: expected num_seqs + 1 offsets"}}) {
    const std::vector<int64_t>* cu = offsets;
    check(fragment, [&](ForwardArgs& a) { a.sequences.cu_seqlens = *cu; });
  }
  check("initial_state_indices: expected one index per sequence, num_seqs = 3, got 2", [&](ForwardArgs& a) {
    a.h0 = pool.tensor();
    a.sequences.initial_state_indices = two;
  });
  check(
      "initial_state_indices: expected indices from -1 (none) to P-1 = 3 (the rows of h0), got "
      "initial_state_indices[1] = -2",
      [&](ForwardArgs& a) {
        a.h0 = pool.tensor();
        a.sequences.initial_state_indices = below;
      });
  check("initial_state_indices[1] = 4", [&](ForwardArgs& a) {
    a.h0 = pool.tensor();
    a.sequences.initial_state_indices = beyond;
  });
  check("initial_state_indices: given, but there is no h0",
        [&](ForwardArgs& a) { a.sequences.initial_state_indices = all; });
  check("final_state_indices: given, but there is no ht",
        [&](ForwardArgs& a) { a.sequences.final_state_indices = all; });
  check("final_state_indices: expected each row of ht written once, got final_state_indices[0] and final_state_indices[2] both writing row 1",
        [&](ForwardArgs& a) {
          a.ht = pool.tensor();
          a.sequences.final_state_indices = twice;
        });
  check("final_state_indices: h0 and ht are one pool updated in place", [&](ForwardArgs& a) {
    a.h0 = a.ht = pool.tensor();
    a.sequences.initial_state_indices = reads;
    a.sequences.final_state_indices = writes;
  });
  // Speculative decoding's per-token rows (5 tokens: 2, 0 and 3 per sequence) share the checks.
  const std::vector<int64_t> four_tokens{0, 1, 2, 3}, token_past{-1, 0, 1, 2, 4}, token_twice{0, 1, -1, 2, 1},
      token_and_final{-1, -1, 0, 1, 2}, token_reads{3, -1, 1, -1, -1}, finals{0, -1, 3};
  check("token_state_indices: expected one index per token, B * S = 5 (the tokens of q), got 4", [&](ForwardArgs& a) {
    a.ht = pool.tensor();
    a.sequences.token_state_indices = four_tokens;
  });
  check("token_state_indices: given, but there is no ht",
        [&](ForwardArgs& a) { a.sequences.token_state_indices = token_past; });
  check("token_state_indices: expected indices from -1 (none) to P-1 = 3 (the rows of ht), got token_state_indices[4] = 4",
        [&](ForwardArgs& a) {
          a.ht = pool.tensor();
          a.sequences.token_state_indices = token_past;
        });
  check("token_state_indices: expected each row of ht written once, got token_state_indices[1] and token_state_indices[4] "
        "both writing row 1",
        [&](ForwardArgs& a) {
          a.ht = pool.tensor();
          a.sequences.token_state_indices = token_twice;
        });
  check("token_state_indices: expected each row of ht written once, got final_state_indices[0] and token_state_indices[2] "
        "both writing row 0",
        [&](ForwardArgs& a) {
          a.ht = pool.tensor();
          a.sequences.final_state_indices = finals;
          a.sequences.token_state_indices = token_and_final;
        });
  check("token_state_indices: h0 and ht are one pool updated in place, so a row one sequence reads may be written by "
        "no other; got row 1 read by sequence 0 and written by sequence 2 (token_state_indices[2])",
        [&](ForwardArgs& a) {
          a.h0 = a.ht = pool.tensor();
          a.sequences.initial_state_indices = std::span<const int64_t>(four_tokens).subspan(1);
          a.sequences.token_state_indices = token_reads;
        });
  check("h0: expected shape [num_seqs=3, N=2, K=16, V=16], got [4, 2, 16, 16]",
        [&](ForwardArgs& a) { a.h0 = pool.tensor(); });
  check("ht: expected shape [num_seqs=3", [&](ForwardArgs& a) { a.ht = pool.tensor(); });
  // Without cu_seqlens the indices count batch rows; with them B must be 1.
  Recurrence rows(Variant::gla, DType::f32, 16, 16, 16, Layout{2, 5, {}}, 1);
  Array y2(DType::f32, rows.output_shape(-1));
  out.watch(y2);
  {
    ForwardArgs a(rows.inputs(-1));
    a.y = y2.tensor();
    a.sequences.cu_seqlens = std::span<const int64_t>(short_of).first(2);
    expect_error([&] { forward(Variant::gla, a, rows.options); },
                 "cu_seqlens: packs the sequences along S of one batch row, expected B = 1 in q, got B = 2", out);
    a.sequences.cu_seqlens = {};
    a.h0 = pool.tensor();
    a.sequences.initial_state_indices = all;
    expect_error([&] { forward(Variant::gla, a, rows.options); },
                 "initial_state_indices: expected one index per sequence, B = 2, got 3", out);
  }
  // The value scan reads the indexed rows, naming the row.
  Array poisoned = pool;
  poisoned.buffer.set(size_t(2 * kN * 16 * 16 + 5), std::nan(""));
  out.watch(poisoned);
  check("h0[2]: expected finite values, got nan at [0, 0, 5]", [&](ForwardArgs& a) {
    a.h0 = poisoned.tensor();
    a.sequences.initial_state_indices = all;
  });

  // The backward: the same sequences, no final_state_indices, gradients of the states per sequence.
  Backward grads;
  for (int x = 0; x <= kGate; ++x) {  // gla's inputs: q, k, v, g
    grads.grad[x] = Array(DType::f32, r.in[x].shape);
    out.watch(grads.grad[x]);
  }
  const auto check_backward = [&](const std::string& fragment, const std::function<void(BackwardArgs&)>& edit) {
    BackwardArgs a(r.inputs(-1));
    a.dy = r.dy.tensor();
    for (int x = 0; x < 4; ++x) a.*kGradients[x] = grads.grad[x].tensor();
    edit(a);
    expect_error([&] { backward(Variant::gla, a, r.options); }, fragment, out);
  };
  check_backward("final_state_indices: expected none: a backward writes no states",
                 [&](BackwardArgs& a) { a.sequences.final_state_indices = all; });
  check_backward("token_state_indices: expected none: a backward writes no states",
                 [&](BackwardArgs& a) { a.sequences.token_state_indices = token_past; });
  check_backward("dht: expected shape [num_seqs=3", [&](BackwardArgs& a) { a.dht = pool.tensor(); });
  check_backward("dh0: expected shape [num_seqs=3", [&](BackwardArgs& a) {
    a.h0 = pool.tensor();
    a.sequences.initial_state_indices = all;
    a.dh0 = pool.tensor();
  });
}

TEST(VarlenErrors, ConvRefusesBadSequencesWritingNothing) {
  Conv c(DType::f32, DType::f32, 16, 4, packed_layout({2, 0, 3}), 1);
  std::mt19937 rng(4);
  Array pool(DType::f32, c.state_shape(4)), y(DType::f32, c.sequence_shape(-1));
  pool.fill(rng, -1, 1);
  Watched out;
  out.watch(pool);
  out.watch(y);
  const auto check = [&](const std::string& fragment, const std::function<void(ConvArgs&)>& edit) {
    ConvArgs a(c.inputs(-1));
    a.y = y.tensor();
    edit(a);
    expect_error([&] { conv_forward(a); }, fragment, out);
  };
  const std::vector<int64_t> decreasing{0, 3, 2, 5}, beyond{0, 4, 1}, twice{1, -1, 1}, reads{0, 1, 2}, writes{1, 3, -1};
  check("cu_seqlens: expected non-decreasing offsets, got cu_seqlens[1] = 3 > cu_seqlens[2] = 2",
        [&](ConvArgs& a) { a.sequences.cu_seqlens = decreasing; });
  check("cu_seqlens: expected offsets up to S = 5 (the length of x)", [&](ConvArgs& a) {
    static const std::vector<int64_t> past{0, 6, 5};
    a.sequences.cu_seqlens = past;
  });
  check(
      "initial_state_indices: expected indices from -1 (none) to P-1 = 3 (the rows of state0), got "
      "initial_state_indices[1] = 4",
      [&](ConvArgs& a) {
        a.state0 = pool.tensor();
        a.sequences.initial_state_indices = beyond;
      });
  check("final_state_indices: expected each row of state written once", [&](ConvArgs& a) {
    a.state = pool.tensor();
    a.sequences.final_state_indices = twice;
  });
  check("final_state_indices: state0 and state are one pool updated in place", [&](ConvArgs& a) {
    a.state0 = a.state = pool.tensor();
    a.sequences.initial_state_indices = reads;
    a.sequences.final_state_indices = writes;
  });
  check("token_state_indices: expected each row of state written once, got token_state_indices[0] and "
        "token_state_indices[4] both writing row 2",
        [&](ConvArgs& a) {
          static const std::vector<int64_t> tokens{2, -1, -1, 0, 2};
          a.state = pool.tensor();
          a.sequences.token_state_indices = tokens;
        });
  check("state0: expected shape [num_seqs=3, C=16, W-1=3], got [4, 16, 3]",
        [&](ConvArgs& a) { a.state0 = pool.tensor(); });

  Array dx(DType::f32, c.sequence_shape(-1)), dweight(DType::f32, {16, 4}), dbias(DType::f32, {16});
  for (const Array* a : {&dx, &dweight, &dbias}) out.watch(*a);
  ConvBackwardArgs a(c.inputs(-1));
  a.dy = c.dy.tensor();
  a.dx = dx.tensor();
  a.dweight = dweight.tensor();
  a.dbias = dbias.tensor();
  a.sequences.final_state_indices = writes;
  expect_error([&] { conv_backward(a); }, "final_state_indices: expected none: a backward writes no states", out);
  a.sequences.final_state_indices = {};
  a.dstate0 = pool.tensor();
  expect_error([&] { conv_backward(a); }, "dstate0: expected shape [num_seqs=3", out);
}

// ---- Empty calls -----------------------------------------------------------------------------

// A call of no token (B = 0, or S = 0: every sequence empty) does what a framework's op does on an
// empty batch: no output element, each sequence's final state its initial one (zero without
// one), the states' gradients passed through (dh0 = dht), a gradient summed over the tokens zero.
// Tensors of no elements come without memory (a null data pointer), as frameworks give them.

// Row i of a [rows, ...] fp32 array, bitwise `expected`'s row j (j = -1: zeros).
void expect_row(const Array& a, int64_t i, const Array& expected, int64_t j, const std::string& what) {
  const size_t n = a.step(0);
  const std::vector<char> zeros(n, 0);
  const char* want = j < 0 ? zeros.data() : expected.bytes() + size_t(j) * n;
  EXPECT_TRUE(same_bytes(a.bytes() + size_t(i) * n, want, n)) << what << " row " << i;
}

std::vector<Layout> empty_layouts() { return {Layout{0, 6, {}}, Layout{2, 0, {}}, packed_layout({0, 0, 0})}; }

std::string layout_name(const Layout& l) {
  return "B=" + std::to_string(l.B) + " S=" + std::to_string(l.S) + " sequences=" + std::to_string(l.count());
}

TEST(EmptyCalls, RecurrencePassesTheStatesOn) {
  for (const VariantInfo& vi : all_variants())
    for (const Layout& layout : empty_layouts())
      for (const bool with_states : {true, false}) {
        SCOPED_TRACE(std::string(vi.name) + " " + layout_name(layout) + (with_states ? " h0, dht" : ""));
        Recurrence r(vi.variant, DType::bf16, 16, 8, 16, layout, 11);
        std::mt19937 rng{5};
        Array h0(DType::f32, r.state_shape(layout.count()));
        h0.fill(rng, -1, 1);
        ForwardArgs f(r.inputs(-1));
        if (with_states) f.h0 = h0.tensor();
        Array y(r.dtype, r.output_shape(-1)), ht(DType::f32, r.state_shape(layout.count()));
        f.y = y.tensor();
        f.ht = ht.tensor();
        forward(vi.variant, f, r.options);
        for (int64_t i = 0; i < layout.count(); ++i) expect_row(ht, i, h0, with_states ? i : -1, "ht");

        BackwardArgs b(f);
        b.dy = r.dy.tensor();
        if (with_states) b.dht = r.dht.tensor();
        Array grads[7], dh0(DType::f32, r.state_shape(layout.count()));
        for (int x = 0; x < 7; ++x)
          if (r.in[x].present()) {
            grads[x] = Array(r.in[x].buffer.dtype, r.in[x].shape);
            b.*kGradients[x] = grads[x].tensor();
          }
        b.dh0 = dh0.tensor();
        backward(vi.variant, b, r.options);
        for (int64_t i = 0; i < layout.count(); ++i) expect_row(dh0, i, r.dht, with_states ? i : -1, "dh0");
        for (int x = 0; x < 7; ++x)  // retnet's dg [Ng] alone has elements: summed over no token
          for (size_t e = 0; e < grads[x].buffer.size(); ++e) EXPECT_EQ(grads[x].buffer.get(e), 0.0) << kNames[x];
      }
}

// Sequences of no token with a pool updated in place: the rows written get the rows read, the
// others stay as they were.
TEST(EmptyCalls, PoolRowsGetTheRowsRead) {
  Recurrence r(Variant::gla, DType::f32, 16, 8, 16, packed_layout({0, 0, 0}), 3);
  std::mt19937 rng{9};
  Array pool(DType::f32, r.state_shape(5));
  pool.fill(rng, -1, 1);
  const Array before = pool;
  const std::vector<int64_t> reads{2, -1, 1}, writes{0, 3, 1};
  ForwardArgs f(r.inputs(-1));
  f.h0 = f.ht = pool.tensor();
  f.sequences.initial_state_indices = reads;
  f.sequences.final_state_indices = writes;
  Array y(r.dtype, r.output_shape(-1));
  f.y = y.tensor();
  forward(r.variant, f, r.options);
  for (const auto& [row, from] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {1, 1}, {2, 2}, {4, 4}})
    expect_row(pool, row, before, from, "pool");
  expect_row(pool, 3, before, -1, "pool");
}

TEST(EmptyCalls, ConvPassesTheStatesOn) {
  for (const Layout& layout : empty_layouts())
    for (const bool with_states : {true, false}) {
      SCOPED_TRACE(layout_name(layout) + (with_states ? " state0, dstate" : ""));
      Conv c(DType::bf16, DType::f32, 24, 4, layout, 13);
      std::mt19937 rng{2};
      Array state0(DType::f32, c.state_shape(layout.count()));
      state0.fill(rng, -1, 1);
      ConvArgs f(c.inputs(-1));
      if (with_states) f.state0 = state0.tensor();
      Array y(c.y_dtype, c.sequence_shape(-1)), state(DType::f32, c.state_shape(layout.count()));
      f.y = y.tensor();
      f.state = state.tensor();
      conv_forward(f);
      for (int64_t i = 0; i < layout.count(); ++i) expect_row(state, i, state0, with_states ? i : -1, "state");

      ConvBackwardArgs b(f);
      b.dy = c.dy.tensor();
      if (with_states) b.dstate = c.dstate.tensor();
      Array dx(c.x_dtype, c.sequence_shape(-1)), dweight(DType::f32, {c.C, c.W}), dbias(DType::f32, {c.C}),
          dstate0(DType::f32, c.state_shape(layout.count()));
      b.dx = dx.tensor();
      b.dweight = dweight.tensor();
      b.dbias = dbias.tensor();
      b.dstate0 = dstate0.tensor();
      conv_backward(b);
      for (int64_t i = 0; i < layout.count(); ++i) expect_row(dstate0, i, c.dstate, with_states ? i : -1, "dstate0");
      for (const Array* sum : {&dweight, &dbias})
        for (size_t e = 0; e < sum->buffer.size(); ++e) EXPECT_EQ(sum->buffer.get(e), 0.0);
    }
}

TEST(EmptyCalls, NormGateWritesAZeroWeightGradient) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{0, 3, 2, 8}, {2, 0, 2, 8}, {1, 3, 0, 8}})
    for (const bool per_head : {false, true}) {
      SCOPED_TRACE("x [" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + ", " +
                   std::to_string(shape[2]) + ", 8]" + (per_head ? " weight [N, D]" : ""));
      const std::vector<int64_t> weight_shape = per_head ? std::vector<int64_t>{shape[2], 8} : std::vector<int64_t>{8};
      Array x(DType::bf16, shape), g(DType::f32, shape), y(DType::bf16, shape), weight(DType::f32, weight_shape);
      std::mt19937 rng{4};
      weight.fill(rng, 0.5, 1.5);
      NormGateArgs f;
      f.x = x.tensor();
      f.g = g.tensor();
      f.weight = weight.tensor();
      f.y = y.tensor();
      norm_gate_forward(f);
      NormGateBackwardArgs b(f);
      Array dy(DType::bf16, shape), dx(DType::bf16, shape), dg(DType::f32, shape), dweight(DType::f32, weight_shape);
      b.dy = dy.tensor();
      b.dx = dx.tensor();
      b.dg = dg.tensor();
      b.dweight = dweight.tensor();
      norm_gate_backward(b);
      for (size_t e = 0; e < dweight.buffer.size(); ++e) EXPECT_EQ(dweight.buffer.get(e), 0.0);
    }
}

// An empty call is still checked in full before anything is written.
TEST(EmptyCalls, AreCheckedLikeAnyCall) {
  Recurrence r(Variant::gla, DType::f32, 16, 8, 16, Layout{2, 0, {}}, 1);
  Array h0(DType::f32, r.state_shape(2)), ht(DType::f32, r.state_shape(2)), y(DType::f32, r.output_shape(-1));
  std::mt19937 rng{1};
  h0.fill(rng, -1, 1);
  h0.buffer.set(5, std::numeric_limits<double>::infinity());
  Watched out;
  out.watch(ht);
  ForwardArgs f(r.inputs(-1));
  f.h0 = h0.tensor();
  f.y = y.tensor();
  f.ht = ht.tensor();
  expect_error([&] { forward(r.variant, f, r.options); }, "h0: expected finite values, got inf at [0, 0, 0, 5]", out);
  f.h0 = Tensor{};
  f.k = Tensor::contiguous(nullptr, DType::f32, {2, 1, kNk, 16});
  expect_error([&] { forward(r.variant, f, r.options); }, "k: expected shape [B=2, S=0, Nk, K=16], got [2, 1, 1, 16]",
               out);
  f.k = r.in[1].tensor();
  f.q = Tensor::contiguous(nullptr, DType::f32, {-1, 0, kNq, 16});
  expect_error([&] { forward(r.variant, f, r.options); }, "q: axis B must be at least 0, got -1", out);
  // The strides of a tensor of no elements are never used, so any pass (PyTorch gives some 0).
  f.q = Tensor::strided(nullptr, DType::f32, {2, 0, kNq, 16}, {0, 0, 0, 0});
  forward(r.variant, f, r.options);
  for (int64_t i = 0; i < 2; ++i) expect_row(ht, i, h0, -1, "ht");
}

}  // namespace
}  // namespace flat::test

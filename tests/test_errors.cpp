// Bad input: every entry point names the tensor, says what it expected and what came, and
// writes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "checks.h"
#include "flat/flat.h"

namespace flat {
namespace {

using test::expect_error;

constexpr int64_t B = 1, S = 5, N = 2, K = 16, V = 16;

struct Buffers {
  std::vector<float> q = std::vector<float>(B * S * N * K, 0.5f), k = q, v = std::vector<float>(B * S * N * V, 0.25f),
                     g = std::vector<float>(B * S * N * K, -0.1f), h0 = std::vector<float>(B * N * K * V, 0.f),
                     dy = v, dht = h0;
  std::vector<uint16_t> half = std::vector<uint16_t>(B * N * K * V, 0);
  // Outputs, poisoned.
  std::vector<float> y = nan(B * S * N * V), ht = nan(B * N * K * V), dq = nan(q.size()), dk = nan(k.size()),
                     dv = nan(v.size()), dg = nan(g.size()), dh0 = nan(h0.size());

  static std::vector<float> nan(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }
  bool outputs_untouched() const {
    for (const auto* t : {&y, &ht, &dq, &dk, &dv, &dg, &dh0})
      for (float x : *t)
        if (!std::isnan(x)) return false;
    return true;
  }
};

Tensor view4(std::vector<float>& data, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  return Tensor::contiguous(data.data(), DType::f32, {d0, d1, d2, d3});
}

Inputs inputs(Buffers& b) {
  Inputs a;
  a.q = view4(b.q, B, S, N, K);
  a.k = view4(b.k, B, S, N, K);
  a.v = view4(b.v, B, S, N, V);
  a.g = view4(b.g, B, S, N, K);
  a.h0 = view4(b.h0, B, N, K, V);
  return a;
}

ForwardArgs forward_args(Buffers& b) {
  ForwardArgs a{inputs(b)};
  a.y = view4(b.y, B, S, N, V);
  a.ht = view4(b.ht, B, N, K, V);
  return a;
}

BackwardArgs backward_args(Buffers& b) {
  BackwardArgs a{inputs(b)};
  a.dy = view4(b.dy, B, S, N, V);
  a.dht = view4(b.dht, B, N, K, V);
  a.dq = view4(b.dq, B, S, N, K);
  a.dk = view4(b.dk, B, S, N, K);
  a.dv = view4(b.dv, B, S, N, V);
  a.dg = view4(b.dg, B, S, N, K);
  a.dh0 = view4(b.dh0, B, N, K, V);
  return a;
}

struct ForwardBreak {
  const char* what;
  std::function<void(ForwardArgs&, Buffers&)> edit;
  std::string fragment;
  Variant variant = Variant::gla;
  Options options = {};
};

TEST(BadInput, ForwardNamesTheTensorAndWritesNothing) {
  Options bad_chunk;
  bad_chunk.chunk = 20;
  const std::vector<ForwardBreak> breaks = {
      {"q rank", [](ForwardArgs& a, Buffers& b) { a.q = Tensor::contiguous(b.q.data(), DType::f32, {B, S, N * K}); },
       "q: expected rank 4 [B, S, Nq, K], got rank 3 [1, 5, 32]"},
      {"k width", [](ForwardArgs& a, Buffers& b) { a.k = view4(b.k, B, S, 1, 2 * K); },
       "k: expected shape [B=1, S=5, Nk, K=16], got [1, 5, 1, 32]"},
      {"v width", [](ForwardArgs& a, Buffers&) { a.v.shape[3] = 300; }, "v: V = 300 is not supported"},
      {"q width", [](ForwardArgs& a, Buffers&) { a.q.shape[3] = 257; }, "q: K = 257 is not supported"},
      {"S < 0", [](ForwardArgs& a, Buffers&) { a.q.shape[1] = -1; }, "q: axis S must be at least 0, got -1"},
      {"S = 0 in q alone", [](ForwardArgs& a, Buffers&) { a.q.shape[1] = 0; },
       "k: expected shape [B=1, S=0, Nk, K=16], got [1, 5, 2, 16]"},
      {"Nq = 0", [](ForwardArgs& a, Buffers&) { a.q.shape[2] = 0; }, "q: axis Nq must be at least 1, got 0"},
      {"heads", [](ForwardArgs& a, Buffers&) { a.k.shape[2] = 3; },
       "k: head count Nk = 3 does not fit Nq = 2 of q: every head count must divide the largest, N = 3"},
      {"gate heads", [](ForwardArgs& a, Buffers&) { a.g.shape[2] = 3; }, "g: head count Ng = 3 does not fit Nq = 2 of q"},
      {"null q", [](ForwardArgs& a, Buffers&) { a.q.data = nullptr; }, "q: null data pointer"},
      {"null y", [](ForwardArgs& a, Buffers&) { a.y.data = nullptr; }, "y: null data pointer"},
      {"missing y", [](ForwardArgs& a, Buffers&) { a.y = Tensor{}; }, "y: required tensor is missing"},
      {"missing v", [](ForwardArgs& a, Buffers&) { a.v = Tensor{}; }, "v: required tensor is missing"},
      {"y shape", [](ForwardArgs& a, Buffers& b) { a.y = view4(b.y, B, S, 1, N * V); },
       "y: expected shape [B=1, S=5, N=2, V=16], got [1, 5, 1, 32]"},
      {"h0 dtype", [](ForwardArgs& a, Buffers& b) { a.h0 = Tensor::contiguous(b.half.data(), DType::bf16, {B, N, K, V}); },
       "h0: expected dtype f32 (states are fp32), got bf16"},
      {"ht shape", [](ForwardArgs& a, Buffers& b) { a.ht = view4(b.ht, B, N, V, K / 2); }, "ht: expected shape"},
      {"gate width", [](ForwardArgs& a, Buffers& b) { a.g = view4(b.g, B, S, N * K / 8, 8); },
       "g: expected shape [B=1, S=5, Ng, K=16], got [1, 5, 4, 8]"},
      {"missing gate", [](ForwardArgs& a, Buffers&) { a.g = Tensor{}; }, "g: required tensor is missing"},
      {"strided last axis", [](ForwardArgs& a, Buffers&) { a.q.stride[3] = 2; },
       "q: the last axis must be contiguous (stride 1), got stride 2"},
      {"negative stride", [](ForwardArgs& a, Buffers&) { a.v.stride[1] = -1; }, "v: negative stride on axis S"},
      {"la with a gate", [](ForwardArgs&, Buffers&) {}, "g: variant la takes no gate", Variant::la},
      {"mamba2 rank", [](ForwardArgs&, Buffers&) {}, "g: expected rank 3 [B=1, S=5, Ng], got rank 4 [1, 5, 2, 16]", Variant::mamba2},
      {"retnet rank", [](ForwardArgs&, Buffers&) {}, "g: expected rank 1 [Ng], got rank 4", Variant::retnet},
      {"chunk", [](ForwardArgs&, Buffers&) {}, "options.chunk: expected a multiple of 16 from 16 to 256, got 20",
       Variant::gla, bad_chunk},
      // Values: gates are log-decays, at most 0 and finite; states finite.
      {"gate above 0", [](ForwardArgs&, Buffers& b) { b.g[((0 * S + 3) * N + 1) * K + 5] = 100.f; },
       "g: expected finite values <= 0 (log-space gates), got 100 at [0, 3, 1, 5]"},
      {"gate NaN", [](ForwardArgs&, Buffers& b) { b.g[K + 2] = std::numeric_limits<float>::quiet_NaN(); },
       "g: expected finite values <= 0 (log-space gates), got nan at [0, 0, 1, 2]"},
      {"gate -inf", [](ForwardArgs&, Buffers& b) { b.g[N * K] = -std::numeric_limits<float>::infinity(); },
       "g: expected finite values <= 0 (log-space gates), got -inf at [0, 1, 0, 0]"},
      {"retnet gate above 0",
       [](ForwardArgs& a, Buffers& b) {
         a.g = Tensor::contiguous(b.g.data(), DType::f32, {N});
         b.g[1] = 0.5f;
       },
       "g: expected finite values <= 0 (log-space gates), got 0.5 at [1]", Variant::retnet},
      {"h0 infinite", [](ForwardArgs&, Buffers& b) { b.h0[((0 * N + 1) * K + 2) * V + 3] = std::numeric_limits<float>::infinity(); },
       "h0: expected finite values, got inf at [0, 1, 2, 3]"},
      // Outputs that overlap each other or an input.
      {"y over q", [](ForwardArgs& a, Buffers& b) { a.y.data = b.q.data(); },
       "y: an output must not overlap an input, got memory shared with q"},
      {"y with stride 0", [](ForwardArgs& a, Buffers&) { a.y.stride[1] = 0; },
       "y: an output's elements must not overlap, got a stride of 0"},
      {"y inside ht", [](ForwardArgs& a, Buffers& b) { a.y.data = b.ht.data(); },
       "y: outputs must not overlap, got memory shared with ht"},
  };
  for (const ForwardBreak& br : breaks) {
    SCOPED_TRACE(br.what);
    Buffers b;
    ForwardArgs a = forward_args(b);
    br.edit(a, b);
    expect_error([&] { forward(br.variant, a, br.options); }, br.fragment, b);
  }
}

struct BackwardBreak {
  const char* what;
  std::function<void(BackwardArgs&, Buffers&)> edit;
  std::string fragment;
};

TEST(BadInput, BackwardNamesTheTensorAndWritesNothing) {
  const std::vector<BackwardBreak> breaks = {
      {"dy shape", [](BackwardArgs& a, Buffers& b) { a.dy = view4(b.dy, B, S - 1, N, V); },
       "dy: expected shape [B=1, S=5, N=2, V=16], got [1, 4, 2, 16]"},
      {"dq dtype",
       [](BackwardArgs& a, Buffers& b) {
         b.half.resize(b.dq.size());
         a.dq = Tensor::contiguous(b.half.data(), DType::bf16, {B, S, N, K});
       },
       "dq: expected dtype f32 (the dtype of q), got bf16"},
      {"dk shape", [](BackwardArgs& a, Buffers& b) { a.dk = view4(b.dk, B, S, N, K / 2); }, "dk: expected shape"},
      {"missing dv", [](BackwardArgs& a, Buffers&) { a.dv = Tensor{}; }, "dv: required tensor is missing"},
      {"missing dg", [](BackwardArgs& a, Buffers&) { a.dg = Tensor{}; }, "dg: required tensor is missing"},
      {"dht dtype", [](BackwardArgs& a, Buffers& b) { a.dht = Tensor::contiguous(b.half.data(), DType::bf16, {B, N, K, V}); },
       "dht: expected dtype f32"},
      {"dh0 shape", [](BackwardArgs& a, Buffers& b) { a.dh0 = view4(b.dh0, B, N, K / 2, V); }, "dh0: expected shape"},
      {"null dk", [](BackwardArgs& a, Buffers&) { a.dk.data = nullptr; }, "dk: null data pointer"},
      {"q rank", [](BackwardArgs& a, Buffers& b) { a.q = Tensor::contiguous(b.q.data(), DType::f32, {S, N, K}); },
       "q: expected rank 4"},
      {"gate above 0", [](BackwardArgs&, Buffers& b) { b.g[7] = 1e-30f; },
       "g: expected finite values <= 0 (log-space gates), got 1e-30 at [0, 0, 0, 7]"},
      {"dq and dk in one buffer", [](BackwardArgs& a, Buffers& b) { a.dk.data = b.dq.data(); },
       "dq: outputs must not overlap, got memory shared with dk"},
      {"dv over dy", [](BackwardArgs& a, Buffers& b) { a.dv.data = b.dy.data(); },
       "dv: an output must not overlap an input, got memory shared with dy"},
      {"dh0 over h0", [](BackwardArgs& a, Buffers& b) { a.dh0.data = b.h0.data(); },
       "dh0: an output must not overlap an input, got memory shared with h0"},
  };
  for (const BackwardBreak& br : breaks) {
    SCOPED_TRACE(br.what);
    Buffers b;
    BackwardArgs a = backward_args(b);
    br.edit(a, b);
    expect_error([&] { backward(Variant::gla, a, {}); }, br.fragment, b);
  }
}

// The delta rule's strengths are finite: beta (kda), the erase and write gates b and w (gdn2).
TEST(BadInput, StrengthsMustBeFinite) {
  struct Strength {
    Variant variant;
    const char* name;
    std::vector<int64_t> shape;
    float value;
    std::string fragment;
  };
  const Strength strengths[] = {
      {Variant::kda, "beta", {B, S, N}, std::numeric_limits<float>::quiet_NaN(), "beta: expected finite values, got nan at [0, 2, 1]"},
      {Variant::gdn2, "b", {B, S, N, K}, std::numeric_limits<float>::infinity(), "b: expected finite values, got inf at [0, 2, 1, 0]"},
      {Variant::gdn2, "w", {B, S, N, V}, -std::numeric_limits<float>::infinity(), "w: expected finite values, got -inf at [0, 2, 1, 0]"},
  };
  for (const Strength& strength : strengths) {
    SCOPED_TRACE(strength.name);
    Buffers b;
    ForwardArgs a = forward_args(b);
    std::vector<float> beta(B * S * N, 0.5f), erase(B * S * N * K, 0.5f), write(B * S * N * V, 0.5f);
    if (strength.variant == Variant::kda) {
      a.beta = Tensor::contiguous(beta.data(), DType::f32, {B, S, N});
    } else {
      a.b = view4(erase, B, S, N, K);
      a.w = view4(write, B, S, N, V);
    }
    std::vector<float>& broken = strength.name == std::string("beta") ? beta : strength.name == std::string("b") ? erase : write;
    broken[(2 * N + 1) * (strength.shape.size() == 4 ? strength.shape[3] : 1)] = strength.value;
    expect_error([&] { forward(strength.variant, a, {}); }, strength.fragment, b);
  }
}

// ht may be the very memory of h0 (a state updated in place), and dh0 that of dht: the results
// are those of separate buffers. Any other overlap with them is refused.
TEST(BadInput, StatesUpdatedInPlace) {
  Buffers separate, in_place;
  for (Buffers* b : {&separate, &in_place})
    for (size_t i = 0; i < b->h0.size(); ++i) b->h0[i] = b->dht[i] = 0.01f * float(i % 7);
  forward(Variant::gla, forward_args(separate), {});
  backward(Variant::gla, backward_args(separate), {});

  ForwardArgs f = forward_args(in_place);
  f.ht = f.h0;
  forward(Variant::gla, f, {});
  EXPECT_EQ(in_place.h0, separate.ht);
  EXPECT_EQ(in_place.y, separate.y);
  for (size_t i = 0; i < in_place.h0.size(); ++i) in_place.h0[i] = 0.01f * float(i % 7);
  BackwardArgs g = backward_args(in_place);
  g.dh0 = g.dht;
  backward(Variant::gla, g, {});
  EXPECT_EQ(in_place.dht, separate.dh0);
  EXPECT_EQ(in_place.dq, separate.dq);

  Buffers shifted;
  std::vector<float> states(2 * shifted.h0.size(), 0.f);
  ForwardArgs h = forward_args(shifted);
  h.h0 = view4(states, B, N, K, V);
  h.ht.data = states.data() + V;  // one row on
  expect_error([&] { forward(Variant::gla, h, {}); },
               "ht: an output must not overlap an input, got memory shared with h0 (it may be the very same view as "
               "h0, updated in place)",
               shifted);
}

// Options::check_values = false skips the scan of gates, strengths and states (the caller vouches
// for them): a gate above 0 then runs instead of being refused.
TEST(BadInput, ValueScanCanBeSkipped) {
  Buffers b;
  b.g[3] = 0.01f;
  const ForwardArgs a = forward_args(b);
  EXPECT_THROW(forward(Variant::gla, a, {}), Error);
  Options unchecked;
  unchecked.check_values = false;
  forward(Variant::gla, a, unchecked);
  EXPECT_FALSE(b.outputs_untouched());
}

TEST(BadInput, UnknownVariant) {
  EXPECT_THROW(parse_variant("gated_lightning"), Error);
  EXPECT_EQ(parse_variant("mamba2"), Variant::mamba2);
}

// The stride of an axis of one element is never used: any stride there, negative or not 1 on the
// last axis, is taken and gives the contiguous call's results (PyTorch leaves such strides, e.g. on
// the transpose of a [.., 1, K] state). A last axis of two elements with stride 2 is still refused.
TEST(BadInput, AxesOfOneElementTakeAnyStride) {
  constexpr int64_t S1 = 5, K1 = 16;  // B = 1, N = 1, V = 1
  std::vector<float> q(S1 * K1), k(S1 * K1), v(S1), g(S1 * K1), h0(K1), dy(S1), dht(K1);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = 0.1f * float(i % 5) - 0.2f;
    k[i] = 0.05f * float(i % 7) - 0.1f;
    g[i] = -0.01f * float(1 + i % 3);
  }
  for (size_t i = 0; i < v.size(); ++i) v[i] = dy[i] = 0.3f - 0.1f * float(i);
  for (size_t i = 0; i < h0.size(); ++i) h0[i] = dht[i] = 0.02f * float(i % 4);
  struct Out {
    std::vector<float> y = std::vector<float>(S1), ht = std::vector<float>(K1), dq = std::vector<float>(S1 * K1),
                       dk = dq, dv = y, dg = dq, dh0 = ht;
  };
  const auto run = [&](Out& o, bool odd) {
    const auto t = [odd](float* data, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> odd_stride) {
      return odd ? Tensor::strided(data, DType::f32, shape, odd_stride) : Tensor::contiguous(data, DType::f32, shape);
    };
    // Odd strides on every axis of one element: B (axis 0, negative), N (a middle axis, negative or
    // odd) and V (the last axis, 0, 7 or negative); the axes of more elements as packed.
    Inputs in;
    in.q = t(q.data(), {1, S1, 1, K1}, {-3, K1, -1000, 1});
    in.k = t(k.data(), {1, S1, 1, K1}, {0, K1, 5, 1});
    in.v = t(v.data(), {1, S1, 1, 1}, {-1, 1, 3, 7});
    in.g = t(g.data(), {1, S1, 1, K1}, {123, K1, -K1, 1});
    in.h0 = t(h0.data(), {1, 1, K1, 1}, {-K1, -7, 1, -1});
    ForwardArgs f{in};
    f.y = t(o.y.data(), {1, S1, 1, 1}, {-2, 1, -1, 0});
    f.ht = t(o.ht.data(), {1, 1, K1, 1}, {7, 3, 1, 2});
    forward(Variant::gla, f, {});
    BackwardArgs b{in};
    b.dy = t(dy.data(), {1, S1, 1, 1}, {-5, 1, 9, -2});
    b.dht = t(dht.data(), {1, 1, K1, 1}, {0, -1, 1, 4});
    b.dq = t(o.dq.data(), {1, S1, 1, K1}, {-1, K1, 2, 1});
    b.dk = t(o.dk.data(), {1, S1, 1, K1}, {1, K1, -2, 1});
    b.dv = t(o.dv.data(), {1, S1, 1, 1}, {3, 1, 3, 3});
    b.dg = t(o.dg.data(), {1, S1, 1, K1}, {-9, K1, 0, 1});
    b.dh0 = t(o.dh0.data(), {1, 1, K1, 1}, {2, 2, 1, 2});
    backward(Variant::gla, b, {});
  };
  Out dense, odd;
  run(dense, false);
  run(odd, true);
  for (const auto member : {&Out::y, &Out::ht, &Out::dq, &Out::dk, &Out::dv, &Out::dg, &Out::dh0}) {
    for (float x : dense.*member) ASSERT_TRUE(std::isfinite(x));
    EXPECT_EQ(dense.*member, odd.*member);
  }

  // The same strides on axes of two elements are still refused.
  Buffers b;
  ForwardArgs two = forward_args(b);
  two.q = Tensor::strided(b.q.data(), DType::f32, {B, S, N * K / 2, 2}, {S * N * K, N * K, 2, 2});
  two.k = two.q;
  expect_error([&] { forward(Variant::gla, two, {}); }, "q: the last axis must be contiguous (stride 1), got stride 2",
               b);
  ForwardArgs negative = forward_args(b);
  negative.q.stride[2] = -K;  // N = 2
  expect_error([&] { forward(Variant::gla, negative, {}); }, "q: negative stride on axis Nq", b);
}

TEST(BadInput, ValidArgumentsPass) {
  Buffers b;
  forward(Variant::gla, forward_args(b), {});
  backward(Variant::gla, backward_args(b), {});
  for (const auto* t : {&b.y, &b.ht, &b.dq, &b.dk, &b.dv, &b.dg, &b.dh0})
    for (float x : *t) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace flat

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
  Options bad_threads;
  bad_threads.threads = -1;
  const std::vector<ForwardBreak> breaks = {
      {"q rank", [](ForwardArgs& a, Buffers& b) { a.q = Tensor::contiguous(b.q.data(), DType::f32, {B, S, N * K}); },
       "q: expected rank 4 [B, S, Nq, K], got rank 3 [1, 5, 32]"},
      {"k width", [](ForwardArgs& a, Buffers& b) { a.k = view4(b.k, B, S, 1, 2 * K); },
       "k: expected shape [B=1, S=5, Nk, K=16], got [1, 5, 1, 32]"},
      {"v width", [](ForwardArgs& a, Buffers&) { a.v.shape[3] = 300; }, "v: V = 300 is not supported"},
      {"q width", [](ForwardArgs& a, Buffers&) { a.q.shape[3] = 257; }, "q: K = 257 is not supported"},
      {"S = 0", [](ForwardArgs& a, Buffers&) { a.q.shape[1] = 0; }, "q: axis S must be at least 1, got 0"},
      {"heads", [](ForwardArgs& a, Buffers&) { a.k.shape[2] = 3; },
       "q: head count Nq = 2 does not divide N = 3"},
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
      {"threads", [](ForwardArgs&, Buffers&) {}, "options.threads", Variant::gla, bad_threads},
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
  };
  for (const BackwardBreak& br : breaks) {
    SCOPED_TRACE(br.what);
    Buffers b;
    BackwardArgs a = backward_args(b);
    br.edit(a, b);
    expect_error([&] { backward(Variant::gla, a, {}); }, br.fragment, b);
  }
}

TEST(BadInput, UnknownVariant) {
  EXPECT_THROW(parse_variant("gated_lightning"), Error);
  EXPECT_EQ(parse_variant("mamba2"), Variant::mamba2);
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

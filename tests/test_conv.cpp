// The short convolution: the float64 oracle against central finite differences; every set of
// leaves this CPU runs against the oracle over taps, lengths around the sequence block, odd
// channel counts, strided views, bias, states and both activations and dtypes; bitwise
// determinism for any thread count; state passing across calls; and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "checks.h"
#include "cpu/conv.h"
#include "harness.h"
#include "test_conv_harness.h"
#include "tested_targets.h"

namespace flat::test {
namespace {

// ---- The oracle against finite differences -------------------------------------------------

// L = sum dy * y + sum dstate * state, in float64.
double loss(const ref::ConvProblem& pr, const ref::ConvInputs& in, const std::vector<double>& dy,
            const std::vector<double>& dstate) {
  const ref::ConvOutputs out = ref::conv_forward(pr, in);
  double l = 0;
  for (size_t i = 0; i < dy.size(); ++i) l += dy[i] * out.y[i];
  for (size_t i = 0; i < dstate.size(); ++i) l += dstate[i] * out.state[i];
  return l;
}

void expect_gradient(const std::string& name, std::vector<double>& param, const std::vector<double>& analytic,
                     const std::function<double()>& f) {
  ASSERT_EQ(param.size(), analytic.size()) << name;
  const double h = 1e-5;
  for (size_t i = 0; i < param.size(); ++i) {
    const double saved = param[i];
    param[i] = saved + h;
    const double up = f();
    param[i] = saved - h;
    const double down = f();
    param[i] = saved;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[i], numeric, 1e-7 * (1 + std::abs(numeric))) << name << "[" << i << "]";
  }
}

TEST(ConvOracle, GradientsMatchFiniteDifferences) {
  for (int W : {1, 3, 4}) {
    for (Activation activation : {Activation::silu, Activation::none}) {
      ConvCase c;
      c.B = 2;
      c.S = W == 4 ? 2 : 6;  // S < W-1: the final state reaches into state0
      c.C = 3;
      c.W = W;
      c.activation = activation;
      c.state0 = c.dstate = W > 1;
      ConvData d(c);
      ref::ConvInputs in = d.in;
      for (double& x : in.x) x *= 2.5;  // reach the SiLU's curved part
      const ref::ConvGradients g = ref::conv_backward(d.problem, in, d.dy, d.dstate);
      const auto f = [&] { return loss(d.problem, in, d.dy, d.dstate); };
      SCOPED_TRACE(c.name());
      expect_gradient("dx", in.x, g.dx, f);
      expect_gradient("dweight", in.weight, g.dweight, f);
      expect_gradient("dbias", in.bias, g.dbias, f);
      if (W > 1) expect_gradient("dstate0", in.state0, g.dstate0, f);
    }
  }
}

TEST(ConvOracle, ForwardByHand) {
  // W = 3, one channel: y_t = b + w0 x_{t-2} + w1 x_{t-1} + w2 x_t, state0 = (x_{-2}, x_{-1}).
  ref::ConvProblem pr;
  pr.S = 2;
  pr.W = 3;
  pr.activation = Activation::none;
  ref::ConvInputs in;
  in.x = {1, 2};
  in.weight = {10, 100, 1000};
  in.bias = {0.5};
  in.state0 = {3, 4};
  const ref::ConvOutputs out = ref::conv_forward(pr, in);
  EXPECT_EQ(out.y, (std::vector<double>{0.5 + 30 + 400 + 1000, 0.5 + 40 + 100 + 2000}));
  EXPECT_EQ(out.state, (std::vector<double>{1, 2}));
  pr.S = 1;
  in.x = {1};
  EXPECT_EQ(ref::conv_forward(pr, in).state, (std::vector<double>{4, 1}));
}

// ---- Kernels against the oracle -------------------------------------------------------------

struct Tolerances {
  double outputs, gradients;
};

Tolerances tolerances(const ConvCase& c) {
  const bool bf16 = c.x_dtype == DType::bf16 || c.y_dtype == DType::bf16;
  return bf16 ? Tolerances{5e-3, 1e-2} : Tolerances{1e-5, 1e-5};
}

void expect_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                  double tol) {
  const double error = relative_error(got, want);
  EXPECT_TRUE(error <= tol) << what << ": relative L2 error " << error << " > " << tol;  // fails on NaN
}

std::vector<ConvCase> sweep() {
  std::vector<ConvCase> cases;
  const int block = cpu::kConvSeqBlock;
  for (int W : {1, 2, 3, 4, 8}) {
    std::set<int> lengths{1, W - 1, W, block - 1, block + 1, 1000};
    lengths.erase(0);
    for (int S : lengths) {
      const bool state = W > 1;
      ConvCase a;  // fp32, everything on, strided, odd C
      a.W = W;
      a.S = S;
      a.B = 2;
      a.C = 37;
      a.state0 = a.state = a.dstate = a.dstate0 = state;
      a.strided = true;
      a.seed = uint64_t(S * 10 + W);
      cases.push_back(a);
      ConvCase b = a;  // bf16, plain
      b.x_dtype = b.y_dtype = DType::bf16;
      b.activation = Activation::none;
      b.bias = false;
      b.state0 = b.state = b.dstate = b.dstate0 = false;
      b.strided = false;
      b.B = 1;
      b.C = 19;
      b.threads = 3;
      cases.push_back(b);
      ConvCase m = a;  // bf16 x, fp32 y: state0 without dstate, dstate0 wanted
      m.x_dtype = DType::bf16;
      m.dstate = false;
      m.threads = 1;
      cases.push_back(m);
      ConvCase n = a;  // fp32 x, bf16 y, no bias, no state0 but its gradient and the final state's
      n.y_dtype = DType::bf16;
      n.bias = false;
      n.state0 = false;
      n.activation = Activation::none;
      n.C = 5;
      cases.push_back(n);
    }
  }
  // Several channel blocks of 512 and a tail, two batches.
  ConvCase wide;
  wide.B = 2;
  wide.S = 300;
  wide.C = 600;
  wide.state0 = wide.state = wide.dstate = wide.dstate0 = true;
  wide.strided = true;
  cases.push_back(wide);
  wide.x_dtype = wide.y_dtype = DType::bf16;
  cases.push_back(wide);
  return cases;
}

// The public API and every kernel set this CPU has, against the oracle.
void expect_matches_oracle(const ConvCase& c) {
  const ConvData d(c);
  const ref::ConvOutputs want = ref::conv_forward(d.problem, d.in);
  const ref::ConvGradients dwant = ref::conv_backward(d.problem, d.in, d.dy, d.dstate);
  const Tolerances tol = tolerances(c);
  std::vector<const cpu::Target*> runs{nullptr};  // the public API first
  for (const cpu::Target* target : test::supported_targets()) runs.push_back(target);
  for (const cpu::Target* target : runs) {
    SCOPED_TRACE(target ? target->name : "public API");
    const ConvResults got = run_conv(d, true, c.threads, target);
    expect_close("y", got.y, want.y, tol.outputs);
    if (c.state) expect_close("state", got.state, want.state, tol.outputs);
    expect_close("dx", got.dx, dwant.dx, tol.gradients);
    expect_close("dweight", got.dweight, dwant.dweight, tol.gradients);
    if (c.bias) expect_close("dbias", got.dbias, dwant.dbias, tol.gradients);
    if (c.dstate0) expect_close("dstate0", got.dstate0, dwant.dstate0, tol.gradients);
    EXPECT_TRUE(got.padding_intact) << "wrote outside the strided views";
  }
}

class ConvKernels : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvKernels, MatchOracle) { expect_matches_oracle(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Sweep, ConvKernels, ::testing::ValuesIn(sweep()),
                         [](const ::testing::TestParamInfo<ConvCase>& info) { return info.param.name(); });

// W = 5, 6 and 7 (fewer positions per group than W <= 4) over two sequence blocks.
TEST(Conv, OtherTapCounts) {
  for (int W : {5, 6, 7})
    for (DType dtype : {DType::f32, DType::bf16}) {
      ConvCase c;
      c.x_dtype = c.y_dtype = dtype;
      c.B = 2;
      c.S = cpu::kConvSeqBlock + 45;
      c.C = 35;
      c.W = W;
      c.state0 = c.state = c.dstate = c.dstate0 = true;
      SCOPED_TRACE(c.name());
      expect_matches_oracle(c);
    }
}

// Pre-activations in the hundreds: the SiLU's tails (sigmoid 0 or 1 to fp32 precision, its
// exponential clamped) stay finite and accurate.
TEST(Conv, LargeActivations) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    ConvCase c;
    c.x_dtype = c.y_dtype = dtype;
    c.B = 1;
    c.S = 200;
    c.C = 40;
    c.x_scale = 300.0;
    SCOPED_TRACE(c.name());
    expect_matches_oracle(c);
  }
}

// The final state is exactly the last W-1 inputs, as stored (no rounding).
TEST(Conv, FinalStateIsTheLastInputs) {
  ConvCase c;
  c.x_dtype = DType::bf16;
  c.B = 2;
  c.S = 9;
  c.C = 21;
  c.W = 4;
  c.state0 = c.state = true;
  const ConvData d(c);
  EXPECT_EQ(run_conv(d, false, 2, nullptr).state, ref::conv_forward(d.problem, d.in).state);
}

// ---- Determinism ----------------------------------------------------------------------------

TEST(Conv, SameBitsForAnyThreadCount) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    ConvCase c;
    c.x_dtype = c.y_dtype = dtype;
    c.B = 3;
    c.S = 700;
    c.C = 70;
    c.state0 = c.state = c.dstate = c.dstate0 = true;
    const ConvData d(c);
    const ConvResults one = run_conv(d, true, 1, nullptr);
    for (int threads : {2, 3, 5}) {
      const ConvResults other = run_conv(d, true, threads, nullptr);
      EXPECT_EQ(one.y, other.y) << threads;
      EXPECT_EQ(one.state, other.state) << threads;
      EXPECT_EQ(one.dx, other.dx) << threads;
      EXPECT_EQ(one.dweight, other.dweight) << threads;
      EXPECT_EQ(one.dbias, other.dbias) << threads;
      EXPECT_EQ(one.dstate0, other.dstate0) << threads;
    }
  }
}

// ---- State passing across calls -------------------------------------------------------------

// A sequence run as two calls, the first call's final state passed as the second's state0 (in
// place: state0 and state are one buffer), gives the outputs of one call.
TEST(Conv, ChunkedPrefillMatchesOneCall) {
  const int B = 2, S = 50, C = 33, W = 4, split = 2;  // the first call shorter than W-1
  std::vector<float> x(size_t(B) * S * C), weight(size_t(C) * W), bias(static_cast<size_t>(C));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i)));
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = float(std::cos(0.91 * double(i)));
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.1f * float(i % 5);
  const Tensor w = Tensor::contiguous(weight.data(), DType::f32, {C, W});
  const Tensor b = Tensor::contiguous(bias.data(), DType::f32, {C});

  std::vector<float> y_once(x.size()), state_once(size_t(B) * C * (W - 1));
  ConvArgs once;
  once.x = Tensor::contiguous(x.data(), DType::f32, {B, S, C});
  once.weight = w;
  once.bias = b;
  once.y = Tensor::contiguous(y_once.data(), DType::f32, {B, S, C});
  once.state = Tensor::contiguous(state_once.data(), DType::f32, {B, C, W - 1});
  conv_forward(once);

  std::vector<float> y_parts(x.size()), state(size_t(B) * C * (W - 1), 0.0f);
  const Tensor state_view = Tensor::contiguous(state.data(), DType::f32, {B, C, W - 1});
  for (auto [t0, t1] : {std::pair{0, split}, std::pair{split, S}}) {
    ConvArgs part;
    part.x = Tensor::strided(x.data() + size_t(t0) * C, DType::f32, {B, t1 - t0, C}, {int64_t(S) * C, C, 1});
    part.weight = w;
    part.bias = b;
    part.state0 = state_view;
    part.state = state_view;
    part.y = Tensor::strided(y_parts.data() + size_t(t0) * C, DType::f32, {B, t1 - t0, C}, {int64_t(S) * C, C, 1});
    conv_forward(part);
  }
  EXPECT_EQ(y_parts, y_once);
  EXPECT_EQ(state, state_once);
}

// ---- Bad input ------------------------------------------------------------------------------

constexpr int64_t kB = 2, kS = 6, kC = 20, kW = 4;

struct Buffers {
  std::vector<float> x = std::vector<float>(kB * kS * kC, 0.5f), weight = std::vector<float>(kC * kW, 0.25f),
                     bias = std::vector<float>(kC, 0.1f), state0 = std::vector<float>(kB * kC * (kW - 1), 0.f), dy = x,
                     dstate = state0;
  std::vector<uint16_t> half = std::vector<uint16_t>(kB * kS * kC, 0);
  // Outputs, poisoned.
  std::vector<float> y = nan(x.size()), state = nan(state0.size()), dx = nan(x.size()), dweight = nan(weight.size()),
                     dbias = nan(bias.size()), dstate0 = nan(state0.size());

  static std::vector<float> nan(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }
  bool outputs_untouched() const {
    for (const auto* t : {&y, &state, &dx, &dweight, &dbias, &dstate0})
      for (float v : *t)
        if (!std::isnan(v)) return false;
    return true;
  }
};

Tensor f32(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(v.data(), DType::f32, shape);
}

ConvInputs conv_inputs(Buffers& b) {
  ConvInputs in;
  in.x = f32(b.x, {kB, kS, kC});
  in.weight = f32(b.weight, {kC, kW});
  in.bias = f32(b.bias, {kC});
  in.state0 = f32(b.state0, {kB, kC, kW - 1});
  return in;
}

ConvArgs forward_args(Buffers& b) {
  ConvArgs a(conv_inputs(b));
  a.y = f32(b.y, {kB, kS, kC});
  a.state = f32(b.state, {kB, kC, kW - 1});
  return a;
}

ConvBackwardArgs backward_args(Buffers& b) {
  ConvBackwardArgs a(conv_inputs(b));
  a.dy = f32(b.dy, {kB, kS, kC});
  a.dstate = f32(b.dstate, {kB, kC, kW - 1});
  a.dx = f32(b.dx, {kB, kS, kC});
  a.dweight = f32(b.dweight, {kC, kW});
  a.dbias = f32(b.dbias, {kC});
  a.dstate0 = f32(b.dstate0, {kB, kC, kW - 1});
  return a;
}

TEST(ConvErrors, ValidArgumentsRun) {
  Buffers b;
  conv_forward(forward_args(b));
  conv_backward(backward_args(b));
  EXPECT_FALSE(std::isnan(b.y[0]));
  EXPECT_FALSE(std::isnan(b.dweight[0]));
}

struct Break {
  const char* what;
  std::function<void(Buffers&, ConvArgs&, ConvBackwardArgs&)> apply;
  const char* fragment;
};

std::vector<Break> breaks() {
  using F = ConvArgs;
  using G = ConvBackwardArgs;
  return {
      {"x missing", [](Buffers&, F& f, G& g) { f.x = g.x = Tensor{}; }, "flat: x: required tensor is missing"},
      {"x rank",
       [](Buffers& b, F& f, G& g) {
         f.x = g.x = f32(b.x, {kB, kS, kC, 1});
       },
       "flat: x: expected rank 3 [B, S, C], got rank 4 [2, 6, 20, 1]"},
      {"S < 0",
       [](Buffers& b, F& f, G& g) {
         f.x = g.x = Tensor::strided(b.x.data(), DType::f32, {kB, -1, kC}, {kS * kC, kC, 1});
       },
       "flat: x: axis S must be at least 0, got -1"},
      {"x null", [](Buffers&, F& f, G& g) { f.x.data = g.x.data = nullptr; }, "flat: x: null data pointer"},
      {"x channel stride",
       [](Buffers& b, F& f, G& g) {
         f.x = g.x = Tensor::strided(b.x.data(), DType::f32, {kB, kS, kC / 2}, {kS * kC, kC, 2});
       },
       "flat: x: the last axis must be contiguous"},
      {"weight missing", [](Buffers&, F& f, G& g) { f.weight = g.weight = Tensor{}; },
       "flat: weight: required tensor is missing"},
      {"weight C",
       [](Buffers& b, F& f, G& g) {
         f.weight = g.weight = f32(b.weight, {kC - 1, kW});
       },
       "flat: weight: expected shape [C=20, W], got [19, 4]"},
      {"W = 9",
       [](Buffers& b, F& f, G& g) {
         f.weight = g.weight = f32(b.weight, {kC / 5, 9});
       },
       "flat: weight: W = 9 taps is not supported (1 to 8)"},
      {"W = 0",
       [](Buffers& b, F& f, G& g) {
         f.weight = g.weight = f32(b.weight, {kC, 0});
       },
       "flat: weight: axis W must be at least 1, got 0"},
      {"weight bf16",
       [](Buffers& b, F& f, G& g) {
         f.weight = g.weight = Tensor::contiguous(b.half.data(), DType::bf16, {kC, kW});
       },
       "flat: weight: expected dtype f32 (weights are fp32), got bf16"},
      {"bias shape", [](Buffers& b, F& f, G& g) { f.bias = g.bias = f32(b.bias, {kC - 2}); },
       "flat: bias: expected shape [C=20], got [18]"},
      {"state0 shape",
       [](Buffers& b, F& f, G& g) {
         f.state0 = g.state0 = f32(b.state0, {kB, kC, kW});
       },
       "flat: state0: expected shape [B=2, C=20, W-1=3], got [2, 20, 4]"},
      {"state0 with W = 1",
       [](Buffers& b, F& f, G& g) {
         f.weight = g.weight = f32(b.weight, {kC, 1});
         f.state0 = g.state0 = f32(b.state0, {kB, kC, 1});
       },
       "flat: state0: W = 1 keeps no state"},
      {"threads", [](Buffers&, F&, G&) {}, "flat: context.threads: expected 0 (all) or more, got -1"},
  };
}

TEST(ConvErrors, BadInputsNamedAndNothingWritten) {
  for (const Break& brk : breaks()) {
    SCOPED_TRACE(brk.what);
    Buffers b;
    ConvArgs f = forward_args(b);
    ConvBackwardArgs g = backward_args(b);
    brk.apply(b, f, g);
    ExecutionContext context;
    if (std::string(brk.what) == "threads") context.threads = -1;
    expect_error([&] { conv_forward(f, {}, context); }, brk.fragment, b);
    expect_error([&] { conv_backward(g, {}, context); }, brk.fragment, b);
  }
}

TEST(ConvErrors, BadOutputsNamedAndNothingWritten) {
  struct OutBreak {
    const char* what;
    std::function<void(Buffers&, ConvArgs&, ConvBackwardArgs&)> apply;
    const char* fragment;
    bool forward;
  };
  const std::vector<OutBreak> cases = {
      {"y missing", [](Buffers&, ConvArgs& f, ConvBackwardArgs&) { f.y = Tensor{}; },
       "flat: y: required tensor is missing", true},
      {"y shape",
       [](Buffers& b, ConvArgs& f, ConvBackwardArgs&) {
         f.y = f32(b.y, {kB, kS - 1, kC});
       },
       "flat: y: expected shape [B=2, S=6, C=20], got [2, 5, 20]", true},
      {"state bf16",
       [](Buffers& b, ConvArgs& f, ConvBackwardArgs&) {
         f.state = Tensor::contiguous(b.half.data(), DType::bf16, {kB, kC, kW - 1});
       },
       "flat: state: expected dtype f32 (states are fp32), got bf16", true},
      {"dy shape",
       [](Buffers& b, ConvArgs&, ConvBackwardArgs& g) {
         g.dy = f32(b.dy, {kB, kS, kC - 1});
       },
       "flat: dy: expected shape [B=2, S=6, C=20], got [2, 6, 19]", false},
      {"dstate shape",
       [](Buffers& b, ConvArgs&, ConvBackwardArgs& g) {
         g.dstate = f32(b.dstate, {kB, kC});
       },
       "flat: dstate: expected rank 3", false},
      {"dx dtype",
       [](Buffers& b, ConvArgs&, ConvBackwardArgs& g) {
         g.dx = Tensor::contiguous(b.half.data(), DType::bf16, {kB, kS, kC});
       },
       "flat: dx: expected dtype f32 (the dtype of x), got bf16", false},
      {"dx missing", [](Buffers&, ConvArgs&, ConvBackwardArgs& g) { g.dx = Tensor{}; },
       "flat: dx: required tensor is missing", false},
      {"dweight missing", [](Buffers&, ConvArgs&, ConvBackwardArgs& g) { g.dweight = Tensor{}; },
       "flat: dweight: required tensor is missing", false},
      {"dweight shape",
       [](Buffers& b, ConvArgs&, ConvBackwardArgs& g) {
         g.dweight = f32(b.dweight, {kW, kC});
       },
       "flat: dweight: expected shape [C=20, W=4], got [4, 20]", false},
      {"dweight null", [](Buffers&, ConvArgs&, ConvBackwardArgs& g) { g.dweight.data = nullptr; },
       "flat: dweight: null data pointer", false},
      {"dbias missing", [](Buffers&, ConvArgs&, ConvBackwardArgs& g) { g.dbias = Tensor{}; },
       "flat: dbias: required tensor is missing", false},
      {"dbias without bias", [](Buffers&, ConvArgs&, ConvBackwardArgs& g) { g.bias = Tensor{}; },
       "flat: dbias: given, but there is no bias", false},
      {"dstate0 shape",
       [](Buffers& b, ConvArgs&, ConvBackwardArgs& g) {
         g.dstate0 = f32(b.dstate0, {kB, kC - 1, kW - 1});
       },
       "flat: dstate0: expected shape [B=2, C=20, W-1=3], got [2, 19, 3]", false},
      {"y over x", [](Buffers& b, ConvArgs& f, ConvBackwardArgs&) { f.y = f32(b.x, {kB, kS, kC}); },
       "flat: y: an output must not overlap an input, got memory shared with x", true},
      {"y with stride 0",
       [](Buffers& b, ConvArgs& f, ConvBackwardArgs&) {
         f.y = Tensor::strided(b.y.data(), DType::f32, {kB, kS, kC}, {kS * kC, 0, 1});
       },
       "flat: y: an output's elements must not overlap, got a stride of 0", true},
      {"state over y", [](Buffers& b, ConvArgs& f, ConvBackwardArgs&) { f.state = f32(b.y, {kB, kC, kW - 1}); },
       "flat: y: outputs must not overlap, got memory shared with state", true},
      {"state over state0 shifted",
       [](Buffers& b, ConvArgs& f, ConvBackwardArgs&) {
         f.state = Tensor::strided(b.state0.data() + 1, DType::f32, {kB, kC, kW - 1}, {kC * (kW - 1), kW - 1, 1});
       },
       "flat: state: an output must not overlap an input, got memory shared with state0 (it may be the very same "
       "view as state0, updated in place)",
       true},
      {"dx over dy", [](Buffers& b, ConvArgs&, ConvBackwardArgs& g) { g.dx = f32(b.dy, {kB, kS, kC}); },
       "flat: dx: an output must not overlap an input, got memory shared with dy", false},
      {"dbias inside dweight", [](Buffers& b, ConvArgs&, ConvBackwardArgs& g) { g.dbias = f32(b.dweight, {kC}); },
       "flat: dweight: outputs must not overlap, got memory shared with dbias", false},
  };
  for (const OutBreak& brk : cases) {
    SCOPED_TRACE(brk.what);
    Buffers b;
    ConvArgs f = forward_args(b);
    ConvBackwardArgs g = backward_args(b);
    brk.apply(b, f, g);
    if (brk.forward) expect_error([&] { conv_forward(f); }, brk.fragment, b);
    else expect_error([&] { conv_backward(g); }, brk.fragment, b);
  }
}

TEST(ConvErrors, ActivationNames) {
  EXPECT_EQ(parse_activation("silu"), Activation::silu);
  EXPECT_EQ(parse_activation("none"), Activation::none);
  EXPECT_THROW(parse_activation("relu"), Error);
}

}  // namespace
}  // namespace flat::test

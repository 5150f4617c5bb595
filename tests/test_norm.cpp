// The output norm and gate: the float64 oracle against central finite differences; the public
// API and every target's leaves against the oracle over widths around the vector width, both
// orders of norm and gate, every activation, no gate, mixed dtypes and strided views (the gate a
// column block of a wider projection); large gates; zero rows; bitwise determinism for any
// thread count; and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "checks.h"
#include "cpu/norm.h"
#include "cpu/targets.h"
#include "harness.h"
#include "ref/norm_reference.h"
#include "test_norm_harness.h"
#include "tested_targets.h"

namespace flat::test {
namespace {

// A [B, S, N, D] tensor's storage and view: dense, or (strided) with gaps of 3 elements after each
// head, 5 after each position and 7 after each batch, all NaN-poisoned.
struct Rows {
  Buffer buffer;
  int64_t sn, ss, sb;
  const NormCase& c;

  Rows(const NormCase& cs, DType dtype)
      : buffer(dtype, 0), sn(cs.D + (cs.strided ? 3 : 0)), ss(0), sb(0), c(cs) {
    ss = sn * c.N + (c.strided ? 5 : 0);
    sb = ss * c.S + (c.strided ? 7 : 0);
    buffer = Buffer(dtype, size_t(sb * c.B));
  }
  size_t at(int64_t row, int d) const {
    const int64_t n = row % c.N, s = (row / c.N) % c.S, b = row / (int64_t(c.N) * c.S);
    return size_t(b * sb + s * ss + n * sn + d);
  }
  Tensor view() { return Tensor::strided(buffer.data(), buffer.dtype, {c.B, c.S, c.N, c.D}, {sb, ss, sn, 1}); }
  // The tensor's elements in row order (dense), as double.
  std::vector<double> dense() const {
    std::vector<double> out(size_t(rows_of(c)) * size_t(c.D));
    for (int64_t r = 0; r < rows_of(c); ++r)
      for (int d = 0; d < c.D; ++d) out[size_t(r) * size_t(c.D) + size_t(d)] = buffer.get(at(r, d));
    return out;
  }
  void fill(const std::vector<double>& values) {
    for (int64_t r = 0; r < rows_of(c); ++r)
      for (int d = 0; d < c.D; ++d) buffer.set(at(r, d), values[size_t(r) * size_t(c.D) + size_t(d)]);
  }
  // Every element outside the view still NaN.
  bool padding_intact() const {
    std::vector<bool> inside(buffer.size(), false);
    for (int64_t r = 0; r < rows_of(c); ++r)
      for (int d = 0; d < c.D; ++d) inside[at(r, d)] = true;
    for (size_t i = 0; i < buffer.size(); ++i)
      if (!inside[i] && !buffer.is_nan(i)) return false;
    return true;
  }
};

struct NormResults {
  std::vector<double> y, dx, dg, dweight;
  bool padding_intact = true;
};

// Forward and backward on poisoned buffers: through the public API when `target` is null, else
// through the drivers on that target's leaves.
NormResults run_norm(const NormData& d, int threads, const cpu::Target* target) {
  const NormCase& c = d.c;
  Rows x(c, c.x_dtype), g(c, c.g_dtype), y(c, c.y_dtype), dy(c, c.y_dtype), dx(c, c.x_dtype), dg(c, c.g_dtype);
  x.fill(d.in.x);
  if (c.gate) g.fill(d.in.g);
  dy.fill(d.dy);
  std::vector<float> weight(d.in.weight.begin(), d.in.weight.end());
  std::vector<float> dweight(weight.size(), std::numeric_limits<float>::quiet_NaN());
  const auto weight_view = [&](std::vector<float>& w) {
    return c.weight_per_head ? Tensor::contiguous(w.data(), DType::f32, {c.N, c.D})
                             : Tensor::contiguous(w.data(), DType::f32, {c.D});
  };

  NormGateInputs in;
  in.x = x.view();
  if (c.gate) in.g = g.view();
  in.weight = weight_view(weight);
  NormGateOptions options;
  options.activation = c.activation;
  options.norm_before_gate = c.norm_before_gate;
  ExecutionContext context;
  context.threads = threads;

  NormGateArgs fa(in);
  fa.y = y.view();
  NormGateBackwardArgs ba(in);
  ba.dy = dy.view();
  ba.dx = dx.view();
  if (c.gate) ba.dg = dg.view();
  ba.dweight = weight_view(dweight);
  if (target) {
    const cpu::Run run{*target, {threads}};
    cpu::norm_gate_forward(describe_norm_gate_forward(fa, options), run);
    cpu::norm_gate_backward(describe_norm_gate_backward(ba, options), run);
  } else {
    norm_gate_forward(fa, options, context);
    norm_gate_backward(ba, options, context);
  }
  NormResults out;
  out.y = y.dense();
  out.dx = dx.dense();
  if (c.gate) out.dg = dg.dense();
  out.dweight.assign(dweight.begin(), dweight.end());
  out.padding_intact = y.padding_intact() && dx.padding_intact() && (!c.gate || dg.padding_intact());
  return out;
}

// ---- The oracle against finite differences -------------------------------------------------

TEST(NormGateOracle, GradientsMatchFiniteDifferences) {
  for (bool gate : {true, false})
    for (Activation activation : {Activation::silu, Activation::sigmoid, Activation::none})
      for (bool norm_before_gate : {true, false}) {
        if (!gate && (activation != Activation::silu || !norm_before_gate)) continue;
        NormCase c;
        c.B = 1;
        c.S = 2;
        c.N = 1;
        c.D = 5;
        c.gate = gate;
        c.activation = activation;
        c.norm_before_gate = norm_before_gate;
        NormData d(c);
        SCOPED_TRACE(c.name());
        const ref::NormGateGradients g = ref::norm_gate_backward(d.problem, d.in, d.dy);
        const auto loss = [&] {
          const std::vector<double> y = ref::norm_gate_forward(d.problem, d.in);
          double l = 0;
          for (size_t i = 0; i < y.size(); ++i) l += d.dy[i] * y[i];
          return l;
        };
        const auto check = [&](const char* name, std::vector<double>& param, const std::vector<double>& analytic) {
          for (size_t i = 0; i < param.size(); ++i) {
            const double saved = param[i], h = 1e-6;
            param[i] = saved + h;
            const double up = loss();
            param[i] = saved - h;
            const double down = loss();
            param[i] = saved;
            const double numeric = (up - down) / (2 * h);
            EXPECT_NEAR(analytic[i], numeric, 1e-6 * (1 + std::abs(numeric))) << name << "[" << i << "]";
          }
        };
        check("dx", d.in.x, g.dx);
        check("dweight", d.in.weight, g.dweight);
        if (gate) check("dg", d.in.g, g.dg);
      }
}

TEST(NormGateOracle, ForwardByHand) {
  // One row x = (3, 4), no gate, weight (1, 2), eps 0: rms = sqrt(12.5), y = x / rms * w.
  ref::NormGateProblem p;
  p.D = 2;
  p.eps = 0;
  ref::NormGateInputs in;
  in.x = {3, 4};
  in.weight = {1, 2};
  const std::vector<double> y = ref::norm_gate_forward(p, in);
  EXPECT_DOUBLE_EQ(y[0], 3 / std::sqrt(12.5));
  EXPECT_DOUBLE_EQ(y[1], 8 / std::sqrt(12.5));
  // A sigmoid gate of 0 halves it (norm first); gate first, the gate cancels in the norm.
  in.g = {0, 0};
  p.activation = Activation::sigmoid;
  EXPECT_DOUBLE_EQ(ref::norm_gate_forward(p, in)[1], 4 / std::sqrt(12.5));
  p.norm_before_gate = false;
  EXPECT_DOUBLE_EQ(ref::norm_gate_forward(p, in)[1], 8 / std::sqrt(12.5));
}

// ---- Kernels against the oracle -------------------------------------------------------------

void expect_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                  double tol) {
  const double error = relative_error(got, want);
  EXPECT_TRUE(error <= tol) << what << ": relative L2 error " << error << " > " << tol;  // fails on NaN
}

void expect_matches_oracle(const NormCase& c) {
  const NormData d(c);
  const std::vector<double> want = ref::norm_gate_forward(d.problem, d.in);
  const ref::NormGateGradients dwant = ref::norm_gate_backward(d.problem, d.in, d.dy);
  const bool bf16 = c.x_dtype == DType::bf16 || c.g_dtype == DType::bf16 || c.y_dtype == DType::bf16;
  const double out_tol = bf16 ? 5e-3 : 1e-5, grad_tol = bf16 ? 1e-2 : 1e-5;
  std::vector<const cpu::Target*> runs{nullptr};  // the public API first
  for (const cpu::Target* target : test::supported_targets()) runs.push_back(target);
  for (const cpu::Target* target : runs) {
    SCOPED_TRACE(target ? target->name : "public API");
    const NormResults got = run_norm(d, c.threads, target);
    expect_close("y", got.y, want, out_tol);
    expect_close("dx", got.dx, dwant.dx, grad_tol);
    if (c.gate) expect_close("dg", got.dg, dwant.dg, grad_tol);
    expect_close("dweight", got.dweight, dwant.dweight, grad_tol);
    EXPECT_TRUE(got.padding_intact) << "wrote outside the strided views";
  }
}

std::vector<NormCase> sweep() {
  std::vector<NormCase> cases;
  // Widths around the 16-lane vector, and rows over several blocks of kNormBlockElements.
  for (int D : {1, 7, 15, 16, 17, 64, 100, 128, 257}) {
    NormCase a;  // fp32, strided, silu after the norm
    a.D = D;
    a.S = int(2 * cpu::norm_block_rows(D) / (a.B * a.N)) / 2 + 3;
    a.strided = true;
    a.seed = uint64_t(D);
    cases.push_back(a);
    NormCase b = a;  // sigmoid, gate first, bf16 everywhere
    b.activation = Activation::sigmoid;
    b.norm_before_gate = false;
    b.x_dtype = b.g_dtype = b.y_dtype = DType::bf16;
    b.threads = 3;
    cases.push_back(b);
    NormCase n = a;  // no gate, bf16 x (the recurrence's bf16 output), fp32 y
    n.gate = false;
    n.x_dtype = DType::bf16;
    n.strided = false;
    n.threads = 1;
    cases.push_back(n);
    NormCase m = a;  // silu, gate first (Mamba-2: weights per head), fp32 x, bf16 gate and y
    m.norm_before_gate = false;
    m.weight_per_head = true;
    m.g_dtype = m.y_dtype = DType::bf16;
    cases.push_back(m);
    NormCase l = a;  // a linear gate (no activation), norm first
    l.activation = Activation::none;
    l.strided = false;
    cases.push_back(l);
  }
  return cases;
}

class NormGateKernels : public ::testing::TestWithParam<NormCase> {};

TEST_P(NormGateKernels, MatchOracle) { expect_matches_oracle(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Sweep, NormGateKernels, ::testing::ValuesIn(sweep()),
                         [](const ::testing::TestParamInfo<NormCase>& info) { return info.param.name(); });

// Gates in the hundreds: sigmoid 0 or 1 to fp32 precision, the exponential at its clamp or
// overflowing; everything stays finite and accurate.
TEST(NormGate, LargeGates) {
  for (Activation activation : {Activation::silu, Activation::sigmoid})
    for (bool norm_before_gate : {true, false}) {
      NormCase c;
      c.D = 40;
      c.activation = activation;
      c.norm_before_gate = norm_before_gate;
      c.g_scale = 300.0;
      SCOPED_TRACE(c.name());
      expect_matches_oracle(c);
    }
}

// A row of zeros normalises to zeros (eps keeps the division finite) with finite gradients.
TEST(NormGate, ZeroRows) {
  NormCase c;
  c.D = 33;
  c.x_scale = 0.0;
  SCOPED_TRACE(c.name());
  expect_matches_oracle(c);
  const NormResults got = run_norm(NormData(c), 2, nullptr);
  for (double v : got.y) EXPECT_EQ(v, 0.0);
}

// Rows at 1e20 and 1e30, whose fp32 sum of squares overflows, at 1e-20, whose squares underflow
// (eps then rules), and rows mixing the three within themselves: every output as the oracle's,
// through both orders of norm and gate, fp32 and bf16, on every target.
TEST(NormGate, HugeAndTinyMagnitudes) {
  for (double x_scale : {1e20, 1e30, 1e-20, 1.0})
    for (bool norm_before_gate : {true, false})
      for (DType dtype : {DType::f32, DType::bf16}) {
        NormCase c;
        c.D = 37;
        c.x_scale = x_scale;
        c.mixed_magnitudes = x_scale == 1.0;
        c.norm_before_gate = norm_before_gate;
        c.x_dtype = c.y_dtype = dtype;
        SCOPED_TRACE(c.name());
        expect_matches_oracle(c);
      }
}

TEST(NormGate, SameBitsForAnyThreadCount) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    NormCase c;
    c.x_dtype = c.g_dtype = c.y_dtype = dtype;
    c.B = 3;
    c.S = 300;
    c.N = 4;
    c.D = 64;
    const NormData d(c);
    const NormResults one = run_norm(d, 1, nullptr);
    for (int threads : {2, 3, 5}) {
      const NormResults other = run_norm(d, threads, nullptr);
      EXPECT_EQ(one.y, other.y) << threads;
      EXPECT_EQ(one.dx, other.dx) << threads;
      EXPECT_EQ(one.dg, other.dg) << threads;
      EXPECT_EQ(one.dweight, other.dweight) << threads;
    }
  }
}

// ---- Bad input ------------------------------------------------------------------------------

constexpr int64_t kB = 2, kS = 3, kN = 2, kD = 8, kElements = kB * kS * kN * kD;

struct Buffers {
  std::vector<float> x = std::vector<float>(kElements, 0.5f), g = x, weight = std::vector<float>(kD, 1.0f), dy = x;
  // Outputs, poisoned.
  std::vector<float> y = nan(kElements), dx = nan(kElements), dg = nan(kElements), dweight = nan(kD);

  static std::vector<float> nan(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }
  bool outputs_untouched() const {
    for (const auto* t : {&y, &dx, &dg, &dweight})
      for (float v : *t)
        if (!std::isnan(v)) return false;
    return true;
  }
};

Tensor rows4(std::vector<float>& v) { return Tensor::contiguous(v.data(), DType::f32, {kB, kS, kN, kD}); }

NormGateBackwardArgs good_backward(Buffers& b) {
  NormGateBackwardArgs a;
  a.x = rows4(b.x);
  a.g = rows4(b.g);
  a.weight = Tensor::contiguous(b.weight.data(), DType::f32, {kD});
  a.dy = rows4(b.dy);
  a.dx = rows4(b.dx);
  a.dg = rows4(b.dg);
  a.dweight = Tensor::contiguous(b.dweight.data(), DType::f32, {kD});
  return a;
}

TEST(NormGateErrors, NameTheTensorAndWriteNothing) {
  Buffers b;
  const auto forward = [&](const std::function<void(NormGateArgs&, NormGateOptions&)>& edit) {
    return [&b, edit] {
      NormGateArgs a(good_backward(b));
      a.y = rows4(b.y);
      NormGateOptions o;
      edit(a, o);
      norm_gate_forward(a, o);
    };
  };
  const auto backward = [&](const std::function<void(NormGateBackwardArgs&)>& edit) {
    return [&b, edit] {
      NormGateBackwardArgs a = good_backward(b);
      edit(a);
      norm_gate_backward(a);
    };
  };
  expect_error(forward([&](NormGateArgs& a, NormGateOptions&) { a.weight = Tensor::contiguous(b.weight.data(), DType::f32, {kD - 1}); }),
               "weight: expected shape [D=8], got [7]", b);
  std::vector<float> head_weights(3 * kD, 1.0f);
  expect_error(forward([&](NormGateArgs& a, NormGateOptions&) {
                 a.weight = Tensor::contiguous(head_weights.data(), DType::f32, {3, kD});
               }),
               "weight: expected shape [N=2, D=8], got [3, 8]", b);
  expect_error(forward([&](NormGateArgs& a, NormGateOptions&) {
                 a.weight = Tensor::strided(head_weights.data(), DType::f32, {kN, kD}, {kD + 1, 1});
               }),
               "weight: expected contiguous rows (stride 8 on axis N), got stride 9", b);
  expect_error(forward([&](NormGateArgs& a, NormGateOptions&) { a.weight.dtype = DType::bf16; }),
               "weight: expected dtype f32 (the norm's weight is fp32), got bf16", b);
  expect_error(forward([&](NormGateArgs& a, NormGateOptions&) {
                 a.g = Tensor::contiguous(b.g.data(), DType::f32, {kB, kS, kN * 2, kD / 2});
               }),
               "g: expected shape [B=2, S=3, N=2, D=8], got [2, 3, 4, 4]", b);
  expect_error(forward([](NormGateArgs&, NormGateOptions& o) { o.eps = 0.0f; }), "options.eps: expected a finite value > 0",
               b);
  expect_error(forward([](NormGateArgs&, NormGateOptions& o) { o.eps = std::numeric_limits<float>::quiet_NaN(); }),
               "options.eps", b);
  expect_error(forward([&](NormGateArgs& a, NormGateOptions&) { a.y = rows4(b.x); }), "y:", b);  // y over x
  expect_error(forward([&](NormGateArgs& a, NormGateOptions&) { a.y = Tensor(); }), "y: required tensor is missing", b);
  expect_error(backward([&](NormGateBackwardArgs& a) { a.dg = Tensor(); }), "dg: required tensor is missing", b);
  expect_error(backward([&](NormGateBackwardArgs& a) { a.g = Tensor(); }), "dg: given, but there is no g", b);
  expect_error(backward([&](NormGateBackwardArgs& a) { a.dx.dtype = DType::bf16; }),
               "dx: expected dtype f32 (the dtype of x), got bf16", b);
  expect_error(backward([&](NormGateBackwardArgs& a) { a.dweight = a.dx; }), "dweight: expected rank 1 [D=8], got rank 4", b);
  expect_error(backward([&](NormGateBackwardArgs& a) { a.dg = rows4(b.dx); }), "dx: outputs must not overlap, got memory shared with dg", b);
  expect_error(backward([&](NormGateBackwardArgs& a) { a.dx.device = Device::cuda; }), "on cuda", b);
}

TEST(ConvErrors, RefusesTheSigmoid) {
  std::vector<float> x(12, 0.f), w(8, 0.f), y(12, std::numeric_limits<float>::quiet_NaN());
  ConvArgs a;
  a.x = Tensor::contiguous(x.data(), DType::f32, {1, 3, 4});
  a.weight = Tensor::contiguous(w.data(), DType::f32, {4, 2});
  a.y = Tensor::contiguous(y.data(), DType::f32, {1, 3, 4});
  ConvOptions o;
  o.activation = Activation::sigmoid;
  try {
    conv_forward(a, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the convolution takes none or silu, got sigmoid"), std::string::npos)
        << e.what();
  }
  for (float v : y) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace flat::test

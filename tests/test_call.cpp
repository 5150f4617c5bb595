// The calls by name (flat/call.h), which every front end goes through: the same bits as the entry
// points they name, the options parsed once for all (typed values and command-line text alike),
// and a name or value that does not fit refused with the name, before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "checks.h"
#include "flat/call.h"

namespace flat {
namespace {

using test::expect_error;

constexpr int64_t B = 1, S = 21, N = 2, K = 16, V = 8, C = 6, W = 4;

std::vector<float> ramp(size_t n, float scale, float offset) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = offset + scale * std::sin(0.37f * float(i) + 0.1f);
  return out;
}

std::vector<float> poisoned(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

bool all_nan(const std::vector<float>& x) {
  for (float v : x)
    if (!std::isnan(v)) return false;
  return true;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Gated DeltaNet's inputs [B, S, N, K] and so on, and two sets of poisoned outputs: one for the
// entry point, one for the named call.
struct Recurrence {
  std::vector<float> q = ramp(B * S * N * K, 0.3f, 0.f), k = ramp(B * S * N * K, 0.2f, 0.05f),
                     v = ramp(B * S * N * V, 1.f, 0.f), g = ramp(B * S * N, 0.1f, -0.3f),
                     beta = ramp(B * S * N, 0.2f, 0.5f), h0 = ramp(B * N * K * V, 0.1f, 0.f);
  std::vector<float> y = poisoned(B * S * N * V), ht = poisoned(B * N * K * V);
  std::vector<float> y_named = y, ht_named = ht;

  bool outputs_untouched() const { return all_nan(y_named) && all_nan(ht_named); }

  std::vector<std::pair<std::string, Tensor>> named() {
    return {{"q", Tensor::contiguous(q.data(), DType::f32, {B, S, N, K})},
            {"k", Tensor::contiguous(k.data(), DType::f32, {B, S, N, K})},
            {"v", Tensor::contiguous(v.data(), DType::f32, {B, S, N, V})},
            {"g", Tensor::contiguous(g.data(), DType::f32, {B, S, N})},
            {"beta", Tensor::contiguous(beta.data(), DType::f32, {B, S, N})},
            {"h0", Tensor::contiguous(h0.data(), DType::f32, {B, N, K, V})},
            {"y", Tensor::contiguous(y_named.data(), DType::f32, {B, S, N, V})},
            {"ht", Tensor::contiguous(ht_named.data(), DType::f32, {B, N, K, V})}};
  }

  NamedCall call(NamedOptions options = {}) {
    return {Operation::forward, Variant::gated_deltanet, named(), {}, std::move(options)};
  }
};

TEST(NamedCall, ForwardIsTheEntryPointsBitwise) {
  Recurrence r;
  ForwardArgs a;
  a.q = Tensor::contiguous(r.q.data(), DType::f32, {B, S, N, K});
  a.k = Tensor::contiguous(r.k.data(), DType::f32, {B, S, N, K});
  a.v = Tensor::contiguous(r.v.data(), DType::f32, {B, S, N, V});
  a.g = Tensor::contiguous(r.g.data(), DType::f32, {B, S, N});
  a.beta = Tensor::contiguous(r.beta.data(), DType::f32, {B, S, N});
  a.h0 = Tensor::contiguous(r.h0.data(), DType::f32, {B, N, K, V});
  a.y = Tensor::contiguous(r.y.data(), DType::f32, {B, S, N, V});
  a.ht = Tensor::contiguous(r.ht.data(), DType::f32, {B, N, K, V});
  Options options;
  options.chunk = 16;
  options.scale = 0.25f;
  options.l2norm_qk = true;
  options.solve = Solve::blocked;
  options.precision = Precision::fast;
  forward(Variant::gated_deltanet, a, options);
  // Typed values, and the same as text (a command line's).
  for (const NamedOptions& named :
       {NamedOptions{{"chunk", int64_t(16)}, {"scale", 0.25}, {"l2norm_qk", true}, {"solve", std::string("blocked")},
                     {"precision", std::string("fast")}},
        NamedOptions{{"chunk", std::string("16")}, {"scale", std::string("0.25")}, {"l2norm_qk", std::string("true")},
                     {"solve", std::string("blocked")}, {"precision", std::string("fast")}}}) {
    r.y_named = poisoned(r.y.size());
    r.ht_named = poisoned(r.ht.size());
    call(r.call(named));
    EXPECT_FALSE(all_nan(r.y));
    EXPECT_TRUE(bitwise_equal(r.y, r.y_named));
    EXPECT_TRUE(bitwise_equal(r.ht, r.ht_named));
  }
}

TEST(NamedCall, ConvAndNormAreTheEntryPointsBitwise) {
  std::vector<float> x = ramp(B * S * C, 1.f, 0.f), weight = ramp(C * W, 0.5f, 0.f), state0 = ramp(B * C * (W - 1), 1.f, 0.f);
  std::vector<float> y = poisoned(x.size()), state = poisoned(state0.size()), y_named = y, state_named = state;
  ConvArgs a;
  a.x = Tensor::contiguous(x.data(), DType::f32, {B, S, C});
  a.weight = Tensor::contiguous(weight.data(), DType::f32, {C, W});
  a.state0 = Tensor::contiguous(state0.data(), DType::f32, {B, C, W - 1});
  a.y = Tensor::contiguous(y.data(), DType::f32, {B, S, C});
  a.state = Tensor::contiguous(state.data(), DType::f32, {B, C, W - 1});
  ConvOptions conv;
  conv.activation = Activation::none;
  conv_forward(a, conv);
  call({Operation::conv_forward,
        {},
        {{"x", a.x},
         {"weight", a.weight},
         {"state0", a.state0},
         {"y", Tensor::contiguous(y_named.data(), DType::f32, {B, S, C})},
         {"state", Tensor::contiguous(state_named.data(), DType::f32, {B, C, W - 1})}},
        {},
        {{"activation", std::string("none")}}});
  EXPECT_TRUE(bitwise_equal(y, y_named));
  EXPECT_TRUE(bitwise_equal(state, state_named));

  std::vector<float> gate = ramp(x.size(), 1.f, 0.f), norm_weight = ramp(C, 0.3f, 1.f);
  std::vector<float> out = poisoned(x.size()), out_named = out;
  NormGateArgs n;
  n.x = Tensor::contiguous(x.data(), DType::f32, {B, S, 1, C});
  n.g = Tensor::contiguous(gate.data(), DType::f32, {B, S, 1, C});
  n.weight = Tensor::contiguous(norm_weight.data(), DType::f32, {C});
  n.y = Tensor::contiguous(out.data(), DType::f32, {B, S, 1, C});
  NormGateOptions norm;
  norm.activation = Activation::sigmoid;
  norm.norm_before_gate = false;
  norm.eps = 1e-3f;
  norm_gate_forward(n, norm);
  call({Operation::norm_gate_forward,
        {},
        {{"x", n.x}, {"g", n.g}, {"weight", n.weight}, {"y", Tensor::contiguous(out_named.data(), DType::f32, {B, S, 1, C})}},
        {},
        {{"activation", std::string("sigmoid")}, {"norm_before_gate", int64_t(0)}, {"eps", 1e-3}}});
  EXPECT_TRUE(bitwise_equal(out, out_named));
}

TEST(NamedCall, NamesAndValuesThatDoNotFitAreRefusedBeforeAnyWrite) {
  Recurrence r;
  const struct {
    NamedOptions options;
    std::string fragment;
  } cases[] = {
      {{{"chunkk", int64_t(16)}}, "flat: unknown option 'chunkk' (expected scale, chunk, l2norm_qk, solve, precision, gate_group, check_values)"},
      {{{"chunk", int64_t(16)}, {"chunk", int64_t(32)}}, "flat: chunk: option given twice"},
      {{{"chunk", 1.5}}, "flat: chunk: expected an integer, got 1.5"},
      {{{"chunk", std::string("64x")}}, "flat: chunk: expected an integer, got '64x'"},
      {{{"chunk", int64_t(1) << 40}}, "flat: chunk: 1099511627776 is out of range (an int)"},
      {{{"chunk", int64_t(20)}}, "options.chunk"},  // a value the parser takes and the library refuses
      {{{"l2norm_qk", int64_t(2)}}, "flat: l2norm_qk: expected true or false, got 2"},
      {{{"solve", int64_t(3)}}, "flat: solve: expected a name, got 3"},
      {{{"solve", std::string("neumann")}}, "flat: solve: expected auto, subst, blocked or doubling, got 'neumann'"},
      {{{"precision", std::string("high")}}, "flat: precision: expected exact or fast, got 'high'"},
      {{{"scale", std::numeric_limits<double>::infinity()}}, "flat: scale: expected a finite number, or none for K^-1/2, got inf"},
      {{{"scale", std::string("1e40")}}, "flat: scale: '1e40' is out of range (a number from -3.40282e+38 to 3.40282e+38)"},
      {{{"scale", true}}, "flat: scale: expected a finite number, or none for K^-1/2, got true"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.fragment);
    expect_error([&] { call(r.call(c.options)); }, c.fragment, r);
  }

  NamedCall unknown = r.call();
  unknown.tensors.emplace_back("dq", unknown.tensors[0].second);
  expect_error([&] { call(unknown); }, "flat: unknown tensor 'dq' (expected q, k, v, g, beta, b, w, h0, y, ht)", r);
  NamedCall twice = r.call();
  twice.tensors.push_back(twice.tensors[0]);
  expect_error([&] { call(twice); }, "flat: q: tensor given twice", r);
  NamedCall missing = r.call();
  missing.tensors.erase(missing.tensors.begin() + 4);  // beta
  expect_error([&] { call(missing); }, "beta", r);
}

TEST(NamedCall, OptionsOfTheOtherOperations) {
  EXPECT_EQ(conv_options({{"activation", std::string("silu")}}).activation, Activation::silu);
  EXPECT_THROW(conv_options({{"activation", std::string("sigmoid")}}), Error);  // the convolution has none
  try {
    conv_options({{"activation", std::string("relu")}});
    ADD_FAILURE() << "relu taken";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "flat: activation: expected silu or none, got 'relu'");
  }
  const NormGateOptions norm = norm_gate_options({{"eps", std::string("1e-6")}, {"norm_before_gate", false}});
  EXPECT_EQ(norm.eps, 1e-6f);
  EXPECT_FALSE(norm.norm_before_gate);
  for (const OptionValue& eps : {OptionValue(0.0), OptionValue(-1.0), OptionValue(std::string("nan"))})
    EXPECT_THROW(norm_gate_options({{"eps", eps}}), Error);
  EXPECT_THROW(norm_gate_options({{"chunk", int64_t(64)}}), Error);
}

TEST(NamedCall, TheNormTakesNoSequences) {
  std::vector<float> x = ramp(C, 1.f, 0.f), weight = ramp(C, 1.f, 0.f), y = poisoned(C);
  const std::vector<int64_t> offsets{0, 1};
  NamedCall c{Operation::norm_gate_forward,
              {},
              {{"x", Tensor::contiguous(x.data(), DType::f32, {1, 1, 1, C})},
               {"weight", Tensor::contiguous(weight.data(), DType::f32, {C})},
               {"y", Tensor::contiguous(y.data(), DType::f32, {1, 1, 1, C})}},
              {offsets, {}, {}, {}},
              {}};
  EXPECT_THROW(call(c), Error);
  EXPECT_TRUE(all_nan(y));
}

// A tensor with a shape and dtype and no data, as a traced front end describes its inputs.
Tensor described(DType dtype, std::initializer_list<int64_t> shape) { return Tensor::contiguous(nullptr, dtype, shape); }

std::string shape_of(const std::vector<std::pair<std::string_view, Tensor>>& outputs, std::string_view name) {
  for (const auto& [n, t] : outputs) {
    if (n != name) continue;
    std::string out = std::string(dtype_name(t.dtype)) + "[";
    for (int d = 0; d < t.rank; ++d) {
      if (d) out += ',';
      out += std::to_string(t.shape[size_t(d)]);
    }
    EXPECT_EQ(t.data, nullptr);
    return out + "]";
  }
  return "absent";
}

TEST(OutputShapes, TheRecurrencesFollowTheHeadCountsAndTheSequences) {
  const std::vector<std::pair<std::string, Tensor>> inputs{
      {"q", described(DType::bf16, {1, 9, 1, 16})},  {"k", described(DType::bf16, {1, 9, 2, 16})},
      {"v", described(DType::f32, {1, 9, 4, 8})},    {"g", described(DType::f32, {1, 9, 2})},
      {"beta", described(DType::bf16, {1, 9, 4})},   {"h0", described(DType::f32, {3, 4, 16, 8})}};
  // Three sequences of the packed batch, h0 a row per sequence.
  auto out = output_shapes(Operation::forward, Variant::gated_deltanet, inputs, {4, false}, {});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(shape_of(out, "y"), "f32[1,9,4,8]");
  EXPECT_EQ(shape_of(out, "ht"), "f32[3,4,16,8]");
  out = output_shapes(Operation::backward, Variant::gated_deltanet, inputs, {4, false}, {});
  EXPECT_EQ(shape_of(out, "dq"), "bf16[1,9,1,16]");
  EXPECT_EQ(shape_of(out, "dg"), "f32[1,9,2]");
  EXPECT_EQ(shape_of(out, "dbeta"), "bf16[1,9,4]");
  EXPECT_EQ(shape_of(out, "db"), "absent");
  EXPECT_EQ(shape_of(out, "dh0"), "f32[3,4,16,8]");
  // A pool of 7 rows read through initial_state_indices: the states stay a row per sequence.
  std::vector<std::pair<std::string, Tensor>> pooled = inputs;
  pooled.back().second = described(DType::f32, {7, 4, 16, 8});
  EXPECT_EQ(shape_of(output_shapes(Operation::forward, Variant::gated_deltanet, pooled, {4, true}, {}), "ht"),
            "f32[3,4,16,8]");
  // The call's own errors: a pool without its indices, head counts that do not divide, an option.
  EXPECT_THROW(output_shapes(Operation::forward, Variant::gated_deltanet, pooled, {4, false}, {}), Error);
  std::vector<std::pair<std::string, Tensor>> uneven = inputs;
  uneven[1].second = described(DType::bf16, {1, 9, 3, 16});
  try {
    output_shapes(Operation::forward, Variant::gated_deltanet, uneven, {4, false}, {});
    ADD_FAILURE() << "Nk = 3 taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit Nk = 3 of k"), std::string::npos) << e.what();
  }
  EXPECT_THROW(output_shapes(Operation::forward, Variant::gated_deltanet, inputs, {4, false}, {{"chunk", int64_t(8)}}),
               Error);
  // Outputs are not inputs.
  std::vector<std::pair<std::string, Tensor>> with_output = inputs;
  with_output.emplace_back("y", described(DType::f32, {1, 9, 4, 8}));
  EXPECT_THROW(output_shapes(Operation::forward, Variant::gated_deltanet, with_output, {4, false}, {}), Error);
}

TEST(OutputShapes, TheConvolutionKeepsAStateOnlyWithMoreThanOneTap) {
  for (const int64_t taps : {int64_t(1), int64_t(4)}) {
    std::vector<std::pair<std::string, Tensor>> inputs{{"x", described(DType::bf16, {2, 5, 6})},
                                                       {"weight", described(DType::f32, {6, taps})}};
    if (taps > 1) inputs.emplace_back("state0", described(DType::f32, {2, 6, taps - 1}));
    const auto forward = output_shapes(Operation::conv_forward, Variant::la, inputs, {}, {});
    EXPECT_EQ(shape_of(forward, "y"), "bf16[2,5,6]");
    EXPECT_EQ(shape_of(forward, "state"), taps > 1 ? "f32[2,6,3]" : "absent");
    const auto backward = output_shapes(Operation::conv_backward, Variant::la, inputs, {}, {});
    EXPECT_EQ(shape_of(backward, "dweight"), "f32[6," + std::to_string(taps) + "]");
    EXPECT_EQ(shape_of(backward, "dbias"), "absent");
    EXPECT_EQ(shape_of(backward, "dstate0"), taps > 1 ? "f32[2,6,3]" : "absent");
  }
  const auto norm = output_shapes(Operation::norm_gate_backward, Variant::la,
                                  {{"x", described(DType::bf16, {1, 2, 3, 4})}, {"weight", described(DType::f32, {4})}},
                                  {}, {{"eps", 1e-6}});
  EXPECT_EQ(shape_of(norm, "dx"), "bf16[1,2,3,4]");
  EXPECT_EQ(shape_of(norm, "dg"), "absent");
  EXPECT_EQ(shape_of(norm, "dweight"), "f32[4]");
}

TEST(NamedCall, SlotsAndNamesDescribeEveryOperation) {
  for (const Operation op : {Operation::forward, Operation::backward, Operation::conv_forward, Operation::conv_backward,
                             Operation::norm_gate_forward, Operation::norm_gate_backward}) {
    EXPECT_EQ(parse_operation(operation_name(op)), op);
    // Inputs first, then outputs: the positional front end's operands and results.
    bool seen_output = false;
    for (const TensorSlot& slot : tensor_slots(op)) {
      EXPECT_FALSE(seen_output && !slot.output) << operation_name(op) << ": " << slot.name;
      seen_output = seen_output || slot.output;
    }
    EXPECT_TRUE(seen_output);
    EXPECT_FALSE(option_names(op).empty());
  }
  EXPECT_EQ(tensor_slots(Operation::backward).size(), 18u);
  EXPECT_EQ(option_names(Operation::norm_gate_backward).size(), 3u);
  EXPECT_THROW(parse_operation("sideways"), Error);
}

}  // namespace
}  // namespace flat

// `flat run conv` in process (inputs written as .npy files, outputs read back and compared with
// the float64 oracle; bad files and options rejected with one line naming them and nothing
// written), and the convolution's bench entry at a small shape.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench_conv.h"
#include "cli_files.h"
#include "harness.h"
#include "npy.h"
#include "run.h"
#include "run_conv.h"
#include "run_io.h"
#include "test_conv_harness.h"

namespace flat::test {
namespace {

namespace fs = std::filesystem;

void write_inputs(const fs::path& dir, const ConvData& d, bool backward) {
  const ConvCase& c = d.c;
  write(dir / "x.npy", {c.B, c.S, c.C}, d.in.x);
  write(dir / "weight.npy", {c.C, c.W}, d.in.weight);
  if (c.bias) write(dir / "bias.npy", {c.C}, d.in.bias);
  if (c.state0) write(dir / "state0.npy", {c.B, c.C, c.W - 1}, d.in.state0);
  if (!backward) return;
  write(dir / "dy.npy", {c.B, c.S, c.C}, d.dy);
  if (c.dstate) write(dir / "dstate.npy", {c.B, c.C, c.W - 1}, d.dstate);
}

struct CliCase {
  ConvCase c;
  bool backward;
};

void PrintTo(const CliCase& run, std::ostream* os) { *os << run.c.name() << (run.backward ? "_bwd" : "_fwd"); }

class ConvCli : public ::testing::TestWithParam<CliCase> {};

TEST_P(ConvCli, MatchesOracle) {
  const CliCase& run = GetParam();
  const ConvCase& c = run.c;
  const ConvData d(c);
  TempDir in{"flat_conv_cli_"}, scratch{"flat_conv_cli_"};
  const fs::path out = scratch / "out";
  write_inputs(in.path(), d, run.backward);
  std::ostringstream stdout_text, stderr_text;
  const std::vector<std::string> args{"conv",
                                      "--in",
                                      in.path().string(),
                                      "--out",
                                      out.string(),
                                      "--dtype",
                                      std::string(dtype_name(c.x_dtype)),
                                      "--activation",
                                      std::string(activation_name(c.activation)),
                                      "--threads",
                                      std::to_string(c.threads)};
  ASSERT_EQ(tool::run_command(args, stdout_text, stderr_text), 0) << stderr_text.str();
  EXPECT_EQ(stderr_text.str(), "");

  std::set<std::string> expected{"y.npy"};
  if (c.W > 1) expected.insert("state.npy");
  if (run.backward) {
    expected.insert({"dx.npy", "dweight.npy"});
    if (c.bias) expected.insert("dbias.npy");
    if (c.state0) expected.insert("dstate0.npy");
  }
  EXPECT_EQ(file_names(out), expected);

  const bool bf16 = c.x_dtype == DType::bf16;
  const double out_tol = bf16 ? 5e-3 : 1e-5, grad_tol = bf16 ? 1e-2 : 1e-5;
  const auto expect_close = [&](const std::string& name, const std::vector<int64_t>& shape,
                                const std::vector<double>& want, double tol) {
    const double error = relative_error(read_output(out / name, shape), want);
    EXPECT_TRUE(error <= tol) << name << " " << error;
  };
  const ref::ConvOutputs want = ref::conv_forward(d.problem, d.in);
  expect_close("y.npy", {c.B, c.S, c.C}, want.y, out_tol);
  if (c.W > 1) expect_close("state.npy", {c.B, c.C, c.W - 1}, want.state, out_tol);
  if (!run.backward) return;
  const ref::ConvGradients dwant = ref::conv_backward(d.problem, d.in, d.dy, d.dstate);
  expect_close("dx.npy", {c.B, c.S, c.C}, dwant.dx, grad_tol);
  expect_close("dweight.npy", {c.C, c.W}, dwant.dweight, grad_tol);
  if (c.bias) expect_close("dbias.npy", {c.C}, dwant.dbias, grad_tol);
  if (c.state0) expect_close("dstate0.npy", {c.B, c.C, c.W - 1}, dwant.dstate0, grad_tol);
}

std::vector<CliCase> cli_cases() {
  std::vector<CliCase> cases;
  ConvCase c;
  c.B = 2;
  c.S = 300;
  c.C = 21;
  c.W = 4;
  c.state0 = c.dstate = true;
  cases.push_back({c, true});
  cases.push_back({c, false});
  ConvCase b = c;
  b.x_dtype = b.y_dtype = DType::bf16;
  b.activation = Activation::none;
  b.bias = b.state0 = b.dstate = false;
  b.W = 3;
  b.threads = 1;
  cases.push_back({b, true});
  ConvCase one = c;
  one.W = 1;
  one.state0 = one.dstate = false;
  cases.push_back({one, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, ConvCli, ::testing::ValuesIn(cli_cases()),
                         [](const ::testing::TestParamInfo<CliCase>& info) {
                           return info.param.c.name() + (info.param.backward ? "_bwd" : "_fwd");
                         });

// Bad inputs: exit status 2, one line naming the file or option, nothing written.
TEST(ConvCli, BadInputsNamedAndNothingWritten) {
  const std::vector<int64_t> x{2, 5, 6}, w{6, 4};
  expect_rejected("conv", {
      {"no x", {{"weight.npy", w}}, {}, "x.npy"},
      {"x rank", {{"x.npy", {2, 5}}, {"weight.npy", w}}, {}, "x.npy: expected shape (B, S, C), got (2, 5)"},
      {"weight C", {{"x.npy", x}, {"weight.npy", {5, 4}}}, {}, "weight.npy: expected shape (C=6, W), got (5, 4)"},
      {"W = 9", {{"x.npy", x}, {"weight.npy", {6, 9}}}, {}, "weight.npy: W = 9 taps is not supported (1 to 8)"},
      {"bias", {{"x.npy", x}, {"weight.npy", w}, {"bias.npy", {5}}}, {}, "bias.npy: expected shape (C=6), got (5,)"},
      {"state0",
       {{"x.npy", x}, {"weight.npy", w}, {"state0.npy", {2, 6, 4}}},
       {},
       "state0.npy: expected shape (B=2, C=6, W-1=3), got (2, 6, 4)"},
      {"state0 with W = 1",
       {{"x.npy", x}, {"weight.npy", {6, 1}}, {"state0.npy", {2, 6, 1}}},
       {},
       "state0.npy: W = 1 keeps no state"},
      {"dy", {{"x.npy", x}, {"weight.npy", w}, {"dy.npy", {2, 4, 6}}}, {}, "dy.npy: expected shape (B=2, S=5, C=6)"},
      {"dstate", {{"x.npy", x}, {"weight.npy", w}, {"dy.npy", x}, {"dstate.npy", {2, 6}}}, {}, "dstate.npy"},
      {"activation",
       {{"x.npy", x}, {"weight.npy", w}},
       {"--activation", "relu"},
       "--activation: expected silu or none, got 'relu'"},
      {"dtype", {{"x.npy", x}, {"weight.npy", w}}, {"--dtype", "f16"}, "--dtype: expected f32 or bf16"},
      {"option", {{"x.npy", x}, {"weight.npy", w}}, {"--chunk", "64"}, "unknown option '--chunk' for conv"},
      {"threads", {{"x.npy", x}, {"weight.npy", w}}, {"--threads", "-2"}, "context.threads"},
  });
}

// The command is picked by the first argument that is neither an option nor an option's value.
TEST(ConvCli, VariantIsFoundAmongOptions) {
  EXPECT_EQ(tool::run_variant({"conv", "--in", "a", "--out", "b"}), "conv");
  EXPECT_EQ(tool::run_variant({"--in", "a", "conv", "--out", "b"}), "conv");
  EXPECT_EQ(tool::run_variant({"--in", "conv", "gla", "--out", "b"}), "gla");
  EXPECT_EQ(tool::run_variant({"gla", "--in", "conv"}), "gla");
  EXPECT_EQ(tool::run_variant({"--l2norm", "conv", "--in", "a"}), "conv");  // a flag takes no value
  EXPECT_EQ(tool::run_variant({"--gate-first", "norm_gate", "--eps", "1e-6"}), "norm_gate");
  EXPECT_EQ(tool::run_variant({"--in", "a"}), "");
  EXPECT_EQ(tool::run_variant({}), "");
}

// The bench entry at a small shape: both passes timed, the work counted as documented, the
// naive baseline on the same inputs.
TEST(ConvBench, SmallShape) {
  tool::ConvBenchOptions o;
  o.B = 1;
  o.S = 64;
  o.C = 48;
  o.W = 4;
  o.threads = 2;
  o.repeats = 1;
  o.baseline_repeats = 1;
  const std::vector<tool::PassResult> results = tool::bench_conv(o);
  ASSERT_EQ(results.size(), 2u);
  const double n = double(o.B * o.S * o.C), taps = double(o.C) * (o.W + 1) * 4;
  EXPECT_EQ(results[0].pass, "forward");
  EXPECT_EQ(results[0].bytes, 2 * n * 2 + taps);   // x, y in bf16; weight and bias fp32
  EXPECT_EQ(results[0].flops, n * (2 * o.W + 6));  // taps and bias, SiLU
  EXPECT_EQ(results[1].pass, "backward");
  EXPECT_EQ(results[1].bytes, 3 * n * 2 + 2 * taps);  // x, dy, dx; weight, bias, dweight, dbias
  EXPECT_EQ(results[1].flops, n * (2 * o.W + 9 + 2 * o.W - 1 + 2 * o.W + 1));
  for (const tool::PassResult& r : results) {
    EXPECT_GT(r.seconds, 0) << r.pass;
    EXPECT_GT(r.gbs(), 0) << r.pass;
    ASSERT_TRUE(r.baseline_seconds) << r.pass;
    EXPECT_GT(*r.speedup(), 0) << r.pass;
  }
  std::ostringstream table;
  tool::write_conv_markdown(o, results, 20.0, table);
  EXPECT_NE(table.str().find("| forward |"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("| backward |"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("% |"), std::string::npos) << table.str();
}

}  // namespace
}  // namespace flat::test

// `flat run norm_gate` in process (inputs written as .npy files, outputs read back and compared
// bit for bit with the library's own call and within bounds with the float64 oracle; bad files
// and options rejected with one line naming them and nothing written), and the norm's bench
// entry at a small shape.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench_norm.h"
#include "checks.h"
#include "cli_files.h"
#include "harness.h"
#include "npy.h"
#include "run.h"
#include "test_norm_harness.h"

namespace flat::test {
namespace {

namespace fs = std::filesystem;

struct CliCase {
  NormCase c;  // x, g, y in one dtype: --dtype sets them all
  bool backward;
  float eps = 0;  // given as --eps when above 0, else the default

  std::string name() const { return c.name() + (backward ? "_bwd" : "_fwd") + (eps > 0 ? "_eps" : ""); }
};

void PrintTo(const CliCase& run, std::ostream* os) { *os << run.name(); }

std::vector<int64_t> rows_shape(const NormCase& c) { return {c.B, c.S, c.N, c.D}; }
std::vector<int64_t> weight_shape(const NormCase& c) {
  return c.weight_per_head ? std::vector<int64_t>{c.N, c.D} : std::vector<int64_t>{c.D};
}

void write_inputs(const fs::path& dir, const NormData& d, bool backward) {
  const NormCase& c = d.c;
  write(dir / "x.npy", rows_shape(c), d.in.x);
  write(dir / "weight.npy", weight_shape(c), d.in.weight);
  if (c.gate) write(dir / "g.npy", rows_shape(c), d.in.g);
  if (backward) write(dir / "dy.npy", rows_shape(c), d.dy);
}

// The library's call on the same rounded inputs, dense: what the command must write, exactly
// (results are the same bits for any thread count).
struct LibraryOutputs {
  std::vector<double> y, dx, dg, dweight;
};

LibraryOutputs call_library(const NormData& d, const NormGateOptions& options) {
  const NormCase& c = d.c;
  const size_t n = d.in.x.size();
  Buffer x(c.x_dtype, n), g(c.x_dtype, n), y(c.x_dtype, n), dy(c.x_dtype, n), dx(c.x_dtype, n), dg(c.x_dtype, n);
  for (size_t i = 0; i < n; ++i) {
    x.set(i, d.in.x[i]);
    dy.set(i, d.dy[i]);
    if (c.gate) g.set(i, d.in.g[i]);
  }
  std::vector<float> weight(d.in.weight.begin(), d.in.weight.end()), dweight(weight.size());
  const auto rows = [&](Buffer& b) { return Tensor::contiguous(b.data(), c.x_dtype, {c.B, c.S, c.N, c.D}); };
  const auto weights = [&](std::vector<float>& w) {
    const std::vector<int64_t> shape = weight_shape(c);
    return Tensor::contiguous(w.data(), DType::f32, std::span<const int64_t>(shape));
  };
  NormGateInputs in;
  in.x = rows(x);
  if (c.gate) in.g = rows(g);
  in.weight = weights(weight);
  NormGateArgs fa(in);
  fa.y = rows(y);
  norm_gate_forward(fa, options);
  NormGateBackwardArgs ba(in);
  ba.dy = rows(dy);
  ba.dx = rows(dx);
  if (c.gate) ba.dg = rows(dg);
  ba.dweight = weights(dweight);
  norm_gate_backward(ba, options);

  LibraryOutputs out;
  for (size_t i = 0; i < n; ++i) {
    out.y.push_back(y.get(i));
    out.dx.push_back(dx.get(i));
    if (c.gate) out.dg.push_back(dg.get(i));
  }
  out.dweight.assign(dweight.begin(), dweight.end());
  return out;
}

class NormGateCli : public ::testing::TestWithParam<CliCase> {};

TEST_P(NormGateCli, MatchesLibraryAndOracle) {
  const CliCase& run = GetParam();
  const NormCase& c = run.c;
  NormData d(c);
  NormGateOptions options;
  options.activation = c.activation;
  options.norm_before_gate = c.norm_before_gate;
  if (run.eps > 0) options.eps = run.eps;
  d.problem.eps = options.eps;
  TempDir in{"flat_norm_cli_"}, scratch{"flat_norm_cli_"};
  const fs::path out = scratch / "out";
  write_inputs(in.path(), d, run.backward);

  // The options before the variant, so that the command is found behind a flag (--gate-first).
  std::vector<std::string> args{"--in", in.path().string(), "--out", out.string(), "--dtype",
                                std::string(dtype_name(c.x_dtype)), "--threads", std::to_string(c.threads)};
  if (c.gate) args.insert(args.end(), {"--activation", std::string(activation_name(c.activation))});
  if (run.eps > 0) args.insert(args.end(), {"--eps", std::to_string(run.eps)});
  if (c.gate && !c.norm_before_gate) args.push_back("--gate-first");
  args.push_back("norm_gate");
  std::ostringstream stdout_text, stderr_text;
  ASSERT_EQ(tool::run_command(args, stdout_text, stderr_text), 0) << stderr_text.str();
  EXPECT_EQ(stderr_text.str(), "");

  std::set<std::string> expected{"y.npy"};
  if (run.backward) expected.insert({"dx.npy", "dweight.npy"});
  if (run.backward && c.gate) expected.insert("dg.npy");
  EXPECT_EQ(file_names(out), expected);

  const LibraryOutputs library = call_library(d, options);
  const bool bf16 = c.x_dtype == DType::bf16;
  const double out_tol = bf16 ? 5e-3 : 1e-5, grad_tol = bf16 ? 1e-2 : 1e-5;
  const auto expect_output = [&](const std::string& name, const std::vector<int64_t>& shape,
                                 const std::vector<double>& from_library, const std::vector<double>& from_oracle,
                                 double tol) {
    const std::vector<double> got = read_output(out / name, shape);
    EXPECT_EQ(got, from_library) << name << ": not the library's result";
    const double error = relative_error(got, from_oracle);
    EXPECT_TRUE(error <= tol) << name << ": relative L2 error " << error << " > " << tol;
  };
  expect_output("y.npy", rows_shape(c), library.y, ref::norm_gate_forward(d.problem, d.in), out_tol);
  if (!run.backward) return;
  const ref::NormGateGradients want = ref::norm_gate_backward(d.problem, d.in, d.dy);
  expect_output("dx.npy", rows_shape(c), library.dx, want.dx, grad_tol);
  if (c.gate) expect_output("dg.npy", rows_shape(c), library.dg, want.dg, grad_tol);
  expect_output("dweight.npy", weight_shape(c), library.dweight, want.dweight, grad_tol);
}

std::vector<CliCase> cli_cases() {
  NormCase c;  // fp32, SiLU after the norm (FLA's layers), one weight row for the heads
  c.B = 2;
  c.S = 37;
  c.N = 3;
  c.D = 40;
  NormCase m = c;  // Mamba-2's: the gate first, weights per head; bf16, sigmoid for once
  m.x_dtype = m.g_dtype = m.y_dtype = DType::bf16;
  m.norm_before_gate = false;
  m.weight_per_head = true;
  m.activation = Activation::sigmoid;
  m.threads = 1;
  NormCase n = c;  // no gate, a coarser eps
  n.gate = false;
  NormCase l = c;  // a linear gate
  l.activation = Activation::none;
  l.D = 17;
  return {{c, true}, {c, false}, {m, true}, {n, true, 1e-3f}, {l, true}};
}

INSTANTIATE_TEST_SUITE_P(Cases, NormGateCli, ::testing::ValuesIn(cli_cases()),
                         [](const ::testing::TestParamInfo<CliCase>& info) { return info.param.name(); });

// Bad inputs: exit status 2, one line naming the file or option, nothing written.
TEST(NormGateCli, BadInputsNamedAndNothingWritten) {
  const std::vector<int64_t> x{2, 5, 3, 4}, w{4};
  const std::vector<std::pair<std::string, std::vector<int64_t>>> good{{"x.npy", x}, {"weight.npy", w}};
  expect_rejected("norm_gate", {
      {"no x", {{"weight.npy", w}}, {}, "x.npy"},
      {"no weight", {{"x.npy", x}}, {}, "weight.npy"},
      {"x rank", {{"x.npy", {2, 5, 12}}, {"weight.npy", w}}, {}, "x.npy: expected shape (B, S, N, D), got (2, 5, 12)"},
      {"weight D",
       {{"x.npy", x}, {"weight.npy", {5}}},
       {},
       "weight.npy: expected shape (D=4) or (N=3, D=4), got (5,)"},
      {"weight N",
       {{"x.npy", x}, {"weight.npy", {2, 4}}},
       {},
       "weight.npy: expected shape (D=4) or (N=3, D=4), got (2, 4)"},
      {"weight rank", {{"x.npy", x}, {"weight.npy", {1, 3, 4}}}, {}, "weight.npy: expected shape (D=4) or (N=3, D=4)"},
      {"g",
       {{"x.npy", x}, {"weight.npy", w}, {"g.npy", {2, 5, 3, 5}}},
       {},
       "g.npy: expected shape (B=2, S=5, N=3, D=4), got (2, 5, 3, 5)"},
      {"dy",
       {{"x.npy", x}, {"weight.npy", w}, {"dy.npy", {2, 4, 3, 4}}},
       {},
       "dy.npy: expected shape (B=2, S=5, N=3, D=4)"},
      {"activation",
       {{"x.npy", x}, {"weight.npy", w}, {"g.npy", x}},
       {"--activation", "relu"},
       "activation: expected silu, sigmoid or none, got 'relu'"},
      {"activation without g", good, {"--activation", "sigmoid"}, "--activation: given, but there is no g.npy"},
      {"gate first without g", good, {"--gate-first"}, "--gate-first: given, but there is no g.npy"},
      {"eps 0", good, {"--eps", "0"}, "eps: expected a finite number > 0, got '0'"},
      {"eps nan", good, {"--eps", "nan"}, "eps: expected a finite number > 0, got 'nan'"},
      {"eps text", good, {"--eps", "small"}, "eps: expected a finite number > 0, got 'small'"},
      {"eps missing", good, {"--eps"}, "--eps: missing value"},
      {"dtype", good, {"--dtype", "f16"}, "--dtype: expected f32 or bf16"},
      {"option", good, {"--chunk", "64"}, "unknown option '--chunk' for norm_gate"},
      {"argument", good, {"extra"}, "unexpected argument 'extra'"},
      {"threads", good, {"--threads", "-2"}, "context.threads"},
  });
}

// The bench entry at a small shape: both passes timed, the work counted as documented, the
// naive baseline on the same inputs; FLA's order with a SiLU gate and the bench's other branches
// (the gate first with weights per head, no gate).
TEST(NormGateBench, SmallShape) {
  tool::NormGateBenchOptions o;
  o.B = 1;
  o.S = 16;
  o.N = 3;
  o.D = 40;
  o.threads = 2;
  o.repeats = 1;
  o.baseline_repeats = 1;
  const std::vector<tool::PassResult> results = tool::bench_norm_gate(o);
  ASSERT_EQ(results.size(), 2u);
  const double n = double(o.B * o.S * o.N * o.D), weight = double(o.D) * 4;
  EXPECT_EQ(results[0].pass, "forward");
  EXPECT_EQ(results[0].bytes, 3 * n * 2 + weight);  // x, g, y in bf16; weight fp32
  EXPECT_EQ(results[0].flops, n * (4 + 1 + 5));     // the norm, the product with the gate, SiLU
  EXPECT_EQ(results[1].pass, "backward");
  EXPECT_EQ(results[1].bytes, 5 * n * 2 + 2 * weight);  // x, g, dy, dx, dg; weight, dweight
  EXPECT_EQ(results[1].flops, n * (15 + 9));
  for (const tool::PassResult& r : results) {
    EXPECT_GT(r.seconds, 0) << r.pass;
    EXPECT_GT(r.gbs(), 0) << r.pass;
    ASSERT_TRUE(r.baseline_seconds) << r.pass;
    EXPECT_GT(*r.speedup(), 0) << r.pass;
  }
  std::ostringstream table;
  tool::write_norm_gate_markdown(o, results, 20.0, table);
  EXPECT_NE(table.str().find("Output norm and gate: B=1 S=16 N=3 D=40, silu gate, norm first, weight [D], bf16"),
            std::string::npos)
      << table.str();
  EXPECT_NE(table.str().find("| forward |"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("| backward |"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("% |"), std::string::npos) << table.str();

  tool::NormGateBenchOptions m = o;
  m.norm_before_gate = false;
  m.weight_per_head = true;
  m.activation = Activation::sigmoid;
  m.dtype = DType::f32;
  const std::vector<tool::PassResult> gate_first = tool::bench_norm_gate(m);
  ASSERT_EQ(gate_first.size(), 2u);
  EXPECT_EQ(gate_first[0].bytes, 3 * n * 4 + 3 * weight);
  EXPECT_EQ(gate_first[1].flops, n * (15 + 6));
  EXPECT_TRUE(gate_first[1].baseline_seconds);

  tool::NormGateBenchOptions u = o;
  u.gate = false;
  const std::vector<tool::PassResult> ungated = tool::bench_norm_gate(u);
  ASSERT_EQ(ungated.size(), 2u);
  EXPECT_EQ(ungated[0].bytes, 2 * n * 2 + weight);
  EXPECT_EQ(ungated[1].bytes, 3 * n * 2 + 2 * weight);
  EXPECT_EQ(ungated[0].flops, n * 4);
  EXPECT_EQ(ungated[1].flops, n * 11);
  EXPECT_TRUE(ungated[1].baseline_seconds);
}

}  // namespace
}  // namespace flat::test

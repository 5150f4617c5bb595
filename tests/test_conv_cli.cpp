// `flat run conv` in process (inputs written as .npy files, outputs read back and compared with
// the float64 oracle; sequences and the state pool: packed sequences bitwise what each writes
// alone, the pool read and written at the indexed rows only; bad files and options rejected with
// one line naming them and nothing written), and the convolution's bench entry at a small shape.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <numeric>
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
      {"dstate without dy",
       {{"x.npy", x}, {"weight.npy", w}, {"dstate.npy", {2, 6, 3}}},
       {},
       "dstate.npy: the gradient of state is read by a backward, which runs with dy.npy, remove the file"},
      {"activation",
       {{"x.npy", x}, {"weight.npy", w}},
       {"--activation", "relu"},
       "activation: expected silu or none, got 'relu'"},
      {"dtype", {{"x.npy", x}, {"weight.npy", w}}, {"--dtype", "f16"}, "--dtype: expected f32 or bf16"},
      {"option", {{"x.npy", x}, {"weight.npy", w}}, {"--chunk", "64"}, "unknown option '--chunk' for conv"},
      {"threads", {{"x.npy", x}, {"weight.npy", w}}, {"--threads", "-2"}, "context.threads"},
  });
}

// ---- Sequences and the state pool ------------------------------------------------------------

// A value no state takes, in the pool rows no sequence reads or writes.
constexpr double kSentinel = 12345.0;

// Sequences of the given lengths packed along S of one batch row (cu_seqlens.npy), with a bias,
// the SiLU and dy for the backward.
struct PackedConv {
  PackedConv(DType dtype, int C, int W, const std::vector<int64_t>& lengths)
      : d(make_case(dtype, C, W, lengths)), cu{0} {
    for (int64_t n : lengths) cu.push_back(cu.back() + n);
  }

  static ConvCase make_case(DType dtype, int C, int W, const std::vector<int64_t>& lengths) {
    ConvCase c;
    c.x_dtype = c.y_dtype = dtype;
    c.S = int(std::accumulate(lengths.begin(), lengths.end(), int64_t{0}));
    c.C = C;
    c.W = W;
    return c;
  }

  int64_t count() const { return int64_t(cu.size()) - 1; }
  int64_t length(int64_t i) const { return cu[size_t(i) + 1] - cu[size_t(i)]; }
  size_t state() const { return size_t(d.c.C) * size_t(d.c.W - 1); }  // elements of one state
  std::vector<int64_t> states(int64_t rows) const { return {rows, d.c.C, d.c.W - 1}; }

  // Writes x and dy (sequence i's tokens, or all of them with cu_seqlens.npy for -1), weight and
  // bias into `dir`.
  void write_inputs(const fs::path& dir, int64_t i = -1) const {
    const int64_t S = d.c.S, C = d.c.C;
    for (InputFile file : {InputFile{"x.npy", {1, S, C}, d.in.x}, InputFile{"dy.npy", {1, S, C}, d.dy}}) {
      if (i >= 0) file = file.tokens(cu[size_t(i)], length(i));
      write(dir / file.name, file.shape, file.values);
    }
    write(dir / "weight.npy", {C, d.c.W}, d.in.weight);
    write(dir / "bias.npy", {C}, d.in.bias);
    if (i < 0) write_indices(dir / "cu_seqlens.npy", cu);
  }

  std::vector<std::string> args(const fs::path& in, const fs::path& out) const {
    return {"conv", "--in", in.string(), "--out", out.string(), "--dtype", std::string(dtype_name(d.c.x_dtype))};
  }

  ConvData d;
  std::vector<int64_t> cu;
};

// Sequence i's rows along the tokens of y and dx in the packed run: bitwise the files it wrote alone.
void expect_tokens_alone(const PackedConv& s, int64_t i, const fs::path& packed, const fs::path& alone) {
  for (const char* name : {"y.npy", "dx.npy"})
    EXPECT_TRUE(same_bits(rows(floats(packed / name), size_t(s.d.c.C), s.cu[size_t(i)], s.length(i)),
                          floats(alone / name)))
        << name << " of sequence " << i;
}

// Sequences of lengths 2 (shorter than the window), 0, 9 and 40, 21 channels, W = 4, bf16, each
// with its row of state0.npy and dstate.npy, forward and backward: y, dx, the final states and
// dstate0 bitwise what each sequence writes run alone, the empty one passing its state through
// (state = state0, dstate0 = dstate); dweight and dbias the sums of theirs.
TEST(ConvCliSequences, PackedEqualsOneByOne) {
  const PackedConv s(DType::bf16, 21, 4, {2, 0, 9, 40});
  const size_t state = s.state();
  const std::vector<double> state0 = random_values(size_t(s.count()) * state, 1),
                            dstate = random_values(size_t(s.count()) * state, 2);
  TempDir in{"flat_conv_cli_"}, scratch{"flat_conv_cli_"};
  s.write_inputs(in.path());
  write(in / "state0.npy", s.states(s.count()), state0);
  write(in / "dstate.npy", s.states(s.count()), dstate);
  const fs::path packed = scratch / "packed";
  ASSERT_TRUE(run_ok(s.args(in.path(), packed)));
  EXPECT_EQ(file_names(packed),
            (std::set<std::string>{"y.npy", "state.npy", "dx.npy", "dweight.npy", "dbias.npy", "dstate0.npy"}));
  EXPECT_EQ(tool::read_npy(packed / "state.npy").shape, s.states(s.count()));
  EXPECT_EQ(tool::read_npy(packed / "dstate0.npy").shape, s.states(s.count()));

  const std::vector<float> final_states = floats(packed / "state.npy"), dstate0 = floats(packed / "dstate0.npy");
  std::vector<double> dweight(size_t(s.d.c.C * s.d.c.W), 0.0), dbias(size_t(s.d.c.C), 0.0);
  for (int64_t i = 0; i < s.count(); ++i) {
    const std::vector<double> state0_i = rows(state0, state, i, 1), dstate_i = rows(dstate, state, i, 1);
    if (s.length(i) == 0) {
      EXPECT_TRUE(same_bits(rows(final_states, state, i, 1), as_floats(state0_i))) << "state of empty sequence " << i;
      EXPECT_TRUE(same_bits(rows(dstate0, state, i, 1), as_floats(dstate_i))) << "dstate0 of empty sequence " << i;
      continue;
    }
    TempDir one{"flat_conv_cli_"};
    s.write_inputs(one.path(), i);
    write(one / "state0.npy", s.states(1), state0_i);
    write(one / "dstate.npy", s.states(1), dstate_i);
    const fs::path alone = scratch / ("alone" + std::to_string(i));
    ASSERT_TRUE(run_ok(s.args(one.path(), alone)));
    expect_tokens_alone(s, i, packed, alone);
    EXPECT_TRUE(same_bits(rows(final_states, state, i, 1), floats(alone / "state.npy"))) << "state of " << i;
    EXPECT_TRUE(same_bits(rows(dstate0, state, i, 1), floats(alone / "dstate0.npy"))) << "dstate0 of " << i;
    for (const auto& [name, sum] : {std::pair{"dweight.npy", &dweight}, std::pair{"dbias.npy", &dbias}}) {
      const std::vector<float> own = floats(alone / name);
      for (size_t e = 0; e < sum->size(); ++e) (*sum)[e] += own[e];
    }
  }
  // Summed in another order than the sequences' own sums: close, not the same bits.
  EXPECT_TRUE(relative_error(read_output(packed / "dweight.npy", {s.d.c.C, s.d.c.W}), dweight) <= 1e-6);
  EXPECT_TRUE(relative_error(read_output(packed / "dbias.npy", {s.d.c.C}), dbias) <= 1e-6);
}

// A pool of 10 rows (the sentinel but in the rows sequences start from), initial_state_indices
// {6, -1, 2}, final_state_indices {2, 8, -1} and token_state_indices {0, -1, 1 | 3, 4, -1, -1, 5}
// over lengths 3, 0 and 5, W = 4, fp32: each written row holds exactly the last W-1 inputs of its
// sequence up to that token (the start state's columns before its first), the empty sequence's
// final row zero, every other row as it was, bit for bit (row 2 is written by the first sequence
// though the third starts from it: the run updates a copy and reads the rows as they were). y,
// dx and dstate0 are what the same sequences give with their start states as rows of their own.
TEST(ConvCliSequences, PoolReadsAndWritesIndexedRows) {
  const PackedConv s(DType::f32, 5, 4, {3, 0, 5});
  const std::vector<int64_t> reads{6, -1, 2}, finals{2, 8, -1}, tokens{0, -1, 1, 3, 4, -1, -1, 5};
  const int64_t P = 10, C = s.d.c.C, taps = s.d.c.W - 1;
  const size_t state = s.state();
  std::vector<double> pool(size_t(P) * state, kSentinel), starts;  // starts: each sequence's, a row each
  const std::vector<double> values = random_values(pool.size(), 3);
  const std::vector<double> dstate = random_values(size_t(s.count()) * state, 4);
  for (int64_t r : reads)
    if (r >= 0) set_row(pool, r, rows(values, state, r, 1));
  for (int64_t r : reads) {
    const std::vector<double> start = r >= 0 ? rows(pool, state, r, 1) : std::vector<double>(state, 0.0);
    starts.insert(starts.end(), start.begin(), start.end());
  }
  TempDir in{"flat_conv_cli_"}, gathered{"flat_conv_cli_"}, scratch{"flat_conv_cli_"};
  for (const fs::path& dir : {in.path(), gathered.path()}) {
    s.write_inputs(dir);
    write(dir / "dstate.npy", s.states(s.count()), dstate);
  }
  write_indices(in / "initial_state_indices.npy", reads, "<i4");
  write_indices(in / "final_state_indices.npy", finals);
  write_indices(in / "token_state_indices.npy", tokens, "<i4");
  write(in / "state0.npy", s.states(P), pool);
  write(gathered / "state0.npy", s.states(s.count()), starts);
  const fs::path out = scratch / "pool", reference = scratch / "gathered";
  ASSERT_TRUE(run_ok(s.args(in.path(), out)));
  ASSERT_TRUE(run_ok(s.args(gathered.path(), reference)));

  std::vector<float> expected = as_floats(pool);
  const auto keep = [&](int64_t to, int64_t i, int64_t n) {  // the state after n tokens of sequence i
    if (to < 0) return;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t j = 0; j < taps; ++j) {
        const int64_t p = n - taps + j;  // the position it holds, from the sequence's start
        const double value = p >= 0 ? s.d.in.x[size_t((s.cu[size_t(i)] + p) * C + c)]
                                    : starts[size_t(i) * state + size_t(c * taps + taps + p)];
        expected[size_t(to) * state + size_t(c * taps + j)] = float(value);
      }
  };
  for (int64_t i = 0; i < s.count(); ++i) {
    for (int64_t n = 1; n <= s.length(i); ++n) keep(tokens[size_t(s.cu[size_t(i)] + n - 1)], i, n);
    keep(finals[size_t(i)], i, s.length(i));
  }
  const std::vector<float> written = floats(out / "state.npy");
  ASSERT_EQ(written.size(), expected.size());
  for (int64_t r = 0; r < P; ++r)
    EXPECT_TRUE(same_bits(rows(written, state, r, 1), rows(expected, state, r, 1))) << "pool row " << r;
  for (const char* name : {"y.npy", "dx.npy", "dstate0.npy"})
    EXPECT_TRUE(same_bits(floats(out / name), floats(reference / name))) << name;
  EXPECT_EQ(tool::read_npy(out / "dstate0.npy").shape, s.states(s.count()));
}

// Bad sequence files, one at a time on x (1, 5, 6) and weight (6, 4): refused naming the file or,
// for the values the library checks, the argument; nothing written.
TEST(ConvCliSequences, BadFilesNamedAndNothingWritten) {
  const auto pool = [](const fs::path& dir) { write(dir / "state0.npy", {3, 6, 3}, std::vector<double>(54, 0.5)); };
  const auto two_sequences = [](const fs::path& dir) { write_indices(dir / "cu_seqlens.npy", {0, 2, 5}); };
  struct Bad {
    const char* what;
    std::function<void(const fs::path&)> files;
    std::vector<int64_t> weight;
    std::string fragment;
  };
  const std::vector<Bad> cases{
      {"float offsets", [](const fs::path& dir) { write(dir / "cu_seqlens.npy", {3}, {0, 2, 5}); }, {6, 4},
       "cu_seqlens.npy: expected dtype '<i8' or '<i4' (little-endian int64 or int32), got '<f4'"},
      {"indices of two axes",
       [&](const fs::path& dir) {
         two_sequences(dir);
         write_indices(dir / "initial_state_indices.npy", {0, 1});
         write_indices(dir / "final_state_indices.npy", {0, 1}, "<i4", {1, 2});
         pool(dir);
       },
       {6, 4}, "final_state_indices.npy: expected shape (num_seqs=2), got (1, 2)"},
      {"index past the pool",
       [&](const fs::path& dir) {
         two_sequences(dir);
         write_indices(dir / "initial_state_indices.npy", {0, 3});
         pool(dir);
       },
       {6, 4},
       "initial_state_indices: expected indices from -1 (none) to P-1 = 2 (the rows of state0), got "
       "initial_state_indices[1] = 3"},
      {"a row written twice",
       [&](const fs::path& dir) {
         write_indices(dir / "initial_state_indices.npy", {-1});
         write_indices(dir / "token_state_indices.npy", {0, -1, 2, 2, -1});
         pool(dir);
       },
       {6, 4}, "token_state_indices: expected each row of state written once"},
      {"token states without initial indices",
       [](const fs::path& dir) { write_indices(dir / "token_state_indices.npy", {0, 1, 2, -1, -1}); }, {6, 4},
       "token_state_indices.npy: expected initial_state_indices.npy beside it (state.npy is the pool state0.npy after "
       "the run; -1 starts a sequence from zero), got none"},
      {"indices without their pool", [](const fs::path& dir) { write_indices(dir / "initial_state_indices.npy", {0}); },
       {6, 4}, "initial_state_indices.npy: expected state0.npy beside it (the pool it indexes), got none"},
      {"indices with W = 1", [](const fs::path& dir) { write_indices(dir / "final_state_indices.npy", {0}); }, {6, 1},
       "final_state_indices.npy: W = 1 keeps no state, remove the file"},
      {"dstate of the batch row",
       [&](const fs::path& dir) {
         two_sequences(dir);
         write(dir / "dy.npy", {1, 5, 6}, std::vector<double>(30, 0.5));
         write(dir / "dstate.npy", {1, 6, 3}, std::vector<double>(18, 0.5));
       },
       {6, 4}, "dstate.npy: expected shape (num_seqs=2, C=6, W-1=3), got (1, 6, 3)"},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.what);
    TempDir in{"flat_conv_cli_"}, scratch{"flat_conv_cli_"};
    write(in / "x.npy", {1, 5, 6}, std::vector<double>(30, 0.5));
    write(in / "weight.npy", bad.weight, std::vector<double>(size_t(bad.weight[0] * bad.weight[1]), 0.5));
    bad.files(in.path());
    const fs::path out = scratch / "out";
    expect_refused({"conv", "--in", in.path().string(), "--out", out.string()}, out, bad.fragment);
  }
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
  ASSERT_EQ(results.size(), 3u);
  const double n = double(o.B * o.S * o.C), taps = double(o.C) * (o.W + 1) * 4;
  EXPECT_EQ(results[0].pass, "forward");
  EXPECT_EQ(results[0].bytes, 2 * n * 2 + taps);   // x, y in bf16; weight and bias fp32
  EXPECT_EQ(results[0].flops, n * (2 * o.W + 6));  // taps and bias, SiLU
  EXPECT_EQ(results[1].pass, "backward");
  EXPECT_EQ(results[1].bytes, 3 * n * 2 + 2 * taps);  // x, dy, dx; weight, bias, dweight, dbias
  EXPECT_EQ(results[1].flops, n * (2 * o.W + 9 + 2 * o.W - 1 + 2 * o.W + 1));
  // 64 sequences of one position: x, y in bf16, each state (W-1 fp32) read and written.
  const double decoded = 64.0 * o.C;
  EXPECT_EQ(results[2].pass, "decode, 64 sequences from a pool");
  EXPECT_EQ(results[2].bytes, 2 * decoded * 2 + 2 * decoded * (o.W - 1) * 4 + taps);
  EXPECT_EQ(results[2].flops, decoded * (2 * o.W + 6));
  EXPECT_FALSE(results[2].baseline_seconds);
  for (const tool::PassResult& r : results) {
    EXPECT_GT(r.seconds, 0) << r.pass;
    EXPECT_GT(r.gbs(), 0) << r.pass;
    if (&r == &results[2]) continue;
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

// `flat run` in process: inputs written as .npy files to a temporary directory, the command run,
// its outputs read back and compared with the float64 oracle; sequences and the state pool
// (packed sequences bitwise what each writes alone, the pool read and written at the indexed rows
// only); the bad inputs and arguments it must reject with one line naming the culprit and nothing
// written; and the .npy reader and writer on their own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "cli_files.h"
#include "harness.h"
#include "npy.h"
#include "run.h"
#include "run_io.h"

namespace flat::test {
namespace {

namespace fs = std::filesystem;
using tool::NpyArray;
using tool::NpyError;
using tool::read_npy;
using tool::write_npy;

std::vector<int64_t> state_shape(const Problem& p) { return {p.c.B, p.N, p.c.K, p.c.V}; }

// A delta-rule strength the variant takes, read from NAME.npy, its gradient written to dNAME.npy.
struct Strength {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<double> ref::Inputs::*input;
  std::vector<double> ref::Gradients::*gradient;
};

// beta, or gdn2's b and w; none for the additive family.
std::vector<Strength> strengths(const Problem& p) {
  const Case& c = p.c;
  if (p.ref.has_erase_write())
    return {{"b", {c.B, c.S, c.Nb, c.K}, &ref::Inputs::b, &ref::Gradients::db},
            {"w", {c.B, c.S, c.Nw, c.V}, &ref::Inputs::w, &ref::Gradients::dw}};
  if (p.ref.has_beta()) return {{"beta", {c.B, c.S, c.Nb}, &ref::Inputs::beta, &ref::Gradients::dbeta}};
  return {};
}

// The problem's inputs as the files `flat run` reads; dy and dht only for a backward run.
std::vector<InputFile> input_files(const Problem& p, bool backward) {
  const Case& c = p.c;
  std::vector<InputFile> files{{"q.npy", {c.B, c.S, c.Nq, c.K}, p.in.q},
                               {"k.npy", {c.B, c.S, c.Nk, c.K}, p.in.k},
                               {"v.npy", {c.B, c.S, c.Nv, c.V}, p.in.v}};
  if (p.ref.has_gate()) files.push_back({"g.npy", gate_shape(c), p.in.g});
  for (const Strength& strength : strengths(p))
    files.push_back({strength.name + ".npy", strength.shape, p.in.*strength.input});
  if (c.h0) files.push_back({"h0.npy", state_shape(p), p.in.h0});
  if (!backward) return files;
  files.push_back({"dy.npy", {c.B, c.S, p.N, c.V}, p.dy});
  if (c.dht) files.push_back({"dht.npy", state_shape(p), p.dht});
  return files;
}

void write_inputs(const fs::path& dir, const Problem& p, bool backward) {
  for (const InputFile& file : input_files(p, backward)) write(dir / file.name, file.shape, file.values);
}

struct RunCase {
  RunCase(const Case& c_, bool backward_, std::optional<float> scale_ = std::nullopt)
      : c(c_), backward(backward_), scale(scale_) {}

  Case c;
  bool backward;
  std::optional<float> scale;  // given as --scale; otherwise the default K^-1/2

  std::string name() const { return c.name() + (backward ? "_bwd" : "_fwd") + (scale ? "_scale" : ""); }
};

void PrintTo(const RunCase& run, std::ostream* os) { *os << run.name(); }

std::vector<RunCase> run_cases() {
  std::vector<RunCase> cases;
  for (Variant variant : variants_where(additive)) {
    // Two batches, S not a multiple of the chunk.
    Case c;
    c.variant = variant;
    c.B = 2;
    c.S = 70;
    c.chunk = 32;
    c.K = 16;
    c.V = 8;
    cases.emplace_back(c, false);
    c.h0 = c.dht = true;
    cases.emplace_back(c, true);
    // Head sharing, h0 without dht.
    c.Nq = c.Nk = 1;
    c.Nv = c.Ng = 2;
    c.dht = false;
    cases.emplace_back(c, true);
  }
  Case bf16;
  bf16.dtype = DType::bf16;
  bf16.S = 40;
  bf16.chunk = 16;
  bf16.K = 32;
  bf16.V = 16;
  bf16.Nq = bf16.Nk = bf16.Nv = bf16.Ng = 2;
  bf16.h0 = bf16.dht = true;
  for (Variant variant : {Variant::mamba2, Variant::gla}) {
    bf16.variant = variant;
    cases.emplace_back(bf16, true);
  }
  // The delta family: the same shapes with beta (gdn2: b and w) shared like the gate. SLA's
  // default of 64 channels per gate value does not divide K = 16: --gate-group 8.
  for (Variant variant : variants_where(delta_rule)) {
    Case c;
    c.variant = variant;
    c.B = 2;
    c.S = 70;
    c.chunk = 32;
    c.K = 16;
    c.V = 8;
    fit_gate_group(c);
    cases.emplace_back(c, false);
    c.h0 = c.dht = true;
    c.beta_max = 2.0;
    cases.emplace_back(c, true);
    c.Nq = c.Nk = 1;
    c.Nv = c.Ng = c.Nb = c.Nw = 2;
    c.dht = false;
    cases.emplace_back(c, true);
  }
  // bf16 with grouped gates and each solve; sla at its default gate group.
  Case delta = bf16;
  delta.Nb = delta.Nw = 2;
  for (auto [variant, G, solve] : {std::tuple{Variant::kda, 4, Solve::substitution},
                                   std::tuple{Variant::gdn2, 8, Solve::doubling},
                                   std::tuple{Variant::sla, 0, Solve::blocked}}) {
    delta.variant = variant;
    delta.G = G;
    delta.solve = solve;
    delta.K = variant == Variant::sla ? 64 : 32;
    cases.emplace_back(delta, true);
  }
  // At fast precision (L2-normalised keys, as the delta family's models run it).
  Case fast = delta;
  fast.variant = Variant::gated_deltanet;
  fast.G = 0;
  fast.solve = Solve::automatic;
  fast.l2norm = true;
  fast.precision = Precision::fast;
  cases.emplace_back(fast, true);
  Case options;
  options.variant = Variant::retnet;
  options.S = 33;
  options.chunk = 16;
  options.l2norm = true;
  options.threads = 1;
  cases.emplace_back(options, true, 0.3f);
  return cases;
}

class CliRun : public ::testing::TestWithParam<RunCase> {};

TEST_P(CliRun, MatchesOracle) {
  const RunCase& run = GetParam();
  const Case& c = run.c;
  Problem p(c);
  if (run.scale) p.ref.scale = *run.scale;
  TempDir in{"flat_cli_"}, scratch{"flat_cli_"};
  const fs::path out = scratch / "out";  // created by the command
  write_inputs(in.path(), p, run.backward);

  std::vector<std::string> args{std::string(variant_name(c.variant)), "--in", in.path().string(), "--out",
                                out.string(), "--dtype", std::string(dtype_name(c.dtype)), "--chunk",
                                std::to_string(c.chunk), "--threads", std::to_string(c.threads)};
  if (c.l2norm) args.push_back("--l2norm");
  if (run.scale) args.insert(args.end(), {"--scale", std::to_string(*run.scale)});
  if (c.G > 0) args.insert(args.end(), {"--gate-group", std::to_string(c.G)});
  if (c.solve != Solve::automatic) args.insert(args.end(), {"--solve", std::string(solve_name(c.solve))});
  if (c.precision != Precision::exact)
    args.insert(args.end(), {"--precision", std::string(precision_name(c.precision))});
  std::ostringstream stdout_text, stderr_text;
  ASSERT_EQ(tool::run_command(args, stdout_text, stderr_text), 0) << stderr_text.str();
  EXPECT_EQ(stderr_text.str(), "");

  std::set<std::string> expected{"y.npy", "ht.npy"};
  if (run.backward) {
    expected.insert({"dq.npy", "dk.npy", "dv.npy"});
    if (p.ref.has_gate()) expected.insert("dg.npy");
    if (c.h0) expected.insert("dh0.npy");
    for (const Strength& strength : strengths(p)) expected.insert("d" + strength.name + ".npy");
  }
  EXPECT_EQ(file_names(out), expected);

  const auto error_of = [&](const std::string& name, const std::vector<int64_t>& shape, const std::vector<double>& want) {
    return relative_error(read_output(out / name, shape), want);
  };
  Errors e;
  const ref::Outputs want = ref::forward(p.ref, p.in);
  e.y = error_of("y.npy", {c.B, c.S, p.N, c.V}, want.y);
  e.ht = error_of("ht.npy", state_shape(p), want.ht);
  if (run.backward) {
    const ref::Gradients dwant = ref::backward(p.ref, p.in, p.dy, p.dht);
    e.dq = error_of("dq.npy", {c.B, c.S, c.Nq, c.K}, dwant.dq);
    e.dk = error_of("dk.npy", {c.B, c.S, c.Nk, c.K}, dwant.dk);
    e.dv = error_of("dv.npy", {c.B, c.S, c.Nv, c.V}, dwant.dv);
    if (p.ref.has_gate()) e.dg = error_of("dg.npy", gate_shape(c), dwant.dg);
    for (const Strength& strength : strengths(p)) {
      double& error = strength.name == "beta" ? e.dbeta : strength.name == "b" ? e.db : e.dw;
      error = error_of("d" + strength.name + ".npy", strength.shape, dwant.*strength.gradient);
    }
    if (c.h0) e.dh0 = error_of("dh0.npy", state_shape(p), dwant.dh0);
  }
  expect_within_bounds(e, c.dtype, c.precision);
}

INSTANTIATE_TEST_SUITE_P(Variants, CliRun, ::testing::ValuesIn(run_cases()),
                         [](const ::testing::TestParamInfo<RunCase>& info) {
                           return std::to_string(info.index) + "_" + info.param.name();
                         });

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// ---- Sequences and the state pool ------------------------------------------------------------

// A value no state takes, in the pool rows no sequence reads or writes.
constexpr double kSentinel = 12345.0;

// Sequences of the given lengths packed along S of one batch row (cu_seqlens.npy), of a variant
// whose inputs are all per token (not retnet's gate of one value per head), so that each
// sequence's inputs are the packed ones' tokens.
struct Packed {
  Packed(Variant variant, DType dtype, const std::vector<int64_t>& lengths, bool backward_)
      : c(make_case(variant, dtype, lengths)), p(c), backward(backward_), cu{0} {
    for (int64_t n : lengths) cu.push_back(cu.back() + n);
  }

  static Case make_case(Variant variant, DType dtype, const std::vector<int64_t>& lengths) {
    Case c;
    c.variant = variant;
    c.dtype = dtype;
    c.S = int(std::accumulate(lengths.begin(), lengths.end(), int64_t{0}));
    c.chunk = 16;
    c.K = 16;
    c.V = 8;
    return c;
  }

  int64_t count() const { return int64_t(cu.size()) - 1; }
  int64_t length(int64_t i) const { return cu[size_t(i) + 1] - cu[size_t(i)]; }
  size_t state() const { return size_t(p.N) * size_t(c.K) * size_t(c.V); }  // elements of one state
  std::vector<int64_t> states(int64_t rows) const { return {rows, p.N, c.K, c.V}; }

  // The files along the tokens: q, k, v, g, the strengths and, for a backward, dy.
  std::vector<InputFile> tokens() const { return input_files(p, backward); }
  // y and, for a backward, the gradients of the token inputs.
  std::vector<std::string> token_outputs() const {
    std::vector<std::string> names{"y.npy"};
    if (backward)
      for (const InputFile& file : tokens())
        if (file.name != "dy.npy") names.push_back("d" + file.name);
    return names;
  }

  // Writes the tokens of sequence i (of all with -1, and cu_seqlens.npy) into `dir`.
  void write_tokens(const fs::path& dir, int64_t i = -1, int64_t n = -1) const {
    for (const InputFile& file : tokens()) {
      const InputFile cut = i < 0 ? file : file.tokens(cu[size_t(i)], n < 0 ? length(i) : n);
      write(dir / cut.name, cut.shape, cut.values);
    }
    if (i < 0) write_indices(dir / "cu_seqlens.npy", cu);
  }

  std::vector<std::string> args(const fs::path& in, const fs::path& out) const {
    return {std::string(variant_name(c.variant)), "--in",  in.string(), "--out", out.string(), "--dtype",
            std::string(dtype_name(c.dtype)),     "--chunk", std::to_string(c.chunk)};
  }

  Case c;
  Problem p;
  bool backward;
  std::vector<int64_t> cu;
};

// Runs sequence i alone from `h0` (one state; empty: from zero), with `dht` for a backward.
void run_alone(const Packed& s, int64_t i, const std::vector<double>& h0, const std::vector<double>& dht,
               const fs::path& out) {
  TempDir in{"flat_cli_seq_"};
  s.write_tokens(in.path(), i);
  if (!h0.empty()) write(in / "h0.npy", s.states(1), h0);
  if (s.backward) write(in / "dht.npy", s.states(1), dht);
  ASSERT_TRUE(run_ok(s.args(in.path(), out)));
}

// Sequence i's tokens of every token output of the packed run: bitwise the files it wrote alone.
void expect_tokens_alone(const Packed& s, int64_t i, const fs::path& packed, const fs::path& alone) {
  for (const std::string& name : s.token_outputs()) {
    const NpyArray whole = read_npy(packed / name);
    const std::vector<float> tokens = rows(whole.data, row_size(whole.shape, 1), s.cu[size_t(i)], s.length(i));
    EXPECT_TRUE(same_bits(tokens, floats(alone / name))) << name << " of sequence " << i;
  }
}

// Sequences of lengths 5, 0, 17 and 40 (chunk 16) packed along S, each with its row of h0.npy and
// dht.npy, forward and backward: every output file holds, bit for bit, what each sequence writes
// run alone; the empty one passes its state through (ht = h0, dh0 = dht).
TEST(CliSequences, PackedEqualsOneByOne) {
  for (const auto& [variant, dtype] :
       {std::pair{Variant::gated_deltanet, DType::f32}, std::pair{Variant::gla, DType::bf16}}) {
    SCOPED_TRACE(std::string(variant_name(variant)) + " " + std::string(dtype_name(dtype)));
    const Packed s(variant, dtype, {5, 0, 17, 40}, true);
    const size_t state = s.state();
    const std::vector<double> h0 = random_values(size_t(s.count()) * state, 1),
                              dht = random_values(size_t(s.count()) * state, 2);
    TempDir in{"flat_cli_seq_"}, scratch{"flat_cli_seq_"};
    s.write_tokens(in.path());
    write(in / "h0.npy", s.states(s.count()), h0);
    write(in / "dht.npy", s.states(s.count()), dht);
    const fs::path packed = scratch / "packed";
    ASSERT_TRUE(run_ok(s.args(in.path(), packed)));
    std::set<std::string> expected{"ht.npy", "dh0.npy"};
    for (const std::string& name : s.token_outputs()) expected.insert(name);
    EXPECT_EQ(file_names(packed), expected);
    EXPECT_EQ(read_npy(packed / "ht.npy").shape, s.states(s.count()));
    EXPECT_EQ(read_npy(packed / "dh0.npy").shape, s.states(s.count()));

    const std::vector<float> ht = floats(packed / "ht.npy"), dh0 = floats(packed / "dh0.npy");
    for (int64_t i = 0; i < s.count(); ++i) {
      const std::vector<double> h0_i = rows(h0, state, i, 1), dht_i = rows(dht, state, i, 1);
      if (s.length(i) == 0) {
        EXPECT_TRUE(same_bits(rows(ht, state, i, 1), as_floats(h0_i))) << "ht of empty sequence " << i;
        EXPECT_TRUE(same_bits(rows(dh0, state, i, 1), as_floats(dht_i))) << "dh0 of empty sequence " << i;
        continue;
      }
      const fs::path alone = scratch / ("alone" + std::to_string(i));
      run_alone(s, i, h0_i, dht_i, alone);
      expect_tokens_alone(s, i, packed, alone);
      EXPECT_TRUE(same_bits(rows(ht, state, i, 1), floats(alone / "ht.npy"))) << "ht of sequence " << i;
      EXPECT_TRUE(same_bits(rows(dh0, state, i, 1), floats(alone / "dh0.npy"))) << "dh0 of sequence " << i;
    }
  }
}

// A pool of 6 rows, the sentinel but in the two rows sequences start from: initial_state_indices
// {4, -1, 1} (an int32 file) and final_state_indices {1, 5, -1}. ht.npy is the pool with row 1
// the first sequence's final state, row 5 the empty second one's (zero), every other row as it
// was, bit for bit. Row 1 is written though the third sequence starts from it: the run updates a
// copy of the pool and reads the rows as they were. y, the gradients along the tokens and dh0 (a
// row per sequence) are each sequence's alone.
TEST(CliSequences, PoolReadsAndWritesIndexedRows) {
  const Packed s(Variant::gated_deltanet, DType::f32, {7, 0, 23}, true);
  const std::vector<int64_t> reads{4, -1, 1}, writes{1, 5, -1};
  const int64_t P = 6;
  const size_t state = s.state();
  std::vector<double> pool(size_t(P) * state, kSentinel);
  const std::vector<double> values = random_values(pool.size(), 3), dht = random_values(size_t(s.count()) * state, 4);
  for (int64_t r : reads)
    if (r >= 0) set_row(pool, r, rows(values, state, r, 1));
  TempDir in{"flat_cli_seq_"}, scratch{"flat_cli_seq_"};
  s.write_tokens(in.path());
  write_indices(in / "initial_state_indices.npy", reads, "<i4");
  write_indices(in / "final_state_indices.npy", writes);
  write(in / "h0.npy", s.states(P), pool);
  write(in / "dht.npy", s.states(s.count()), dht);
  const fs::path packed = scratch / "packed";
  ASSERT_TRUE(run_ok(s.args(in.path(), packed)));
  EXPECT_EQ(read_npy(packed / "ht.npy").shape, s.states(P));
  EXPECT_EQ(read_npy(packed / "dh0.npy").shape, s.states(s.count()));

  std::vector<float> expected = as_floats(pool);
  const std::vector<float> dh0 = floats(packed / "dh0.npy");
  for (int64_t i = 0; i < s.count(); ++i) {
    const int64_t read = reads[size_t(i)], to = writes[size_t(i)];
    const std::vector<double> start = read >= 0 ? rows(pool, state, read, 1) : std::vector<double>{};
    std::vector<float> final_state = read >= 0 ? as_floats(start) : std::vector<float>(state, 0.0f);
    if (s.length(i) == 0) {
      EXPECT_TRUE(same_bits(rows(dh0, state, i, 1), as_floats(rows(dht, state, i, 1)))) << "dh0 of " << i;
    } else {
      const fs::path alone = scratch / ("alone" + std::to_string(i));
      run_alone(s, i, start, rows(dht, state, i, 1), alone);
      expect_tokens_alone(s, i, packed, alone);
      final_state = floats(alone / "ht.npy");
      EXPECT_TRUE(same_bits(rows(dh0, state, i, 1), floats(alone / "dh0.npy"))) << "dh0 of " << i;
    }
    if (to >= 0) set_row(expected, to, final_state);
  }
  const std::vector<float> ht = floats(packed / "ht.npy");
  for (int64_t r = 0; r < P; ++r)
    EXPECT_TRUE(same_bits(rows(ht, state, r, 1), rows(expected, state, r, 1))) << "pool row " << r;
}

// token_state_indices (with final_state_indices, each row written once in all) into a pool of 7
// rows: each kept token's row holds, bit for bit, the state after it, what that sequence's tokens
// up to it give run alone through the same decode path (a one-row pool, no token kept, the final
// state to row 0); row 0, read, and row 6, the sentinel, stay as they were.
TEST(CliSequences, TokenStatesGoToTheirRows) {
  const Packed s(Variant::gla, DType::f32, {3, 2}, false);
  const std::vector<int64_t> reads{0, -1}, finals{-1, 1}, tokens{4, -1, 2, 5, 3};
  const int64_t P = 7;
  const size_t state = s.state();
  std::vector<double> pool(size_t(P) * state, kSentinel);
  set_row(pool, 0, random_values(state, 5));  // the first sequence's start
  TempDir in{"flat_cli_seq_"}, scratch{"flat_cli_seq_"};
  s.write_tokens(in.path());
  write_indices(in / "initial_state_indices.npy", reads);
  write_indices(in / "final_state_indices.npy", finals);
  write_indices(in / "token_state_indices.npy", tokens);
  write(in / "h0.npy", s.states(P), pool);
  const fs::path packed = scratch / "packed";
  ASSERT_TRUE(run_ok(s.args(in.path(), packed)));

  std::vector<float> expected = as_floats(pool);
  for (int64_t i = 0; i < s.count(); ++i) {
    for (int64_t n = 1; n <= s.length(i); ++n) {
      TempDir one{"flat_cli_seq_"};
      s.write_tokens(one.path(), i, n);
      const int64_t read = reads[size_t(i)];
      // A one-row pool: the sequence's start row, or a row it does not read (its index -1).
      write(one / "h0.npy", s.states(1), rows(pool, state, read >= 0 ? read : P - 1, 1));
      write_indices(one / "initial_state_indices.npy", {read >= 0 ? 0 : -1});
      write_indices(one / "final_state_indices.npy", {0});
      write_indices(one / "token_state_indices.npy", std::vector<int64_t>(size_t(n), -1));
      const fs::path alone = scratch / ("alone" + std::to_string(i) + "_" + std::to_string(n));
      ASSERT_TRUE(run_ok(s.args(one.path(), alone)));
      const std::vector<float> after = floats(alone / "ht.npy");
      for (const int64_t to : {tokens[size_t(s.cu[size_t(i)] + n - 1)], n == s.length(i) ? finals[size_t(i)] : -1})
        if (to >= 0) set_row(expected, to, after);
      if (n == s.length(i)) expect_tokens_alone(s, i, packed, alone);
    }
  }
  const std::vector<float> ht = floats(packed / "ht.npy");
  ASSERT_EQ(ht.size(), expected.size());
  for (int64_t r = 0; r < P; ++r)
    EXPECT_TRUE(same_bits(rows(ht, state, r, 1), rows(expected, state, r, 1))) << "pool row " << r;
}

// A valid la problem in `in` (or one of another variant), to be broken one way per test.
class CliErrors : public ::testing::Test {
 protected:
  CliErrors() { write_problem(Variant::la); }

  // Writes the inputs of a valid problem of `variant` over the directory's.
  void write_problem(Variant variant) const {
    Case c;
    c.variant = variant;
    c.S = 10;
    c.K = 16;
    c.V = 8;
    write_inputs(in.path(), Problem(c), true);
  }

  std::vector<std::string> args(const std::string& variant = "la") const {
    return {variant, "--in", in.path().string(), "--out", out.string()};
  }

  // The command fails with status 2 and exactly one line on err that mentions `culprit`, and
  // writes nothing (the output directory is not even created).
  void expect_rejected(const std::vector<std::string>& command, const std::string& culprit) const {
    const bool out_existed = fs::exists(out);
    std::ostringstream stdout_text, stderr_text;
    EXPECT_EQ(tool::run_command(command, stdout_text, stderr_text), 2);
    const std::string message = stderr_text.str();
    EXPECT_TRUE(message.starts_with("flat run: ")) << message;
    EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 1) << message;
    EXPECT_TRUE(message.ends_with("\n")) << message;
    EXPECT_NE(message.find(culprit), std::string::npos) << "'" << culprit << "' not in: " << message;
    if (out_existed) EXPECT_TRUE(fs::is_empty(out));
    else EXPECT_FALSE(fs::exists(out));
  }

  TempDir in{"flat_cli_"}, scratch{"flat_cli_"};
  fs::path out = scratch / "out";
};

TEST_F(CliErrors, ValidInputsRun) {
  std::ostringstream stdout_text, stderr_text;
  EXPECT_EQ(tool::run_command(args(), stdout_text, stderr_text), 0) << stderr_text.str();
  EXPECT_EQ(file_names(out), (std::set<std::string>{"y.npy", "ht.npy", "dq.npy", "dk.npy", "dv.npy"}));
}

// An input file the run would not read is refused by name: it says the user meant something else.
TEST_F(CliErrors, RefusesFilesItWouldNotRead) {
  write_text(in / "g.npy", "not read");
  expect_rejected(args(), "g.npy: la takes no gate, remove the file");
  fs::remove(in / "g.npy");
  for (const auto& [file, culprit] : {std::pair{"beta.npy", "beta.npy: la takes no strength beta"},
                                      std::pair{"b.npy", "b.npy: la takes no erase gate b"},
                                      std::pair{"w.npy", "w.npy: la takes no write gate w"}}) {
    write_text(in / file, "not read");
    expect_rejected(args(), culprit);
    fs::remove(in / file);
  }
  write_problem(Variant::kda);
  write_text(in / "b.npy", "not read");
  expect_rejected(args("kda"), "b.npy: kda takes no erase gate b");
  fs::remove(in / "b.npy");
  fs::remove(in / "dy.npy");
  write_text(in / "dht.npy", "not read");
  expect_rejected(args("kda"), "dht.npy: the gradient of ht is read by a backward, which runs with dy.npy");
}

TEST_F(CliErrors, MissingInput) {
  fs::remove(in / "q.npy");
  expect_rejected(args(), "q.npy");
}

TEST_F(CliErrors, MissingGate) { expect_rejected(args("gla"), "g.npy"); }

TEST_F(CliErrors, BadMagic) {
  write_text(in / "k.npy", "PK\x03\x04 not an npy file");
  expect_rejected(args(), "k.npy");
}

TEST_F(CliErrors, WrongDtype) {
  write_raw_npy(in / "v.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 10, 1, 4), }\n",
                std::vector<float>(80));
  expect_rejected(args(), "v.npy");
}

TEST_F(CliErrors, FortranOrder) {
  write_raw_npy(in / "v.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 10, 1, 8), }\n",
                std::vector<float>(80));
  expect_rejected(args(), "v.npy");
}

TEST_F(CliErrors, TruncatedData) {
  fs::resize_file(in / "dy.npy", fs::file_size(in / "dy.npy") - 4);
  expect_rejected(args(), "dy.npy");
}

TEST_F(CliErrors, MismatchedK) {
  write(in / "k.npy", {1, 10, 1, 32}, std::vector<double>(320));
  expect_rejected(args(), "k.npy: expected shape (B=1, S=10, Nk, K=16), got (1, 10, 1, 32)");
}

TEST_F(CliErrors, WrongRank) {
  write(in / "q.npy", {10, 16}, std::vector<double>(160));
  expect_rejected(args(), "q.npy");
}

TEST_F(CliErrors, HeadCountDoesNotDivide) {
  write(in / "k.npy", {1, 10, 2, 16}, std::vector<double>(320));
  write(in / "v.npy", {1, 10, 3, 8}, std::vector<double>(240));
  expect_rejected(args(), "k.npy");
}

TEST_F(CliErrors, MismatchedGradient) {
  write(in / "dy.npy", {1, 10, 1, 4}, std::vector<double>(40));
  expect_rejected(args(), "dy.npy");
}

TEST_F(CliErrors, UnknownVariant) { expect_rejected(args("mamba3"), "mamba3"); }

TEST_F(CliErrors, MissingBeta) {
  write_problem(Variant::deltanet);
  fs::remove(in / "beta.npy");
  expect_rejected(args("deltanet"), "beta.npy");
}

TEST_F(CliErrors, BetaWithChannelAxis) {
  write_problem(Variant::gated_deltanet);
  write(in / "beta.npy", {1, 10, 1, 16}, std::vector<double>(160, 0.5));
  expect_rejected(args("gated_deltanet"), "beta.npy: expected shape (B=1, S=10, Nb), got (1, 10, 1, 16)");
}

TEST_F(CliErrors, EraseGateWithWrongK) {
  write_problem(Variant::gdn2);
  write(in / "b.npy", {1, 10, 1, 8}, std::vector<double>(80, 0.5));
  expect_rejected(args("gdn2"), "b.npy: expected shape (B=1, S=10, Nb, K=16), got (1, 10, 1, 8)");
}

TEST_F(CliErrors, MissingWriteGate) {
  write_problem(Variant::gdn2);
  fs::remove(in / "w.npy");
  expect_rejected(args("gdn2"), "w.npy");
}

TEST_F(CliErrors, StrengthHeadsDoNotDivide) {
  write_problem(Variant::kda);
  write(in / "v.npy", {1, 10, 3, 8}, std::vector<double>(240));
  write(in / "beta.npy", {1, 10, 2}, std::vector<double>(20, 0.5));
  expect_rejected(args("kda"), "beta.npy: head count Nb = 2 does not fit Nv = 3 of v.npy");
}

TEST_F(CliErrors, GateNotOfTheGroup) {
  write_problem(Variant::kda);  // g.npy (1, 10, 1, 16): one value per channel
  std::vector<std::string> command = args("kda");
  command.insert(command.end(), {"--gate-group", "4"});
  expect_rejected(command, "g.npy: expected shape (B=1, S=10, Ng, K/G=4), got (1, 10, 1, 16)");
}

TEST_F(CliErrors, GateGroupDoesNotDivideK) {
  write_problem(Variant::kda);
  std::vector<std::string> command = args("kda");
  command.insert(command.end(), {"--gate-group", "3"});
  expect_rejected(command, "--gate-group: G = 3 does not divide K = 16");
  // SLA's default group of 64 channels needs --gate-group for K = 16.
  write_problem(Variant::sla);
  expect_rejected(args("sla"), "--gate-group: G = 64 (sla's default) does not divide K = 16");
}

// Options refused one at a time: the variant, the extra arguments, what the error names.
TEST_F(CliErrors, BadOptions) {
  write_problem(Variant::kda);
  const std::vector<std::tuple<std::string, std::vector<std::string>, std::string>> cases{
      {"kda", {"--gate-group", "0"}, "--gate-group"},
      {"kda", {"--solve", "neumann"}, "solve: expected auto, subst, blocked or doubling, got 'neumann'"},
      {"la", {"--fast"}, "--fast"},
      {"la", {"--dtype", "f16"}, "--dtype"},
      {"la", {"--chunk", "64x"}, "chunk: expected an integer, got '64x'"},
      {"la", {"--threads"}, "--threads"},
      {"kda", {"--chunk", "20"}, "chunk"},  // refused by the library, not the parser
  };
  for (const auto& [variant, extra, culprit] : cases) {
    SCOPED_TRACE(culprit);
    std::vector<std::string> command = args(variant);
    command.insert(command.end(), extra.begin(), extra.end());
    expect_rejected(command, culprit);
  }
}

TEST_F(CliErrors, GateHeadsDoNotFit) {
  write_problem(Variant::gla);
  write(in / "q.npy", {1, 10, 2, 16}, std::vector<double>(320));
  write(in / "k.npy", {1, 10, 2, 16}, std::vector<double>(320));
  write(in / "v.npy", {1, 10, 2, 8}, std::vector<double>(160));
  write(in / "g.npy", {1, 10, 3, 16}, std::vector<double>(480, -0.5));
  expect_rejected(args("gla"), "g.npy: head count Ng = 3 does not fit Nq = 2 of q.npy");
}

TEST_F(CliErrors, GateAboveZero) {
  write_problem(Variant::gla);
  std::vector<double> g(160, -0.5);
  g[2 * 16 + 7] = 0.25;
  write(in / "g.npy", {1, 10, 1, 16}, g);
  expect_rejected(args("gla"), "g: expected finite values <= 0 (log-space gates), got 0.25 at [0, 2, 0, 7]");
}

// Bad sequence files on the la problem (B = 1, S = 10, K = 16, V = 8, with dy), one at a time:
// refused naming the file (its dtype, shape, the files it needs) or, for the values the library
// checks, the argument; nothing written.
TEST_F(CliErrors, BadSequenceFiles) {
  const std::vector<int64_t> pool{3, 1, 16, 8};
  const auto write_pool = [&] { write(in / "h0.npy", pool, std::vector<double>(3 * 16 * 8, 0.5)); };
  const auto two_sequences = [&] { write_indices(in / "cu_seqlens.npy", {0, 4, 10}); };
  struct Bad {
    const char* what;
    std::function<void()> files;
    std::string culprit;
  };
  const std::vector<Bad> cases{
      {"float offsets", [&] { write(in / "cu_seqlens.npy", {3}, {0, 4, 10}); },
       "cu_seqlens.npy: expected dtype '<i8' or '<i4' (little-endian int64 or int32), got '<f4'"},
      {"int16 indices",
       [&] {
         write_raw_npy(in / "initial_state_indices.npy", 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (1,), }",
                       std::vector<int16_t>{0});
       },
       "initial_state_indices.npy: expected dtype '<i8' or '<i4' (little-endian int64 or int32), got '<i2'"},
      {"indices of two axes",
       [&] {
         two_sequences();
         write_indices(in / "initial_state_indices.npy", {0, 1}, "<i8", {2, 1});
         write_pool();
       },
       "initial_state_indices.npy: expected shape (num_seqs=2), got (2, 1)"},
      {"an index per token, one short",
       [&] { write_indices(in / "token_state_indices.npy", std::vector<int64_t>(9, -1)); },
       "token_state_indices.npy: expected shape (B*S=10), got (9,)"},
      {"offsets short of S", [&] { write_indices(in / "cu_seqlens.npy", {0, 4, 9}); },
       "cu_seqlens: expected the last offset to be S = 10 (the length of q), got cu_seqlens[2] = 9"},
      {"index past the pool",
       [&] {
         two_sequences();
         write_indices(in / "initial_state_indices.npy", {0, -1});
         write_indices(in / "final_state_indices.npy", {2, 3});
         write_pool();
       },
       "final_state_indices: expected indices from -1 (none) to P-1 = 2 (the rows of ht), got "
       "final_state_indices[1] = 3"},
      {"a row written twice",
       [&] {
         two_sequences();
         write_indices(in / "initial_state_indices.npy", {-1, -1});
         write_indices(in / "final_state_indices.npy", {1, 1});
         write_pool();
       },
       "final_state_indices: expected each row of ht written once"},
      {"a pool written without initial indices",
       [&] {
         two_sequences();
         write_indices(in / "final_state_indices.npy", {0, 1});
         write_pool();
       },
       "final_state_indices.npy: expected initial_state_indices.npy beside it (ht.npy is the pool h0.npy after the "
       "run; -1 starts a sequence from zero), got none"},
      {"token states without initial indices",
       [&] { write_indices(in / "token_state_indices.npy", std::vector<int64_t>(10, -1)); },
       "token_state_indices.npy: expected initial_state_indices.npy beside it"},
      {"indices without their pool",
       [&] {
         two_sequences();
         write_indices(in / "initial_state_indices.npy", {0, 1});
       },
       "initial_state_indices.npy: expected h0.npy beside it (the pool it indexes), got none"},
      {"dht of the batch row, not of the sequences",
       [&] {
         two_sequences();
         write(in / "dht.npy", {1, 1, 16, 8}, std::vector<double>(128, 0.5));
       },
       "dht.npy: expected shape (num_seqs=2, N=1, K=16, V=8), got (1, 1, 16, 8)"},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.what);
    for (const char* name : {"cu_seqlens.npy", "initial_state_indices.npy", "final_state_indices.npy",
                             "token_state_indices.npy", "h0.npy", "dht.npy"})
      fs::remove(in / name);
    bad.files();
    expect_rejected(args(), bad.culprit);
  }
}

TEST_F(CliErrors, NumbersOutOfRange) {
  std::vector<std::string> command = args();
  command.insert(command.end(), {"--scale", "1e40"});
  expect_rejected(command, "scale: '1e40' is out of range (a number from -3.40282e+38 to 3.40282e+38)");
  command = args();
  command.insert(command.end(), {"--threads", "99999999999"});
  expect_rejected(command, "--threads: 99999999999 is out of range (an integer from");
}

// A file whose header promises more than the machine's memory (4 TiB, the file sparse, so that
// its size matches) is refused by name before anything is allocated.
TEST_F(CliErrors, InputLargerThanMemory) {
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1024, 1024, 1024, 1024), }";
  std::string padded = header + std::string((64 - (10 + header.size() + 1) % 64) % 64, ' ') + "\n";
  write_raw_npy(in / "q.npy", 1, padded, std::vector<float>{});
  fs::resize_file(in / "q.npy", fs::file_size(in / "q.npy") + (uintmax_t{1} << 42));
  expect_rejected(args(), "q.npy: shape (1024, 1024, 1024, 1024) takes 4398046511104 bytes, more than the");
}

// An output path that is taken (a directory named like an output) is found before anything is
// written: no output appears, whichever one it is.
TEST_F(CliErrors, BlockedOutputWritesNothing) {
  Case c;
  c.variant = Variant::kda;
  c.S = 10;
  c.K = 16;
  c.V = 8;
  c.h0 = true;
  write_inputs(in.path(), Problem(c), true);
  for (const char* blocked : {"dq.npy", "dh0.npy", "y.npy"}) {
    SCOPED_TRACE(blocked);
    fs::remove_all(out);
    fs::create_directories(out / blocked);
    std::ostringstream stdout_text, stderr_text;
    EXPECT_EQ(tool::run_command(args("kda"), stdout_text, stderr_text), 2);
    EXPECT_NE(stderr_text.str().find(std::string(blocked) + ": "), std::string::npos) << stderr_text.str();
    EXPECT_EQ(file_names(out), std::set<std::string>{blocked});
  }
}

// A write that fails part way (the third of five outputs) leaves no output, no temporary file and
// no directory it created.
TEST(WriteOutputs, FailureRemovesEverythingWritten) {
  TempDir scratch("flat_cli_");
  const fs::path out = scratch / "new" / "out";
  std::vector<tool::Output> outputs;
  for (const char* name : {"a.npy", "b.npy", "c.npy", "d.npy", "e.npy"})
    outputs.push_back({name, tool::Buffer({2}, DType::f32)});
  int writes = 0;
  const auto failing = [&](const tool::Output& output, const fs::path& path) {
    if (++writes == 3) throw tool::RunError("disk full");
    output.buffer.write(path);
  };
  EXPECT_THROW(tool::write_outputs(out, outputs, failing), tool::RunError);
  EXPECT_FALSE(fs::exists(scratch / "new"));

  // Into an existing directory: what was there stays, nothing new appears.
  fs::create_directories(out);
  write_text(out / "keep.txt", "kept");
  writes = 0;
  EXPECT_THROW(tool::write_outputs(out, outputs, failing), tool::RunError);
  EXPECT_EQ(file_names(out), std::set<std::string>{"keep.txt"});
  tool::write_outputs(out, outputs, [](const tool::Output& output, const fs::path& path) { output.buffer.write(path); });
  EXPECT_EQ(file_names(out), (std::set<std::string>{"keep.txt", "a.npy", "b.npy", "c.npy", "d.npy", "e.npy"}));
}

// A failed write names the output, not the temporary file it was going to.
TEST(WriteOutputs, FailureNamesTheOutput) {
  TempDir scratch("flat_cli_");
  const fs::path out = scratch / "out";
  std::vector<tool::Output> outputs;
  outputs.push_back({"y.npy", tool::Buffer({2}, DType::f32)});
  const auto full = [](const tool::Output&, const fs::path& path) {
    throw tool::RunError(path.filename().string() + ": write failed");
  };
  try {
    tool::write_outputs(out, outputs, full);
    ADD_FAILURE() << "no error";
  } catch (const tool::RunError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(message.starts_with("y.npy: cannot write ")) << message;
    EXPECT_TRUE(message.ends_with("y.npy: write failed")) << message;
    EXPECT_EQ(message.find("partial"), std::string::npos) << message;
  }
  // The file itself failing to open (a directory in the way of the temporary name).
  fs::create_directories(out);
  fs::create_directory(out / (".y.npy.partial-" + std::to_string(::getpid())));
  try {
    tool::write_outputs(out, outputs, [](const tool::Output& output, const fs::path& path) { output.buffer.write(path); });
    ADD_FAILURE() << "no error";
  } catch (const tool::RunError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(message.starts_with("y.npy: cannot write " + (out / "y.npy").string() + ": ")) << message;
    EXPECT_EQ(message.find("partial"), std::string::npos) << message;
  }
}

TEST_F(CliErrors, ExistingOutputDirStaysEmpty) {
  fs::create_directory(out);
  write_text(in / "v.npy", "");
  expect_rejected(args(), "v.npy");
}

TEST(Npy, RoundTrip) {
  TempDir dir("flat_cli_");
  const std::vector<std::vector<int64_t>> shapes{{}, {5}, {0}, {2, 3}, {1, 2, 3, 4}};
  for (const std::vector<int64_t>& shape : shapes) {
    size_t count = 1;
    for (int64_t size : shape) count *= size_t(size);
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = float(i) * 0.5f - 1.25f;
    write_npy(dir / "a.npy", shape, data.data());
    const NpyArray back = read_npy(dir / "a.npy");
    EXPECT_EQ(back.shape, shape);
    EXPECT_EQ(back.data, data);
  }
}

TEST(Npy, WritesNumpyLayout) {
  TempDir dir("flat_cli_");
  const float data[3] = {1, 2, 3};
  write_npy(dir / "a.npy", {3}, data);
  std::ifstream file(dir / "a.npy", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  // numpy.save's layout: magic, version 1.0, header length, header padded so that the data
  // starts at byte 128, a multiple of 64.
  ASSERT_EQ(bytes.size(), 128u + sizeof data);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(uint8_t(bytes[8]) + 256 * uint8_t(bytes[9]), 128 - 10);
  const std::string header = bytes.substr(10, 118);
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  EXPECT_EQ(header, dict + std::string(header.size() - dict.size() - 1, ' ') + "\n");
  EXPECT_EQ(std::memcmp(bytes.data() + 128, data, sizeof data), 0);
}

TEST(Npy, ReadsHeaderVariants) {
  TempDir dir("flat_cli_");
  const std::vector<float> data{1, 2, 3, 4, 5, 6};
  const std::pair<int, std::string> files[] = {
      {2, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}"},
      {3, "{ \"descr\" : \"<f4\" , \"fortran_order\" : False , \"shape\" : ( 2 , 3 , ) , }   \n"},
      {1, "{'descr':'<f4','fortran_order':False,'shape':(2L, 3L)}"},
  };
  for (const auto& [major, header] : files) {
    write_raw_npy(dir / "a.npy", major, header, data);
    const NpyArray array = read_npy(dir / "a.npy");
    EXPECT_EQ(array.shape, (std::vector<int64_t>{2, 3})) << header;
    EXPECT_EQ(array.data, data) << header;
  }
}

// Index arrays, int64 or int32 (widened, -1 and values past int32 kept, any shape), through the
// one reader; float32 files through read_npy only, each dtype refused by the other by name.
TEST(Npy, ReadsIndices) {
  TempDir dir("flat_cli_");
  const std::vector<int64_t> wide{0, -1, 5, int64_t{1} << 40}, narrow{7, -1, 0, 2147483647, -2147483647, 3};
  write_indices(dir / "a.npy", wide);
  EXPECT_EQ(tool::read_npy_indices(dir / "a.npy").data, wide);
  write_indices(dir / "b.npy", narrow, "<i4", {2, 3});
  const tool::NpyIndices b = tool::read_npy_indices(dir / "b.npy");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.data, narrow);

  const auto message = [](auto&& read, const fs::path& path) -> std::string {
    try {
      read(path);
    } catch (const NpyError& e) {
      return e.what();
    }
    return "accepted";
  };
  const auto read_indices = [](const fs::path& path) { tool::read_npy_indices(path); };
  write(dir / "c.npy", {2}, {1, 2});
  EXPECT_EQ(message(read_indices, dir / "c.npy"),
            "c.npy: expected dtype '<i8' or '<i4' (little-endian int64 or int32), got '<f4'");
  EXPECT_EQ(message([](const fs::path& path) { read_npy(path); }, dir / "a.npy"),
            "a.npy: expected dtype '<f4' (little-endian float32), got '<i8'");
  for (const char* descr : {"<u8", ">i8", "<i2", "|b1"}) {
    write_raw_npy(dir / "d.npy", 1, std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (1,)}",
                  std::vector<int64_t>{1});
    EXPECT_TRUE(message(read_indices, dir / "d.npy").starts_with("d.npy: expected dtype '<i8' or '<i4'")) << descr;
  }
  write_raw_npy(dir / "e.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,)}", std::vector<int64_t>{1});
  EXPECT_EQ(message(read_indices, dir / "e.npy"),
            "e.npy: truncated data: shape (3,) takes 12 bytes, the file holds 8");
}

TEST(Npy, RejectsMalformedFiles) {
  TempDir dir("flat_cli_");
  const std::vector<float> data{1, 2, 3};
  const auto rejects = [&](const std::string& why, auto&& make) {
    make(dir / "bad.npy");
    try {
      read_npy(dir / "bad.npy");
      ADD_FAILURE() << why << ": accepted";
    } catch (const NpyError& e) {
      EXPECT_TRUE(std::string(e.what()).starts_with("bad.npy: ")) << why << ": " << e.what();
    }
  };
  const auto raw = [&](int major, const std::string& header, const std::vector<float>& payload) {
    return [=](const fs::path& path) { write_raw_npy(path, major, header, payload); };
  };
  rejects("missing", [](const fs::path& path) { fs::remove(path); });
  rejects("empty", [](const fs::path& path) { write_text(path, ""); });
  rejects("version 4", raw(4, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", data));
  rejects("big-endian", raw(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (3,)}", data));
  rejects("float64", raw(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,)}", data));
  rejects("fortran", raw(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (3,)}", data));
  rejects("missing key", raw(1, "{'descr': '<f4', 'shape': (3,)}", data));
  rejects("extra key", raw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}", data));
  rejects("duplicate key", raw(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", data));
  rejects("negative axis", raw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}", data));
  rejects("unclosed", raw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,", data));
  rejects("header past the end", [](const fs::path& path) { write_text(path, std::string("\x93NUMPY\x01\x00\xe8\x03{", 11)); });
  rejects("truncated", raw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", data));
  rejects("trailing bytes", raw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", data));
  rejects("huge shape", raw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 8)}", data));
}

}  // namespace
}  // namespace flat::test

// What every `flat run` command shares: reading and checking .npy inputs, holding tensors as the
// kernels see them, and writing the outputs only after everything has succeeded, with one-line
// errors and exit status 2 otherwise.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "flat/flat.h"
#include "npy.h"

namespace flat::tool {

// Bad arguments, or input files whose shapes do not fit together.
class RunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An option's value as an integer (--threads); RunError naming the option otherwise.
template <class T>
T parse_number(const std::string& option, const std::string& text);
extern template int parse_number<int>(const std::string&, const std::string&);

// --dtype's value: f32 or bf16.
DType parse_dtype(const std::string& text);

// The VARIANT of a `flat run` command line (everything after `run`): its first argument that is
// neither an option nor an option's value, or empty when there is none. `flat run` picks the
// command by it (a variant of the recurrence, `conv` or `norm_gate`) before parsing the rest.
std::string run_variant(const std::vector<std::string>& args);

// The arguments every `flat run` command takes.
struct RunArgs {
  std::filesystem::path in, out;  // --in (a directory), --out (one, or not there yet)
  DType dtype = DType::f32;       // --dtype
  ExecutionContext context;       // --threads
};

// Walks a command's arguments: --in, --out, --dtype and --threads are read here; any other option goes to
// `option(name, value)`, which takes its value by calling value() and returns false for an option
// it does not know; any other argument goes to `positional`, which throws if it is not wanted.
// Throws RunError for a missing --in or --out and for directories that do not fit.
using OptionText = std::function<const std::string&()>;
RunArgs parse_run_args(const std::vector<std::string>& args,
                       const std::function<bool(const std::string& name, const OptionText& value)>& option,
                       const std::function<void(const std::string& text)>& positional);

// One expected axis of an input file: its name, and its size where it is already known.
struct FileAxis {
  std::string name;
  int64_t size = -1;  // -1: any size from 1
};

// Reads dir/name and checks its shape; read_optional is empty when the file is not there.
NpyArray read_input(const std::filesystem::path& dir, const std::string& name, const std::vector<FileAxis>& axes);
std::optional<NpyArray> read_optional(const std::filesystem::path& dir, const std::string& name,
                                      const std::vector<FileAxis>& axes);
// The same for a file that may take one of several shapes of different ranks (a weight shared by
// the heads or one per head): checked against the shape of its rank, and the error names them all.
NpyArray read_input(const std::filesystem::path& dir, const std::string& name,
                    const std::vector<std::vector<FileAxis>>& shapes);

// Refuses dir/name, an input file this run would not read: "NAME: WHY, remove the file".
void refuse_unread(const std::filesystem::path& dir, const std::string& name, const std::string& why);

// A tensor as the kernels see it: float32 as read, or rounded to bf16.
struct Buffer {
  Buffer(std::vector<int64_t> shape, DType dtype);
  Buffer(NpyArray array, DType dtype);

  size_t elements() const;
  // A contiguous view; shapes here have been checked to have at most 4 axes.
  Tensor view();
  void write(const std::filesystem::path& path) const;

  std::vector<int64_t> shape;
  DType dtype = DType::f32;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
};

std::optional<Buffer> buffer(std::optional<NpyArray> array, DType dtype);
Tensor view(std::optional<Buffer>& buffer);
// The gradient of an optional input: its shape and dtype, absent with it.
std::optional<Buffer> gradient_of(const std::optional<Buffer>& input);

// The sequences of a run (flat::Sequences), from optional files of its input directory, each an
// integer array (int64 or int32) of one axis:
//   cu_seqlens.npy (num_seqs+1,)           sequences packed along S of one batch row (B = 1)
//   initial_state_indices.npy (num_seqs,)  the initial states' file is a pool (P, ...), sequence i
//                                          starting from its row [i] (from zero where -1)
//   final_state_indices.npy (num_seqs,)    the final states' file is that pool after the run,
//   token_state_indices.npy (B*S,)         with sequence i's final state, token t's state, in its
//                                          row [i], [t] (nowhere where -1)
// The shapes are checked here, naming the file; the values by the library (offsets from 0 to S,
// indices within the pool, no row written twice), naming the argument.
struct SequenceFiles {
  std::vector<int64_t> cu_seqlens, initial_state_indices, final_state_indices, token_state_indices;
  int64_t count = 0;  // num_seqs: cu_seqlens' size less one, or B without cu_seqlens

  // All four, as a forward takes them.
  Sequences forward() const;
  // cu_seqlens and initial_state_indices: a backward writes no states, and its dht and dh0 have a
  // row per sequence.
  Sequences backward() const;
  // The leading axis of the initial states' file: a pool of any P rows with
  // initial_state_indices, else a row per sequence.
  FileAxis initial_state_axis() const;
  // A row per sequence (num_seqs, or B without cu_seqlens), as the states' gradients have.
  FileAxis sequence_axis() const;
  // `row` (a state's shape less its leading axis) with a row per sequence in front.
  std::vector<int64_t> per_sequence(const std::vector<int64_t>& row) const;
  // The final states' output: with final or token state indices, a copy of the initial states'
  // pool, whose rows the run does not write keep their values; else a row of `row` per sequence.
  Buffer final_states(const std::optional<Buffer>& initial, const std::vector<int64_t>& row) const;
};

// Reads the sequence files of `dir` for a batch of B rows of S tokens. `initial` and `final` name
// the command's state files (h0.npy and ht.npy, state0.npy and state.npy). A pool written needs
// initial_state_indices.npy, so that `initial` is the pool (its size, and the rows the run does not
// write), and initial_state_indices.npy needs `initial`.
SequenceFiles read_sequences(const std::filesystem::path& dir, int64_t B, int64_t S, const std::string& initial,
                             const std::string& final);

struct Output {
  std::string name;
  Buffer buffer;
};

// What a command computed: the outputs and the directory they go to.
struct RunResult {
  std::filesystem::path out;
  std::vector<Output> outputs;
};

// Writes the outputs into `dir` (created when missing) so that a failure leaves nothing behind:
// every destination is checked first (it must be absent or a regular file, which is replaced),
// each output is written to a temporary name beside it, and only when every one is written are
// they renamed into place. On any failure the temporaries, the outputs already renamed and the
// directories this call created are removed, and the error is thrown on. `write` writes one
// output to a path (a parameter so that the tests can make a write fail).
using OutputWriter = std::function<void(const Output& output, const std::filesystem::path& path)>;
void write_outputs(const std::filesystem::path& dir, const std::vector<Output>& outputs, const OutputWriter& write);

// Runs `job` (which parses, reads, checks and runs the kernels, writing nothing), then writes the
// outputs with write_outputs. Any error becomes one line on `err` naming the file, option or
// tensor, and exit status 2, with nothing written.
int run_and_write(const std::function<RunResult()>& job, std::ostream& out, std::ostream& err);

// run_and_write of a command whose job parses `args` into its Config (which names the output
// directory, `out`) and computes the outputs from it.
template <class Config>
int run_and_write(const std::vector<std::string>& args, Config (*parse)(const std::vector<std::string>&),
                  std::vector<Output> (*compute)(const Config&), std::ostream& out, std::ostream& err) {
  return run_and_write(
      [&] {
        const Config config = parse(args);
        return RunResult{config.out, compute(config)};
      },
      out, err);
}

}  // namespace flat::tool

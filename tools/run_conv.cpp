// `flat run conv`: reads the convolution's inputs from .npy files (with its sequences and state
// pool, run_io.h's SequenceFiles), runs forward (and backward when dy.npy is given) and writes the
// results as .npy files. Every file is read and checked and every kernel has run before the
// output directory is even created, so a rejected run leaves nothing behind.
#include "run_conv.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "flat/call.h"
#include "npy.h"
#include "run_io.h"

namespace flat::tool {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxTaps = 8;

// dtype: of x, y, dy, dx; weights, bias and states stay fp32. The options by the library's names
// (flat/call.h), parsed by it.
struct Config : RunArgs {
  NamedOptions options;
};

Config parse_args(const std::vector<std::string>& args) {
  Config config;
  bool has_conv = false;
  const auto option = [&](const std::string& arg, const OptionText& value) {
    if (arg != "--activation") throw RunError("unknown option '" + arg + "' for conv");
    config.options.emplace_back("activation", value());
    return true;
  };
  const auto positional = [&](const std::string& arg) {
    if (arg != "conv" || has_conv) throw RunError("unexpected argument '" + arg + "'");
    has_conv = true;
  };
  static_cast<RunArgs&>(config) = parse_run_args(args, option, positional);
  conv_options(config.options);
  return config;
}

std::vector<Output> compute(const Config& config) {
  const fs::path& dir = config.in;
  NpyArray x = read_input(dir, "x.npy", {{"B"}, {"S"}, {"C"}});
  const int64_t B = x.shape[0], S = x.shape[1], C = x.shape[2];
  NpyArray weight = read_input(dir, "weight.npy", {{"C", C}, {"W"}});
  const int64_t W = weight.shape[1];
  if (W > kMaxTaps)
    throw RunError("weight.npy: W = " + std::to_string(W) + " taps is not supported (1 to " + std::to_string(kMaxTaps) +
                   ")");
  std::optional<NpyArray> bias = read_optional(dir, "bias.npy", {{"C", C}});
  if (W == 1)
    for (const char* name : {"state0.npy", "dstate.npy", "initial_state_indices.npy", "final_state_indices.npy",
                             "token_state_indices.npy"})
      refuse_unread(dir, name, "W = 1 keeps no state");
  const SequenceFiles sequences = read_sequences(dir, B, S, "state0.npy", "state.npy");
  const std::vector<int64_t> state_row{C, W - 1};
  std::optional<NpyArray> state0 =
      W > 1 ? read_optional(dir, "state0.npy", {sequences.initial_state_axis(), {"C", C}, {"W-1", W - 1}})
            : std::nullopt;
  std::optional<NpyArray> dy = read_optional(dir, "dy.npy", {{"B", B}, {"S", S}, {"C", C}});
  if (!dy) refuse_unread(dir, "dstate.npy", "the gradient of state is read by a backward, which runs with dy.npy");
  std::optional<NpyArray> dstate =
      dy && W > 1 ? read_optional(dir, "dstate.npy", {sequences.sequence_axis(), {"C", C}, {"W-1", W - 1}})
                  : std::nullopt;

  const DType dtype = config.dtype;
  Buffer xb(std::move(x), dtype), wb(std::move(weight), DType::f32);
  std::optional<Buffer> bb = buffer(std::move(bias), DType::f32), s0 = buffer(std::move(state0), DType::f32);
  Buffer y({B, S, C}, dtype);
  std::optional<Buffer> state;
  if (W > 1) state.emplace(sequences.final_states(s0, state_row));

  const std::vector<std::pair<std::string, Tensor>> inputs{
      {"x", xb.view()}, {"weight", wb.view()}, {"bias", view(bb)}, {"state0", view(s0)}};
  NamedCall forward_call{Operation::conv_forward, {}, inputs, sequences.forward(), config.options};
  forward_call.tensors.insert(forward_call.tensors.end(), {{"y", y.view()}, {"state", view(state)}});
  call(forward_call, config.context);

  std::vector<Output> outputs;
  outputs.push_back({"y.npy", std::move(y)});
  if (state) outputs.push_back({"state.npy", std::move(*state)});
  if (!dy) return outputs;

  std::optional<Buffer> dyb = buffer(std::move(dy), dtype), dsb = buffer(std::move(dstate), DType::f32);
  Buffer dx({B, S, C}, dtype), dweight({C, W}, DType::f32);
  std::optional<Buffer> dbias, dstate0;
  if (bb) dbias.emplace(std::vector<int64_t>{C}, DType::f32);
  if (s0) dstate0.emplace(sequences.per_sequence(state_row), DType::f32);  // a row per sequence, also from a pool

  NamedCall backward_call{Operation::conv_backward, {}, inputs, sequences.backward(), config.options};
  backward_call.tensors.insert(backward_call.tensors.end(),
                               {{"dy", view(dyb)}, {"dstate", view(dsb)}, {"dx", dx.view()},
                                {"dweight", dweight.view()}, {"dbias", view(dbias)}, {"dstate0", view(dstate0)}});
  call(backward_call, config.context);

  outputs.push_back({"dx.npy", std::move(dx)});
  outputs.push_back({"dweight.npy", std::move(dweight)});
  if (dbias) outputs.push_back({"dbias.npy", std::move(*dbias)});
  if (dstate0) outputs.push_back({"dstate0.npy", std::move(*dstate0)});
  return outputs;
}

}  // namespace

int run_conv_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return run_and_write(args, parse_args, compute, out, err);
}

}  // namespace flat::tool

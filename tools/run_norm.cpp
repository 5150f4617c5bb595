// `flat run norm_gate`: reads the output norm and gate's inputs from .npy files, runs forward (and
// backward when dy.npy is given) and writes the results as .npy files. Every file is read and
// checked and every kernel has run before the output directory is even created, so a rejected
// run leaves nothing behind.
#include "run_norm.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "flat/call.h"
#include "npy.h"
#include "run_io.h"

namespace flat::tool {
namespace {

namespace fs = std::filesystem;

// dtype: of x, g, y, dy, dx, dg; weight and dweight stay fp32. The options by the library's names
// (flat/call.h), parsed by it.
struct Config : RunArgs {
  NamedOptions options;
  // The options that only mean something with a gate, as given, so that a run without g.npy
  // can say they were ignored rather than silently drop them.
  std::optional<std::string> gate_option;
};

Config parse_args(const std::vector<std::string>& args) {
  Config config;
  bool has_norm_gate = false;
  const auto option = [&](const std::string& arg, const OptionText& value) {
    if (arg == "--activation") {
      config.options.emplace_back("activation", value());
      config.gate_option = arg;
    } else if (arg == "--gate-first") {
      config.options.emplace_back("norm_before_gate", false);
      config.gate_option = arg;
    } else if (arg == "--eps") {
      config.options.emplace_back("eps", value());
    } else {
      throw RunError("unknown option '" + arg + "' for norm_gate");
    }
    return true;
  };
  const auto positional = [&](const std::string& arg) {
    if (arg != "norm_gate" || has_norm_gate) throw RunError("unexpected argument '" + arg + "'");
    has_norm_gate = true;
  };
  static_cast<RunArgs&>(config) = parse_run_args(args, option, positional);
  norm_gate_options(config.options);
  return config;
}

std::vector<Output> compute(const Config& config) {
  const fs::path& dir = config.in;
  NpyArray x = read_input(dir, "x.npy", {{"B"}, {"S"}, {"N"}, {"D"}});
  const int64_t B = x.shape[0], S = x.shape[1], N = x.shape[2], D = x.shape[3];
  const std::vector<FileAxis> rows{{"B", B}, {"S", S}, {"N", N}, {"D", D}};
  NpyArray weight = read_input(dir, "weight.npy", std::vector<std::vector<FileAxis>>{{{"D", D}}, {{"N", N}, {"D", D}}});
  std::optional<NpyArray> g = read_optional(dir, "g.npy", rows);
  if (!g && config.gate_option)
    throw RunError(*config.gate_option + ": given, but there is no g.npy in " + dir.string() + " to gate with");
  std::optional<NpyArray> dy = read_optional(dir, "dy.npy", rows);

  const DType dtype = config.dtype;
  Buffer xb(std::move(x), dtype), wb(std::move(weight), DType::f32);
  std::optional<Buffer> gb = buffer(std::move(g), dtype);
  Buffer y(xb.shape, dtype);

  const std::vector<std::pair<std::string, Tensor>> inputs{{"x", xb.view()}, {"g", view(gb)}, {"weight", wb.view()}};
  NamedCall forward_call{Operation::norm_gate_forward, {}, inputs, {}, config.options};
  forward_call.tensors.emplace_back("y", y.view());
  call(forward_call, config.context);

  std::vector<Output> outputs;
  outputs.push_back({"y.npy", std::move(y)});
  if (!dy) return outputs;

  Buffer dyb(std::move(*dy), dtype);
  // Gradients take their input's shape and dtype.
  Buffer dx(xb.shape, dtype), dweight(wb.shape, DType::f32);
  std::optional<Buffer> dg = gradient_of(gb);

  NamedCall backward_call{Operation::norm_gate_backward, {}, inputs, {}, config.options};
  backward_call.tensors.insert(backward_call.tensors.end(), {{"dy", dyb.view()}, {"dx", dx.view()}, {"dg", view(dg)},
                                                             {"dweight", dweight.view()}});
  call(backward_call, config.context);

  outputs.push_back({"dx.npy", std::move(dx)});
  if (dg) outputs.push_back({"dg.npy", std::move(*dg)});
  outputs.push_back({"dweight.npy", std::move(dweight)});
  return outputs;
}

}  // namespace

int run_norm_gate_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return run_and_write(args, parse_args, compute, out, err);
}

}  // namespace flat::tool

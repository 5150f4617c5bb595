// `flat run conv`: reads the convolution's inputs from .npy files, runs forward (and backward when
// dy.npy is given) and writes the results as .npy files. Every file is read and checked and every
// kernel has run before the output directory is even created, so a rejected run leaves nothing
// behind.
#include "run_conv.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flat/flat.h"
#include "npy.h"

namespace flat::tool {
namespace {

namespace fs = std::filesystem;

class RunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr int kMaxTaps = 8;

struct Config {
  fs::path in, out;
  DType dtype = DType::f32;  // of x, y, dy, dx; weights, bias and states stay fp32
  ConvOptions options;
};

// Options that take a value; anything else starting with "-" is a flag.
bool takes_value(std::string_view option) { return option != "--l2norm"; }

int parse_int(const std::string& option, const std::string& text) {
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [next, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || next != end)
    throw RunError(option + ": expected an integer, got '" + text + "'");
  return value;
}

Config parse_args(const std::vector<std::string>& args) {
  Config config;
  bool has_conv = false, has_in = false, has_out = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const auto value = [&]() -> const std::string& {
      if (i + 1 == args.size()) throw RunError(arg + ": missing value");
      return args[++i];
    };
    if (arg == "--in") {
      config.in = value();
      has_in = true;
    } else if (arg == "--out") {
      config.out = value();
      has_out = true;
    } else if (arg == "--dtype") {
      const std::string& text = value();
      if (text == "f32") config.dtype = DType::f32;
      else if (text == "bf16") config.dtype = DType::bf16;
      else throw RunError("--dtype: expected f32 or bf16, got '" + text + "'");
    } else if (arg == "--activation") {
      const std::string& text = value();
      if (text == "silu") config.options.activation = Activation::silu;
      else if (text == "none") config.options.activation = Activation::none;
      else throw RunError("--activation: expected silu or none, got '" + text + "'");
    } else if (arg == "--threads") {
      config.options.threads = parse_int(arg, value());
    } else if (arg.starts_with("-")) {
      throw RunError("unknown option '" + arg + "' for conv");
    } else if (arg != "conv" || has_conv) {
      throw RunError("unexpected argument '" + arg + "'");
    } else {
      has_conv = true;
    }
  }
  if (!has_in) throw RunError("missing --in DIR");
  if (!has_out) throw RunError("missing --out DIR");
  if (!fs::is_directory(config.in)) throw RunError("--in " + config.in.string() + ": not a directory");
  if (fs::exists(config.out) && !fs::is_directory(config.out))
    throw RunError("--out " + config.out.string() + ": exists and is not a directory");
  return config;
}

struct Axis {
  std::string name;
  int64_t size = -1;  // -1: any size from 1
};

std::string format_axes(const std::vector<Axis>& axes) {
  std::string s = "(";
  for (size_t d = 0; d < axes.size(); ++d)
    s += (d ? ", " : "") + axes[d].name + (axes[d].size >= 0 ? "=" + std::to_string(axes[d].size) : "");
  return s + ")";
}

NpyArray read_input(const fs::path& dir, const std::string& name, const std::vector<Axis>& axes) {
  NpyArray array = read_npy(dir / name);
  bool fits = array.shape.size() == axes.size();
  for (size_t d = 0; fits && d < axes.size(); ++d) fits = axes[d].size < 0 || array.shape[d] == axes[d].size;
  if (!fits) throw RunError(name + ": expected shape " + format_axes(axes) + ", got " + format_shape(array.shape));
  for (size_t d = 0; d < axes.size(); ++d)
    if (array.shape[d] < 1)
      throw RunError(name + ": axis " + axes[d].name + " is empty in shape " + format_shape(array.shape));
  return array;
}

std::optional<NpyArray> read_optional(const fs::path& dir, const std::string& name, const std::vector<Axis>& axes) {
  if (!fs::exists(dir / name)) return std::nullopt;
  return read_input(dir, name, axes);
}

// A tensor as the kernels see it: float32 as read, or rounded to bf16.
struct Buffer {
  std::vector<int64_t> shape;
  DType dtype = DType::f32;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  Buffer(std::vector<int64_t> shape_, DType dtype_) : shape(std::move(shape_)), dtype(dtype_) {
    size_t count = 1;
    for (int64_t size : shape) count *= size_t(size);
    if (dtype == DType::bf16) bf16.assign(count, 0);
    else f32.assign(count, 0.0f);
  }
  Buffer(NpyArray array, DType dtype_) : shape(std::move(array.shape)), dtype(dtype_) {
    if (dtype == DType::bf16) {
      bf16.resize(array.data.size());
      std::ranges::transform(array.data, bf16.begin(), to_bf16);
    } else {
      f32 = std::move(array.data);
    }
  }
  Tensor view() {
    return Tensor::contiguous(dtype == DType::bf16 ? static_cast<void*>(bf16.data()) : f32.data(), dtype, shape);
  }
  void write(const fs::path& path) const {
    if (dtype == DType::f32) return write_npy(path, shape, f32.data());
    std::vector<float> wide(bf16.size());
    std::ranges::transform(bf16, wide.begin(), from_bf16);
    write_npy(path, shape, wide.data());
  }
};

std::optional<Buffer> buffer(std::optional<NpyArray> array, DType dtype) {
  if (!array) return std::nullopt;
  return Buffer(std::move(*array), dtype);
}

Tensor view(std::optional<Buffer>& b) { return b ? b->view() : Tensor{}; }

struct Output {
  std::string name;
  Buffer buffer;
};

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
  const std::vector<Axis> state_axes{{"B", B}, {"C", C}, {"W-1", W - 1}};
  if (W == 1)
    for (const char* name : {"state0.npy", "dstate.npy"})
      if (fs::exists(dir / name)) throw RunError(std::string(name) + ": W = 1 keeps no state, remove the file");
  std::optional<NpyArray> state0 = W > 1 ? read_optional(dir, "state0.npy", state_axes) : std::nullopt;
  std::optional<NpyArray> dy = read_optional(dir, "dy.npy", {{"B", B}, {"S", S}, {"C", C}});
  std::optional<NpyArray> dstate = dy && W > 1 ? read_optional(dir, "dstate.npy", state_axes) : std::nullopt;

  const DType dtype = config.dtype;
  Buffer xb(std::move(x), dtype), wb(std::move(weight), DType::f32);
  std::optional<Buffer> bb = buffer(std::move(bias), DType::f32), s0 = buffer(std::move(state0), DType::f32);
  Buffer y({B, S, C}, dtype);
  std::optional<Buffer> state;
  if (W > 1) state.emplace(std::vector<int64_t>{B, C, W - 1}, DType::f32);

  ConvArgs forward_args;
  forward_args.x = xb.view();
  forward_args.weight = wb.view();
  forward_args.bias = view(bb);
  forward_args.state0 = view(s0);
  forward_args.y = y.view();
  forward_args.state = view(state);
  conv_forward(forward_args, config.options);

  std::vector<Output> outputs;
  outputs.push_back({"y.npy", std::move(y)});
  if (state) outputs.push_back({"state.npy", std::move(*state)});
  if (!dy) return outputs;

  std::optional<Buffer> dyb = buffer(std::move(dy), dtype), dsb = buffer(std::move(dstate), DType::f32);
  Buffer dx({B, S, C}, dtype), dweight({C, W}, DType::f32);
  std::optional<Buffer> dbias, dstate0;
  if (bb) dbias.emplace(std::vector<int64_t>{C}, DType::f32);
  if (s0) dstate0.emplace(std::vector<int64_t>{B, C, W - 1}, DType::f32);

  ConvBackwardArgs backward_args(forward_args);
  backward_args.dy = view(dyb);
  backward_args.dstate = view(dsb);
  backward_args.dx = dx.view();
  backward_args.dweight = dweight.view();
  backward_args.dbias = view(dbias);
  backward_args.dstate0 = view(dstate0);
  conv_backward(backward_args, config.options);

  outputs.push_back({"dx.npy", std::move(dx)});
  outputs.push_back({"dweight.npy", std::move(dweight)});
  if (dbias) outputs.push_back({"dbias.npy", std::move(*dbias)});
  if (dstate0) outputs.push_back({"dstate0.npy", std::move(*dstate0)});
  return outputs;
}

std::string one_line(std::string_view message) {
  std::string line(message);
  std::ranges::replace_if(
      line, [](char c) { return c == '\n' || c == '\r'; }, ' ');
  return line;
}

}  // namespace

bool is_conv_command(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].starts_with("-")) {
      if (takes_value(args[i])) ++i;
      continue;
    }
    return args[i] == "conv";  // the first positional argument is the variant
  }
  return false;
}

int run_conv_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  try {
    const Config config = parse_args(args);
    const std::vector<Output> outputs = compute(config);
    fs::create_directories(config.out);
    for (const Output& output : outputs) output.buffer.write(config.out / output.name);
    out << "flat run: wrote";
    for (const Output& output : outputs) out << " " << output.name;
    out << " to " << config.out.string() << "\n";
    return 0;
  } catch (const Error& e) {
    std::string_view message = e.what();
    if (message.starts_with("flat: ")) message.remove_prefix(6);
    err << "flat run: " << one_line(message) << "\n";
  } catch (const std::exception& e) {
    err << "flat run: " << one_line(e.what()) << "\n";
  }
  return 2;
}

}  // namespace flat::tool

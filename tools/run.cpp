// `flat run`: reads one problem from .npy files, runs forward (and backward when dy.npy is given)
// and writes the results as .npy files. Every file is read and checked and every kernel has run
// before the output directory is even created, so a rejected run leaves nothing behind.
#include "run.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string_view>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "flat/flat.h"
#include "npy.h"
#include "run_conv.h"

namespace flat::tool {
namespace {

namespace fs = std::filesystem;

// Bad arguments, or input files whose shapes do not fit together.
class RunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Config {
  Variant variant = Variant::la;
  fs::path in, out;
  DType dtype = DType::f32;  // of q, k, v, beta, b, w, dy and of y and their gradients; gates and states stay fp32
  Options options;
};

template <class T>
T parse_number(const std::string& option, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [next, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || next != end)
    throw RunError(option + ": expected " + (std::is_integral_v<T> ? "an integer" : "a number") + ", got '" +
                   text + "'");
  return value;
}

DType parse_dtype(const std::string& text) {
  for (DType dtype : {DType::f32, DType::bf16})
    if (dtype_name(dtype) == text) return dtype;
  throw RunError("--dtype: expected f32 or bf16, got '" + text + "'");
}

Solve parse_solve(const std::string& text) {
  for (const auto& [name, solve] : {std::pair{"subst", Solve::substitution}, std::pair{"blocked", Solve::blocked},
                                    std::pair{"doubling", Solve::doubling}})
    if (text == name) return solve;
  throw RunError("--solve: expected subst, blocked or doubling, got '" + text + "'");
}

Config parse_args(const std::vector<std::string>& args) {
  Config config;
  bool has_variant = false, has_in = false, has_out = false;
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
      config.dtype = parse_dtype(value());
    } else if (arg == "--chunk") {
      config.options.chunk = parse_number<int>(arg, value());
    } else if (arg == "--scale") {
      config.options.scale = parse_number<float>(arg, value());
    } else if (arg == "--l2norm") {
      config.options.l2norm_qk = true;
    } else if (arg == "--threads") {
      config.options.threads = parse_number<int>(arg, value());
    } else if (arg == "--solve") {
      config.options.solve = parse_solve(value());
    } else if (arg == "--gate-group") {
      config.options.gate_group = parse_number<int>(arg, value());
      if (config.options.gate_group < 1) throw RunError(arg + ": expected a positive integer");
    } else if (arg.starts_with("-")) {
      throw RunError("unknown option '" + arg + "'");
    } else if (has_variant) {
      throw RunError("unexpected argument '" + arg + "'");
    } else {
      config.variant = parse_variant(arg);
      has_variant = true;
    }
  }
  if (!has_variant)
    throw RunError("missing VARIANT (la, retnet, mamba2, gla, deltanet, gated_deltanet, kda, gdn2 or sla)");
  if (!has_in) throw RunError("missing --in DIR");
  if (!has_out) throw RunError("missing --out DIR");
  if (!fs::is_directory(config.in)) throw RunError("--in " + config.in.string() + ": not a directory");
  if (fs::exists(config.out) && !fs::is_directory(config.out))
    throw RunError("--out " + config.out.string() + ": exists and is not a directory");
  return config;
}

// One expected axis of an input file: its name, and its size where it is already known.
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

// Reads dir/name and checks its shape.
NpyArray read_input(const fs::path& dir, const std::string& name, const std::vector<Axis>& axes) {
  NpyArray array = read_npy(dir / name);
  bool fits = array.shape.size() == axes.size();
  for (size_t d = 0; fits && d < axes.size(); ++d)
    fits = axes[d].size < 0 || array.shape[d] == axes[d].size;
  if (!fits)
    throw RunError(name + ": expected shape " + format_axes(axes) + ", got " + format_shape(array.shape));
  for (size_t d = 0; d < axes.size(); ++d)
    if (array.shape[d] < 1)
      throw RunError(name + ": axis " + axes[d].name + " is empty in shape " + format_shape(array.shape));
  return array;
}

std::optional<NpyArray> read_optional(const fs::path& dir, const std::string& name, const std::vector<Axis>& axes) {
  if (!fs::exists(dir / name)) return std::nullopt;
  return read_input(dir, name, axes);
}

// g.npy in the variant's layout. la and deltanet have no gate and ignore a g.npy that is there.
std::optional<NpyArray> read_gate(const fs::path& dir, Variant variant, const Options& options, int64_t B,
                                  int64_t S, int64_t K) {
  switch (variant) {
    case Variant::la:
    case Variant::deltanet: return std::nullopt;
    case Variant::retnet: return read_input(dir, "g.npy", {{"Ng"}});
    case Variant::mamba2:
    case Variant::gated_deltanet: return read_input(dir, "g.npy", {{"B", B}, {"S", S}, {"Ng"}});
    case Variant::gla: return read_input(dir, "g.npy", {{"B", B}, {"S", S}, {"Ng"}, {"K", K}});
    case Variant::kda:
    case Variant::gdn2:
    case Variant::sla: {
      // One value per group of G channels: G from --gate-group, or sla's 64, or g.npy's last axis.
      const int64_t group = options.gate_group > 0 ? options.gate_group : variant == Variant::sla ? 64 : 0;
      if (group > 0 && K % group != 0)
        throw RunError("--gate-group: G = " + std::to_string(group) +
                       (options.gate_group > 0 ? "" : " (sla's default)") + " does not divide K = " + std::to_string(K));
      NpyArray g = read_input(dir, "g.npy", {{"B", B}, {"S", S}, {"Ng"}, {"K/G", group > 0 ? K / group : -1}});
      if (K % g.shape[3] != 0)
        throw RunError("g.npy: the last axis (K/G = " + std::to_string(g.shape[3]) + ") must divide K = " +
                       std::to_string(K));
      return g;
    }
  }
  return std::nullopt;
}

// The delta rule's strengths: beta.npy (B, S, Nb) for deltanet, gated_deltanet, kda and sla;
// gdn2's erase gate b.npy (B, S, Nb, K) and write gate w.npy (B, S, Nw, V).
struct Strengths {
  std::optional<NpyArray> beta, b, w;
};

Strengths read_strengths(const fs::path& dir, Variant variant, int64_t B, int64_t S, int64_t K, int64_t V) {
  Strengths strengths;
  switch (variant) {
    case Variant::la:
    case Variant::retnet:
    case Variant::mamba2:
    case Variant::gla: break;
    case Variant::deltanet:
    case Variant::gated_deltanet:
    case Variant::kda:
    case Variant::sla: strengths.beta = read_input(dir, "beta.npy", {{"B", B}, {"S", S}, {"Nb"}}); break;
    case Variant::gdn2:
      strengths.b = read_input(dir, "b.npy", {{"B", B}, {"S", S}, {"Nb"}, {"K", K}});
      strengths.w = read_input(dir, "w.npy", {{"B", B}, {"S", S}, {"Nw"}, {"V", V}});
      break;
  }
  return strengths;
}

// A tensor as the kernels see it: float32 as read, or rounded to bf16.
struct Buffer {
  std::vector<int64_t> shape;
  DType dtype = DType::f32;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  Buffer(std::vector<int64_t> shape_, DType dtype_) : shape(std::move(shape_)), dtype(dtype_) {
    const size_t count = elements();
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

  size_t elements() const {
    size_t count = 1;
    for (int64_t size : shape) count *= size_t(size);
    return count;
  }

  // A contiguous view; shapes here have been checked to have at most 4 axes.
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

Tensor view(std::optional<Buffer>& buffer) { return buffer ? buffer->view() : Tensor{}; }

// The gradient of an optional input: its shape and dtype, absent with it.
std::optional<Buffer> gradient_of(const std::optional<Buffer>& input) {
  if (!input) return std::nullopt;
  return Buffer(input->shape, input->dtype);
}

struct Output {
  std::string name;
  Buffer buffer;
};

// Reads and checks the inputs, runs the kernels and returns the outputs, writing nothing.
std::vector<Output> compute(const Config& config) {
  const fs::path& dir = config.in;
  NpyArray q = read_input(dir, "q.npy", {{"B"}, {"S"}, {"Nq"}, {"K"}});
  const int64_t B = q.shape[0], S = q.shape[1], K = q.shape[3];
  NpyArray k = read_input(dir, "k.npy", {{"B", B}, {"S", S}, {"Nk"}, {"K", K}});
  NpyArray v = read_input(dir, "v.npy", {{"B", B}, {"S", S}, {"Nv"}, {"V"}});
  const int64_t V = v.shape[3];
  std::optional<NpyArray> g = read_gate(dir, config.variant, config.options, B, S, K);
  Strengths strengths = read_strengths(dir, config.variant, B, S, K, V);

  // Every head count divides N, the largest (the spec's head sharing).
  const int64_t Ng = !g ? 0 : g->shape.size() == 1 ? g->shape[0] : g->shape[2];
  const int64_t Nbeta = strengths.beta ? strengths.beta->shape[2] : 0;
  const int64_t Nb = strengths.b ? strengths.b->shape[2] : 0, Nw = strengths.w ? strengths.w->shape[2] : 0;
  const int64_t N = std::max({q.shape[2], k.shape[2], v.shape[2], Ng, Nbeta, Nb, Nw});
  const struct {
    const char* file;
    const char* axis;
    int64_t count;
  } heads[] = {{"q.npy", "Nq", q.shape[2]}, {"k.npy", "Nk", k.shape[2]}, {"v.npy", "Nv", v.shape[2]},
               {"g.npy", "Ng", Ng},         {"beta.npy", "Nb", Nbeta},  {"b.npy", "Nb", Nb},
               {"w.npy", "Nw", Nw}};
  for (const auto& [file, axis, count] : heads)
    if (count > 0 && N % count != 0)
      throw RunError(std::string(file) + ": head count " + axis + " = " + std::to_string(count) +
                     " does not divide N = " + std::to_string(N) + ", the largest head count");

  const std::vector<Axis> state{{"B", B}, {"N", N}, {"K", K}, {"V", V}};
  std::optional<NpyArray> h0 = read_optional(dir, "h0.npy", state);
  std::optional<NpyArray> dy = read_optional(dir, "dy.npy", {{"B", B}, {"S", S}, {"N", N}, {"V", V}});
  std::optional<NpyArray> dht = dy ? read_optional(dir, "dht.npy", state) : std::nullopt;

  const DType dtype = config.dtype;
  Buffer qb(std::move(q), dtype), kb(std::move(k), dtype), vb(std::move(v), dtype);
  std::optional<Buffer> gb = buffer(std::move(g), DType::f32), h0b = buffer(std::move(h0), DType::f32);
  std::optional<Buffer> betab = buffer(std::move(strengths.beta), dtype), bb = buffer(std::move(strengths.b), dtype),
                        wb = buffer(std::move(strengths.w), dtype);
  Buffer y({B, S, N, V}, dtype), ht({B, N, K, V}, DType::f32);

  ForwardArgs forward_args;
  forward_args.q = qb.view();
  forward_args.k = kb.view();
  forward_args.v = vb.view();
  forward_args.g = view(gb);
  forward_args.h0 = view(h0b);
  forward_args.beta = view(betab);
  forward_args.b = view(bb);
  forward_args.w = view(wb);
  forward_args.y = y.view();
  forward_args.ht = ht.view();
  forward(config.variant, forward_args, config.options);

  std::vector<Output> outputs;
  outputs.push_back({"y.npy", std::move(y)});
  outputs.push_back({"ht.npy", std::move(ht)});
  if (!dy) return outputs;

  std::optional<Buffer> dyb = buffer(std::move(dy), dtype), dhtb = buffer(std::move(dht), DType::f32);
  // Gradients take their input's shape and dtype.
  Buffer dq(qb.shape, dtype), dk(kb.shape, dtype), dv(vb.shape, dtype);
  std::optional<Buffer> dg = gradient_of(gb), dh0 = gradient_of(h0b), dbeta = gradient_of(betab),
                        db = gradient_of(bb), dw = gradient_of(wb);

  BackwardArgs backward_args{forward_args};
  backward_args.dy = view(dyb);
  backward_args.dht = view(dhtb);
  backward_args.dq = dq.view();
  backward_args.dk = dk.view();
  backward_args.dv = dv.view();
  backward_args.dg = view(dg);
  backward_args.dh0 = view(dh0);
  backward_args.dbeta = view(dbeta);
  backward_args.db = view(db);
  backward_args.dw = view(dw);
  backward(config.variant, backward_args, config.options);

  outputs.push_back({"dq.npy", std::move(dq)});
  outputs.push_back({"dk.npy", std::move(dk)});
  outputs.push_back({"dv.npy", std::move(dv)});
  for (auto& [name, grad] : {std::pair{"dg.npy", &dg}, std::pair{"dbeta.npy", &dbeta}, std::pair{"db.npy", &db},
                             std::pair{"dw.npy", &dw}, std::pair{"dh0.npy", &dh0}})
    if (*grad) outputs.push_back({name, std::move(**grad)});
  return outputs;
}

// The promise of run.h is one line, and messages quote what the user gave.
std::string one_line(std::string_view message) {
  std::string line(message);
  std::ranges::replace_if(line, [](char c) { return c == '\n' || c == '\r'; }, ' ');
  return line;
}

}  // namespace

int run_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (is_conv_command(args)) return run_conv_command(args, out, err);
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
    // The library's messages start with "flat: " and go on with the tensor or option they name.
    std::string_view message = e.what();
    if (message.starts_with("flat: ")) message.remove_prefix(6);
    err << "flat run: " << one_line(message) << "\n";
  } catch (const std::exception& e) {
    err << "flat run: " << one_line(e.what()) << "\n";
  }
  return 2;
}

}  // namespace flat::tool

#include "run_io.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <limits>
#include <new>
#include <type_traits>
#include <ostream>
#include <sstream>
#include <string_view>
#include <utility>

#include <unistd.h>

namespace flat::tool {
namespace {

namespace fs = std::filesystem;

std::string format_axes(const std::vector<FileAxis>& axes) {
  std::string s = "(";
  for (size_t d = 0; d < axes.size(); ++d) {
    if (d) s += ", ";
    s += axes[d].name;
    if (axes[d].size >= 0) {
      s += '=';
      s += std::to_string(axes[d].size);
    }
  }
  s += ')';
  return s;
}

// The promise of run.h is one line, and messages quote what the user gave.
std::string one_line(std::string_view message) {
  std::string line(message);
  std::ranges::replace_if(line, [](char c) { return c == '\n' || c == '\r'; }, ' ');
  return line;
}

}  // namespace

template <class T>
T parse_number(const std::string& option, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [next, error] = std::from_chars(text.data(), end, value);
  const char* kind = std::is_integral_v<T> ? "an integer" : "a number";
  if (error == std::errc::result_out_of_range && next == end) {
    std::ostringstream range;
    range << kind << " from " << std::numeric_limits<T>::lowest() << " to " << std::numeric_limits<T>::max();
    throw RunError(option + ": " + text + " is out of range (" + range.str() + ")");
  }
  if (text.empty() || error != std::errc() || next != end)
    throw RunError(option + ": expected " + kind + ", got '" + text + "'");
  return value;
}
template int parse_number<int>(const std::string&, const std::string&);

DType parse_dtype(const std::string& text) {
  for (DType dtype : {DType::f32, DType::bf16})
    if (dtype_name(dtype) == text) return dtype;
  throw RunError("--dtype: expected f32 or bf16, got '" + text + "'");
}

std::string run_variant(const std::vector<std::string>& args) {
  // The options of every `flat run` command that take no value; every other option takes one,
  // which is skipped with it.
  constexpr std::string_view kFlags[] = {"--l2norm", "--gate-first"};
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].starts_with("-")) return args[i];
    if (std::ranges::find(kFlags, args[i]) == std::end(kFlags)) ++i;
  }
  return "";
}

RunArgs parse_run_args(const std::vector<std::string>& args,
                       const std::function<bool(const std::string& name, const OptionText& value)>& option,
                       const std::function<void(const std::string& text)>& positional) {
  RunArgs run;
  bool has_in = false, has_out = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const OptionText value = [&]() -> const std::string& {
      if (i + 1 == args.size()) throw RunError(arg + ": missing value");
      return args[++i];
    };
    if (arg == "--in") {
      run.in = value();
      has_in = true;
    } else if (arg == "--out") {
      run.out = value();
      has_out = true;
    } else if (arg == "--dtype") {
      run.dtype = parse_dtype(value());
    } else if (arg == "--threads") {
      run.context.threads = parse_number<int>(arg, value());
    } else if (arg.starts_with("-")) {
      if (!option(arg, value)) throw RunError("unknown option '" + arg + "'");
    } else {
      positional(arg);
    }
  }
  if (!has_in) throw RunError("missing --in DIR");
  if (!has_out) throw RunError("missing --out DIR");
  if (!fs::is_directory(run.in)) throw RunError("--in " + run.in.string() + ": not a directory");
  if (fs::exists(run.out) && !fs::is_directory(run.out))
    throw RunError("--out " + run.out.string() + ": exists and is not a directory");
  return run;
}

namespace {

// An input file's shape against the shapes it may take, one per rank; the error names them all.
void check_shape(const std::string& name, const std::vector<int64_t>& shape,
                 const std::vector<std::vector<FileAxis>>& shapes) {
  const auto axes = std::ranges::find_if(shapes, [&](const auto& a) { return a.size() == shape.size(); });
  bool fits = axes != shapes.end();
  for (size_t d = 0; fits && d < axes->size(); ++d) fits = (*axes)[d].size < 0 || shape[d] == (*axes)[d].size;
  if (!fits) {
    std::string expected;
    for (size_t i = 0; i < shapes.size(); ++i) expected += (i ? " or " : "") + format_axes(shapes[i]);
    throw RunError(name + ": expected shape " + expected + ", got " + format_shape(shape));
  }
  for (size_t d = 0; d < axes->size(); ++d)
    if (shape[d] < 1) throw RunError(name + ": axis " + (*axes)[d].name + " is empty in shape " + format_shape(shape));
}

// dir/name, an integer array of the one axis `axis`; empty when the file is not there (a file
// that is there has at least one entry: check_shape refuses an empty axis).
std::vector<int64_t> read_indices(const fs::path& dir, const std::string& name, const FileAxis& axis) {
  if (!fs::exists(dir / name)) return {};
  NpyIndices array = read_npy_indices(dir / name);
  check_shape(name, array.shape, {{axis}});
  return std::move(array.data);
}

}  // namespace

NpyArray read_input(const fs::path& dir, const std::string& name, const std::vector<std::vector<FileAxis>>& shapes) {
  NpyArray array = read_npy(dir / name);
  check_shape(name, array.shape, shapes);
  return array;
}

NpyArray read_input(const fs::path& dir, const std::string& name, const std::vector<FileAxis>& axes) {
  return read_input(dir, name, std::vector<std::vector<FileAxis>>{axes});
}

std::optional<NpyArray> read_optional(const fs::path& dir, const std::string& name, const std::vector<FileAxis>& axes) {
  if (!fs::exists(dir / name)) return std::nullopt;
  return read_input(dir, name, axes);
}

void refuse_unread(const fs::path& dir, const std::string& name, const std::string& why) {
  if (fs::exists(dir / name)) throw RunError(name + ": " + why + ", remove the file");
}

Buffer::Buffer(std::vector<int64_t> shape_, DType dtype_) : shape(std::move(shape_)), dtype(dtype_) {
  if (dtype == DType::bf16) bf16.assign(elements(), 0);
  else f32.assign(elements(), 0.0f);
}

Buffer::Buffer(NpyArray array, DType dtype_) : shape(std::move(array.shape)), dtype(dtype_) {
  if (dtype == DType::bf16) {
    bf16.resize(array.data.size());
    std::ranges::transform(array.data, bf16.begin(), to_bf16);
  } else {
    f32 = std::move(array.data);
  }
}

size_t Buffer::elements() const {
  size_t count = 1;
  for (int64_t size : shape) count *= size_t(size);
  return count;
}

Tensor Buffer::view() {
  return Tensor::contiguous(dtype == DType::bf16 ? static_cast<void*>(bf16.data()) : f32.data(), dtype, shape);
}

void Buffer::write(const fs::path& path) const {
  if (dtype == DType::f32) return write_npy(path, shape, f32.data());
  std::vector<float> wide(bf16.size());
  std::ranges::transform(bf16, wide.begin(), from_bf16);
  write_npy(path, shape, wide.data());
}

std::optional<Buffer> buffer(std::optional<NpyArray> array, DType dtype) {
  if (!array) return std::nullopt;
  return Buffer(std::move(*array), dtype);
}

Tensor view(std::optional<Buffer>& buffer) { return buffer ? buffer->view() : Tensor{}; }

std::optional<Buffer> gradient_of(const std::optional<Buffer>& input) {
  if (!input) return std::nullopt;
  return Buffer(input->shape, input->dtype);
}

Sequences SequenceFiles::forward() const {
  return {cu_seqlens, initial_state_indices, final_state_indices, token_state_indices};
}

Sequences SequenceFiles::backward() const { return {cu_seqlens, initial_state_indices, {}, {}}; }

FileAxis SequenceFiles::initial_state_axis() const {
  return initial_state_indices.empty() ? sequence_axis() : FileAxis{"P"};
}

FileAxis SequenceFiles::sequence_axis() const { return {cu_seqlens.empty() ? "B" : "num_seqs", count}; }

std::vector<int64_t> SequenceFiles::per_sequence(const std::vector<int64_t>& row) const {
  std::vector<int64_t> shape{count};
  shape.insert(shape.end(), row.begin(), row.end());
  return shape;
}

Buffer SequenceFiles::final_states(const std::optional<Buffer>& initial, const std::vector<int64_t>& row) const {
  if (final_state_indices.empty() && token_state_indices.empty()) return Buffer(per_sequence(row), DType::f32);
  return initial.value();
}

SequenceFiles read_sequences(const fs::path& dir, int64_t B, int64_t S, const std::string& initial,
                             const std::string& final) {
  SequenceFiles s;
  s.cu_seqlens = read_indices(dir, "cu_seqlens.npy", {"num_seqs+1"});
  s.count = s.cu_seqlens.empty() ? B : int64_t(s.cu_seqlens.size()) - 1;
  s.initial_state_indices = read_indices(dir, "initial_state_indices.npy", s.sequence_axis());
  s.final_state_indices = read_indices(dir, "final_state_indices.npy", s.sequence_axis());
  s.token_state_indices = read_indices(dir, "token_state_indices.npy", {"B*S", B * S});
  for (const auto& [name, indices] : {std::pair{"final_state_indices.npy", &s.final_state_indices},
                                      std::pair{"token_state_indices.npy", &s.token_state_indices}})
    if (!indices->empty() && s.initial_state_indices.empty())
      throw RunError(std::string(name) + ": expected initial_state_indices.npy beside it (" + final +
                     " is the pool " + initial + " after the run; -1 starts a sequence from zero), got none");
  if (!s.initial_state_indices.empty() && !fs::exists(dir / initial))
    throw RunError("initial_state_indices.npy: expected " + initial + " beside it (the pool it indexes), got none");
  return s;
}

namespace {

// The outermost directory that creating `dir` would make (empty when `dir` exists).
fs::path first_missing(const fs::path& dir) {
  fs::path missing;
  for (fs::path p = fs::absolute(dir).lexically_normal(); !p.empty() && !fs::exists(p); p = p.parent_path()) {
    missing = p;
    if (p == p.parent_path()) break;
  }
  return missing;
}

}  // namespace

void write_outputs(const fs::path& dir, const std::vector<Output>& outputs, const OutputWriter& write) {
  for (const Output& output : outputs) {
    const fs::path path = dir / output.name;
    if (fs::exists(fs::symlink_status(path)) && !fs::is_regular_file(fs::symlink_status(path)))
      throw RunError(output.name + ": " + path.string() + " exists and is not a regular file");
  }
  const fs::path created = first_missing(dir);
  std::vector<fs::path> written;  // temporaries, then the renamed outputs
  const auto remove_written = [&] {
    std::error_code ignored;
    for (const fs::path& path : written) fs::remove(path, ignored);
    if (!created.empty()) fs::remove_all(created, ignored);
  };
  try {
    fs::create_directories(dir);
    const std::string suffix = ".partial-" + std::to_string(::getpid());
    for (const Output& output : outputs) {
      written.push_back(dir / ("." + output.name + suffix));
      // The temporary file is ours, not the user's: its errors name the output.
      try {
        write(output, written.back());
      } catch (const std::exception& e) {
        std::string_view message = e.what();
        const std::string temporary = written.back().filename().string() + ": ";
        if (message.starts_with(temporary)) message.remove_prefix(temporary.size());
        throw RunError(output.name + ": cannot write " + (dir / output.name).string() + ": " + std::string(message));
      }
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const fs::path final_path = dir / outputs[i].name;
      std::error_code error;
      fs::rename(written[i], final_path, error);
      if (error) throw RunError(outputs[i].name + ": cannot write " + final_path.string() + ": " + error.message());
      written[i] = final_path;
    }
  } catch (...) {
    remove_written();
    throw;
  }
}

int run_and_write(const std::function<RunResult()>& job, std::ostream& out, std::ostream& err) {
  try {
    const RunResult result = job();
    write_outputs(result.out, result.outputs,
                  [](const Output& output, const fs::path& path) { output.buffer.write(path); });
    out << "flat run: wrote";
    for (const Output& output : result.outputs) out << " " << output.name;
    out << " to " << result.out.string() << "\n";
    return 0;
  } catch (const Error& e) {
    // The library's messages start with "flat: " and go on with the tensor or option they name.
    std::string_view message = e.what();
    if (message.starts_with("flat: ")) message.remove_prefix(6);
    err << "flat run: " << one_line(message) << "\n";
  } catch (const std::bad_alloc&) {
    err << "flat run: out of memory for the inputs, outputs and workspaces of this problem\n";
  } catch (const std::exception& e) {
    err << "flat run: " << one_line(e.what()) << "\n";
  }
  return 2;
}

}  // namespace flat::tool

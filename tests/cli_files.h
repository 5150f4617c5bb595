// Files for the `flat run` tests: a scratch directory, .npy inputs written from doubles (and index
// arrays), outputs read back and cut into rows, and the check that a bad command line is refused
// with one line and nothing written.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "npy.h"
#include "run.h"

namespace flat::test {

// A fresh directory under the system's temporary directory, removed with its contents.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::random_device entropy;
    do path_ = std::filesystem::temp_directory_path() / (prefix + std::to_string(entropy()) + std::to_string(entropy()));
    while (!std::filesystem::create_directory(path_));
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// values as a float32 .npy file of `shape`.
inline void write(const std::filesystem::path& path, const std::vector<int64_t>& shape,
                  const std::vector<double>& values) {
  const std::vector<float> data(values.begin(), values.end());
  tool::write_npy(path, shape, data.data());
}

// A .npy file byte by byte: headers write_npy would never produce, and integer arrays, which flat
// reads but never writes.
template <class T>
void write_raw_npy(const std::filesystem::path& path, int major, const std::string& header,
                   const std::vector<T>& data) {
  std::string bytes = "\x93NUMPY";
  bytes += char(major);
  bytes += '\0';
  const size_t length_size = major == 1 ? 2 : 4;
  for (size_t i = 0; i < length_size; ++i) bytes += char(header.size() >> (8 * i) & 0xff);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(T));
  std::ofstream(path, std::ios::binary) << bytes;
}

// Indices as numpy.save writes them: int64 ('<i8') or int32 ('<i4'), of one axis unless `shape`
// says otherwise.
inline void write_indices(const std::filesystem::path& path, const std::vector<int64_t>& values,
                          const std::string& descr = "<i8", std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape = {int64_t(values.size())};
  const std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + tool::format_shape(shape) + ", }\n";
  if (descr == "<i4") return write_raw_npy(path, 1, header, std::vector<int32_t>(values.begin(), values.end()));
  write_raw_npy(path, 1, header, values);
}

// Rows [first, first + count) of an array of rows of `row` elements each.
template <class T>
std::vector<T> rows(const std::vector<T>& values, size_t row, int64_t first, int64_t count) {
  return {values.begin() + ptrdiff_t(size_t(first) * row), values.begin() + ptrdiff_t(size_t(first + count) * row)};
}

// Row r of `into`, an array of rows of row.size() elements, set to `row`.
template <class T>
void set_row(std::vector<T>& into, int64_t r, const std::vector<T>& row) {
  std::ranges::copy(row, into.begin() + ptrdiff_t(size_t(r) * row.size()));
}

// Elements of one index of `axis` (everything after it).
inline size_t row_size(const std::vector<int64_t>& shape, size_t axis) {
  return size_t(std::accumulate(shape.begin() + ptrdiff_t(axis) + 1, shape.end(), int64_t{1}, std::multiplies<>()));
}

// An input file: its name, shape and values.
struct InputFile {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<double> values;

  // Tokens [first, first + count) of a file of one batch row, [1, S, ...].
  InputFile tokens(int64_t first, int64_t count) const {
    std::vector<int64_t> cut = shape;
    cut[1] = count;
    return {name, cut, rows(values, row_size(shape, 1), first, count)};
  }
};

// n values in [-1, 1], each a float, so that a file holds them exactly.
inline std::vector<double> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<double> values(n);
  for (double& v : values) v = dist(rng);
  return values;
}

// Values as a file holds them (values that are floats already, as random_values draws them).
inline std::vector<float> as_floats(const std::vector<double>& values) { return {values.begin(), values.end()}; }

// The float32 values of a file the command wrote.
inline std::vector<float> floats(const std::filesystem::path& path) { return tool::read_npy(path).data; }

// The same bits (a NaN equals itself, -0 differs from 0).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// `flat run args...` succeeds, quietly.
inline bool run_ok(const std::vector<std::string>& args) {
  std::ostringstream stdout_text, stderr_text;
  const int status = tool::run_command(args, stdout_text, stderr_text);
  EXPECT_EQ(status, 0) << stderr_text.str();
  EXPECT_EQ(stderr_text.str(), "");
  return status == 0;
}

// `flat run args...` fails with exit status 2 and one line holding `fragment`, and never creates
// `out`.
inline void expect_refused(const std::vector<std::string>& args, const std::filesystem::path& out,
                           const std::string& fragment) {
  std::ostringstream stdout_text, stderr_text;
  EXPECT_EQ(tool::run_command(args, stdout_text, stderr_text), 2);
  const std::string message = stderr_text.str();
  EXPECT_NE(message.find(fragment), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), message.size() - 1) << "one line: " << message;
  EXPECT_FALSE(std::filesystem::exists(out));
}

// The names of the files in `dir`.
inline std::set<std::string> file_names(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// The file's values in float64 after checking its shape.
inline std::vector<double> read_output(const std::filesystem::path& path, const std::vector<int64_t>& shape) {
  const tool::NpyArray array = tool::read_npy(path);
  EXPECT_EQ(array.shape, shape) << path.filename();
  return {array.data.begin(), array.data.end()};
}

// A bad `flat run` command line: its input files (shapes, written with 0.5 everywhere), the
// options after --in and --out, and what its error must say.
struct BadRun {
  const char* what;
  std::vector<std::pair<std::string, std::vector<int64_t>>> files;
  std::vector<std::string> extra_args;
  const char* fragment;
};

// Runs `flat run VARIANT --in IN --out OUT extra_args...` for each case: exit status 2, one line
// holding the fragment, and OUT never created.
inline void expect_rejected(const std::string& variant, const std::vector<BadRun>& cases) {
  for (const BadRun& bad : cases) {
    SCOPED_TRACE(bad.what);
    TempDir in{"flat_cli_bad_"}, scratch{"flat_cli_bad_"};
    const std::filesystem::path out = scratch / "out";
    for (const auto& [name, shape] : bad.files) {
      size_t count = 1;
      for (int64_t s : shape) count *= size_t(s);
      write(in / name, shape, std::vector<double>(count, 0.5));
    }
    std::vector<std::string> args{variant, "--in", in.path().string(), "--out", out.string()};
    args.insert(args.end(), bad.extra_args.begin(), bad.extra_args.end());
    expect_refused(args, out, bad.fragment);
  }
}

}  // namespace flat::test

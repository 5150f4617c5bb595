// Files for the `flat run` tests: a scratch directory, .npy inputs written from doubles, outputs
// read back, and the check that a bad command line is refused with one line and nothing written.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
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
    std::ostringstream stdout_text, stderr_text;
    EXPECT_EQ(tool::run_command(args, stdout_text, stderr_text), 2);
    const std::string message = stderr_text.str();
    EXPECT_NE(message.find(bad.fragment), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), message.size() - 1) << "one line: " << message;
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

}  // namespace flat::test

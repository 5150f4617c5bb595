// Files for the `flat run` tests: a scratch directory and .npy inputs written from doubles.
#pragma once

#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "npy.h"

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

}  // namespace flat::test

// NumPy .npy files: float32 arrays, which `flat run` reads and writes, and the integer index
// arrays of its sequences, which it reads.
// The format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace flat::tool {

// A missing, malformed or unwritable .npy file. The message starts with the file's name.
class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A dense C-order array; a scalar has an empty shape.
template <class T>
struct NpyData {
  std::vector<int64_t> shape;
  std::vector<T> data;
};
using NpyArray = NpyData<float>;
using NpyIndices = NpyData<int64_t>;

// Reads a format 1.0, 2.0 or 3.0 file holding a little-endian float32 ('<f4') C-order array.
// Anything else, or data shorter or longer than the shape, is an NpyError.
NpyArray read_npy(const std::filesystem::path& path);

// The same for a little-endian int64 ('<i8') or int32 ('<i4') array, as numpy saves indices on
// any platform; int32 is widened.
NpyIndices read_npy_indices(const std::filesystem::path& path);

// Writes `data` (the product of `shape` elements) as a format 1.0 '<f4' C-order file, the way
// numpy.save lays it out.
void write_npy(const std::filesystem::path& path, const std::vector<int64_t>& shape, const float* data);

// A shape as Python writes a tuple: "()", "(3,)", "(2, 3)".
std::string format_shape(const std::vector<int64_t>& shape);

}  // namespace flat::tool

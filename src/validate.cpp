#include "validate.h"

#include <climits>
#include <sstream>

namespace flat::validate {

[[noreturn]] void fail(const std::string& tensor, const std::string& what) {
  throw Error("flat: " + tensor + ": " + what);
}

std::string shape_string(const Tensor& t) {
  std::ostringstream s;
  s << "[";
  for (int d = 0; d < t.rank; ++d) s << (d ? ", " : "") << t.shape[size_t(d)];
  s << "]";
  return s.str();
}

namespace {

std::string expected_string(const std::vector<Axis>& axes) {
  std::ostringstream s;
  s << "[";
  for (size_t d = 0; d < axes.size(); ++d) {
    s << (d ? ", " : "") << axes[d].name;
    if (axes[d].size >= 0) s << "=" << axes[d].size;
  }
  s << "]";
  return s.str();
}

}  // namespace

void check_tensor(const std::string& name, const Tensor& t, const std::vector<Axis>& axes) {
  if (!t.present()) fail(name, "required tensor is missing");
  if (t.rank != int(axes.size()))
    fail(name, "expected rank " + std::to_string(axes.size()) + " " + expected_string(axes) + ", got rank " +
                   std::to_string(t.rank) + " " + shape_string(t));
  if (t.data == nullptr) fail(name, "null data pointer");
  for (size_t d = 0; d < axes.size(); ++d) {
    if (t.shape[d] < 1)
      fail(name, std::string("axis ") + axes[d].name + " must be at least 1, got " + std::to_string(t.shape[d]) +
                     " in shape " + shape_string(t));
    if (t.shape[d] > INT_MAX)
      fail(name, std::string("axis ") + axes[d].name + " = " + std::to_string(t.shape[d]) + " is too large");
    if (axes[d].size >= 0 && t.shape[d] != axes[d].size)
      fail(name, "expected shape " + expected_string(axes) + ", got " + shape_string(t));
    if (t.stride[d] < 0) fail(name, std::string("negative stride on axis ") + axes[d].name);
  }
  if (t.stride[axes.size() - 1] != 1)
    fail(name, "the last axis must be contiguous (stride 1), got stride " + std::to_string(t.stride[axes.size() - 1]));
}

void check_dtype(const std::string& name, const Tensor& t, DType expected, const std::string& why) {
  if (t.dtype != expected)
    fail(name,
         "expected dtype " + std::string(dtype_name(expected)) + why + ", got " + std::string(dtype_name(t.dtype)));
}

}  // namespace flat::validate

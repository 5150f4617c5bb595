// What the test files share besides the harness: values rounded to a dtype, NaN-poisoned
// storage in a dtype, and the bad-input check.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "flat/flat.h"

namespace flat::test {

// x as the dtype stores it, back in double.
inline double round_to(DType dtype, double x) {
  return dtype == DType::bf16 ? double(from_bf16(to_bf16(float(x)))) : double(float(x));
}

// Storage on whole cache lines (64-byte aligned), as a framework's allocator gives it, so that
// rows of whole lines start on one: the rows the library streams (cpu::Stores::streamed).
template <class T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const LineAligned<U>&) const {
    return true;
  }
};
template <class T>
using LineAlignedVector = std::vector<T, LineAligned<T>>;

// Storage of a tensor (or of several side by side) in its dtype, NaN-poisoned so that an
// element nobody wrote fails its comparison.
struct Buffer {
  DType dtype;
  LineAlignedVector<uint16_t> half;
  LineAlignedVector<float> full;

  Buffer(DType d, size_t n) : dtype(d) {
    if (d == DType::bf16) half.assign(n, 0x7fc0);
    else full.assign(n, std::numeric_limits<float>::quiet_NaN());
  }
  void* data() { return dtype == DType::bf16 ? static_cast<void*>(half.data()) : full.data(); }
  size_t size() const { return dtype == DType::bf16 ? half.size() : full.size(); }
  void set(size_t i, double x) {
    if (dtype == DType::bf16) half[i] = to_bf16(float(x));
    else full[i] = float(x);
  }
  double get(size_t i) const { return dtype == DType::bf16 ? from_bf16(half[i]) : full[i]; }
  bool is_nan(size_t i) const { return std::isnan(get(i)); }
};

// call() throws flat::Error with `fragment` in its message and leaves the outputs of `buffers`
// (anything with outputs_untouched()) as they were.
template <class Buffers>
void expect_error(const std::function<void()>& call, const std::string& fragment, const Buffers& buffers) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_TRUE(buffers.outputs_untouched()) << fragment;
}

}  // namespace flat::test

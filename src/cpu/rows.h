// Loading and storing rows of a RowView as fp32, whatever the tensor's dtype.
#pragma once

#include <cstring>

#include "bf16.h"
#include "params.h"

namespace flat::cpu {
// Internal linkage: each translation unit, whatever its target flags, keeps its own copy.
namespace {

inline void load_row(const RowView& view, int64_t i0, int64_t i1, int64_t i2, float* dst,
                     int width) {
  const char* src = view.row(i0, i1, i2);
  if (view.dtype == DType::f32) {
    std::memcpy(dst, src, sizeof(float) * size_t(width));
  } else {
    const auto* h = reinterpret_cast<const uint16_t*>(src);
    for (int i = 0; i < width; ++i) dst[i] = bf16_to_f32(h[i]);
  }
}

inline void store_row(const RowView& view, int64_t i0, int64_t i1, int64_t i2, const float* src,
                      int width) {
  char* dst = view.row(i0, i1, i2);
  if (view.dtype == DType::f32) {
    std::memcpy(dst, src, sizeof(float) * size_t(width));
  } else {
    auto* h = reinterpret_cast<uint16_t*>(dst);
    for (int i = 0; i < width; ++i) h[i] = f32_to_bf16(src[i]);
  }
}

}  // namespace
}  // namespace flat::cpu

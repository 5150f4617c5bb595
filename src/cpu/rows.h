// Loading and storing rows of a RowView as fp32, whatever the tensor's dtype.
#pragma once

#include <cstring>

#include "bf16.h"
#include "params.h"

namespace flat::cpu {
// Internal linkage: each translation unit, whatever its target flags, keeps its own copy.
namespace {

// A row of `width` elements as fp32, times `scale` (none where it is 1: the values as they are).
inline void load_row(const RowView& view, int64_t i0, int64_t i1, int64_t i2, float* dst, int width,
                     float scale = 1.0f) {
  const char* src = view.row(i0, i1, i2);
  if (view.dtype == DType::f32) {
    if (scale == 1.0f) {
      std::memcpy(dst, src, sizeof(float) * size_t(width));
      return;
    }
    for (int i = 0; i < width; ++i) {
      float x;
      std::memcpy(&x, src + sizeof(float) * size_t(i), sizeof x);  // the row's alignment is the caller's
      dst[i] = x * scale;
    }
  } else {
    const auto* h = reinterpret_cast<const uint16_t*>(src);
    if (scale == 1.0f) {
      for (int i = 0; i < width; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    for (int i = 0; i < width; ++i) dst[i] = bf16_to_f32(h[i]) * scale;
  }
}

// src [width] times `scale` (none where it is 1), stored in the row's dtype (bf16 rounded to
// nearest even).
inline void store_row(const RowView& view, int64_t i0, int64_t i1, int64_t i2, const float* src, int width,
                      float scale = 1.0f) {
  char* dst = view.row(i0, i1, i2);
  if (view.dtype == DType::f32) {
    if (scale == 1.0f) {
      std::memcpy(dst, src, sizeof(float) * size_t(width));
      return;
    }
    for (int i = 0; i < width; ++i) {
      const float x = src[i] * scale;
      std::memcpy(dst + sizeof(float) * size_t(i), &x, sizeof x);
    }
  } else {
    auto* h = reinterpret_cast<uint16_t*>(dst);
    if (scale == 1.0f) {
      for (int i = 0; i < width; ++i) h[i] = f32_to_bf16(src[i]);
      return;
    }
    for (int i = 0; i < width; ++i) h[i] = f32_to_bf16(src[i] * scale);
  }
}

}  // namespace
}  // namespace flat::cpu

// Loading and storing rows of a RowView as fp32, whatever the tensor's dtype.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

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

// src [width] times `scale` (none where it is 1), written at dst as `dtype` (bf16 rounded to
// nearest even).
inline void write_elements(char* dst, DType dtype, const float* src, int width, float scale) {
  if (dtype == DType::f32) {
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

// How a row is stored: into the caches, or streamed past them with non-temporal stores, which
// write whole cache lines without reading them first (a cached store of a line not in the cache
// reads it from memory, then writes it back). Streamed rows must be followed by
// finish_streamed_stores before another thread reads them.
enum class Stores { cached, streamed };

constexpr int kCacheLine = 64;  // bytes, on every x86 core

// Whether a row at `dst` of `bytes` is whole cache lines: the rows Stores::streamed streams.
inline bool whole_lines(const char* dst, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(dst) % kCacheLine == 0 && bytes % kCacheLine == 0;
}

#if defined(__SSE2__)
// A row of whole cache lines at dst, in dtype D: line by line, the elements written to a line of
// the stack (the dtype and the line's length known to the compiler, so the conversion is straight
// vector code) and that line streamed out.
template <DType D>
inline void stream_lines(char* dst, const float* src, int width, float scale) {
  constexpr int per_line = kCacheLine / (D == DType::bf16 ? 2 : 4);
  for (int c = 0; c < width; c += per_line, dst += kCacheLine) {
    alignas(kCacheLine) char line[kCacheLine];
    write_elements(line, D, src + c, per_line, scale);
    for (int part = 0; part < kCacheLine; part += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + part), _mm_load_si128(reinterpret_cast<const __m128i*>(line + part)));
  }
}
#endif

// n floats from src written at dst as D (bf16 rounded to nearest even), streamed where dst starts
// on a cache line (its whole lines, stream_lines; the rest cached, as every element where dst does
// not). The same bytes either way.
template <DType D>
inline void stream_elements(char* dst, const float* src, int n) {
  int lined = 0;
#if defined(__SSE2__)
  constexpr int per_line = kCacheLine / (D == DType::bf16 ? 2 : 4);
  if (reinterpret_cast<uintptr_t>(dst) % kCacheLine == 0) {
    lined = n / per_line * per_line;
    stream_lines<D>(dst, src, lined, 1.0f);
  }
#endif
  write_elements(dst + size_t(lined) * (D == DType::bf16 ? 2 : 4), D, src + lined, n - lined, 1.0f);
}

// src [width] times `scale` (none where it is 1), stored in the row's dtype (bf16 rounded to
// nearest even). Streamed where the row is whole cache lines (it starts on a line and its bytes are
// lines, stream_lines); any other row as a cached one. The same bytes either way.
inline void store_row(const RowView& view, int64_t i0, int64_t i1, int64_t i2, const float* src, int width,
                      float scale = 1.0f, Stores stores = Stores::cached) {
  char* dst = view.row(i0, i1, i2);
#if defined(__SSE2__)
  if (stores == Stores::streamed && whole_lines(dst, int64_t(width) * view.element_bytes())) {
    if (view.dtype == DType::bf16)
      stream_lines<DType::bf16>(dst, src, width, scale);
    else
      stream_lines<DType::f32>(dst, src, width, scale);
    return;
  }
#endif
  write_elements(dst, view.dtype, src, width, scale);
}

// Orders the streamed stores of this thread before whatever it does next (its signal that its
// part of a call is done): non-temporal stores are not ordered with other stores otherwise.
inline void finish_streamed_stores() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace
}  // namespace flat::cpu

// Aligned scratch memory for the drivers.
#pragma once

#include <cstdlib>
#include <new>

namespace flat::cpu {

// 64-byte aligned, uninitialised storage: the stages' workspaces and states. Of 0 bytes, none
// (data null: aligned_alloc of 0 bytes may return null, which is no failure).
struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes) : data(bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr) {
    if (bytes && !data) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  float* floats() const { return static_cast<float*>(data); }
  void* data;
};

}  // namespace flat::cpu

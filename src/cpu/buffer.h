// Aligned scratch memory for the drivers.
#pragma once

#include <cstdlib>
#include <new>

namespace flat::cpu {

// 64-byte aligned, uninitialised storage: the stages' workspaces and states.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes) : data(std::aligned_alloc(64, (bytes + 63) / 64 * 64)) {
    if (!data) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  float* floats() const { return static_cast<float*>(data); }
  void* data;
};

}  // namespace flat::cpu

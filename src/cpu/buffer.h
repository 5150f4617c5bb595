// Aligned scratch memory for the drivers: per call (AlignedBuffer), or kept between calls for a
// thread's part of one (KeptScratch).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <optional>

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

// What a kept buffer is for: one list per purpose, so the buffers of one call are apart.
enum class ScratchSlot { chunk_states, kept_solves, count };

// A kept buffer is at most this large; a call that needs more allocates for itself alone.
constexpr size_t kKeptScratchBytes = size_t(64) << 20;

// 64-byte aligned, uninitialised storage for one thread's part of a call, taken from the buffers
// kept for `slot` between calls (the last returned that is large enough; where none is, the last
// returned is freed and a larger one allocated) and returned to them at its end. The backward's
// chunk-start states and kept solves are tens of MiB a thread (29 MiB at the bench's shape,
// S = 4096): allocated afresh every call, their pages came back from the kernel each time,
// faulted in and zeroed page by page (about 2,900 faults a call and thread). So, as oneDNN's
// scratchpad in its library mode, the library keeps them: as many per slot as threads have used
// at once, each up to kKeptScratchBytes (a request above it is the call's own), for the process's
// life. Of 0 bytes, none (floats() null).
class KeptScratch {
 public:
  KeptScratch(ScratchSlot slot, size_t bytes);
  ~KeptScratch();
  KeptScratch(const KeptScratch&) = delete;
  KeptScratch& operator=(const KeptScratch&) = delete;
  float* floats() const { return data_; }

 private:
  ScratchSlot slot_;
  float* data_ = nullptr;
  size_t bytes_ = 0;                  // a kept buffer's size
  std::optional<AlignedBuffer> own_;  // or the call's own storage
};

}  // namespace flat::cpu

// Aligned scratch memory for the drivers: per call (AlignedBuffer), or kept by a thread from call
// to call (ThreadScratch).
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

// What a thread keeps a buffer for: one per purpose, so the buffers of one call are apart.
enum class ScratchSlot { chunk_states, kept_solves, count };

// A slot's kept buffer is at most this large; a call that needs more allocates for itself alone.
constexpr size_t kKeptScratchBytes = size_t(64) << 20;

// 64-byte aligned, uninitialised storage for one call, from the calling thread's buffer for `slot`
// (grown to `bytes` where it is smaller) while that lasts. The backward's chunk-start states and
// kept solves are tens of MiB a thread (29 MiB at the bench's shape, S = 4096): allocated afresh
// every call, their pages came back from the kernel each time, faulted in and zeroed page by page
// (about 2,900 faults a call and thread), 5-10% of gated_deltanet's backward beside its products
// on an EPYC Zen 3. So, as oneDNN's scratchpad in its library mode, each thread keeps the largest
// buffer it has needed per slot, up to kKeptScratchBytes (a training loop's calls reuse it; the
// pool's workers live as long as the process, so it stays until then). A slot already in use on
// this thread, or a request above the limit, gets storage of its own for the call. Of 0 bytes,
// none (floats() null).
class ThreadScratch {
 public:
  ThreadScratch(ScratchSlot slot, size_t bytes);
  ~ThreadScratch();
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;
  float* floats() const { return data_; }

 private:
  float* data_ = nullptr;
  bool* in_use_ = nullptr;              // the kept slot's flag, where data_ is the kept buffer
  std::optional<AlignedBuffer> own_;    // else the call's own storage
};

}  // namespace flat::cpu

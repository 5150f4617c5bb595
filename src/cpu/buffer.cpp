#include "cpu/buffer.h"

namespace flat::cpu {
namespace {

struct KeptBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  bool in_use = false;
  ~KeptBuffer() { std::free(data); }
};

thread_local KeptBuffer kept[size_t(ScratchSlot::count)];

}  // namespace

ThreadScratch::ThreadScratch(ScratchSlot slot, size_t bytes) {
  if (bytes == 0) return;
  KeptBuffer& buffer = kept[size_t(slot)];
  if (bytes > kKeptScratchBytes || buffer.in_use) {
    own_.emplace(bytes);
    data_ = own_->floats();
    return;
  }
  if (buffer.bytes < bytes) {
    std::free(buffer.data);
    buffer.bytes = 0;
    const size_t rounded = (bytes + 63) / 64 * 64;
    buffer.data = std::aligned_alloc(64, rounded);
    if (!buffer.data) throw std::bad_alloc();
    buffer.bytes = rounded;
  }
  buffer.in_use = true;
  in_use_ = &buffer.in_use;
  data_ = static_cast<float*>(buffer.data);
}

ThreadScratch::~ThreadScratch() {
  if (in_use_) *in_use_ = false;
}

}  // namespace flat::cpu

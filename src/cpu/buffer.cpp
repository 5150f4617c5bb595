#include "cpu/buffer.h"

#include <mutex>
#include <vector>

namespace flat::cpu {
namespace {

struct Kept {
  void* data;
  size_t bytes;
};

// The kept buffers free to take, per slot, the last returned last. Global storage, no thread's
// own: a thread that ends leaves nothing behind, and a forked child (whose copy of the workers has
// no threads) still reaches every buffer, which LeakSanitizer reported as leaked when they were
// thread_local.
struct SlotBuffers {
  std::vector<Kept> free;  // the last returned last
  // The slot's buffers, free or taken: free's capacity is kept at least this, so that returning a
  // buffer (~KeptScratch) never allocates.
  size_t count = 0;
};
struct KeptBuffers {
  std::mutex mutex;
  SlotBuffers slots[size_t(ScratchSlot::count)];
};
KeptBuffers& kept_buffers() {
  static auto* buffers = new KeptBuffers;  // never destroyed: the workers outlive static destructors
  return *buffers;
}

}  // namespace

KeptScratch::KeptScratch(ScratchSlot slot, size_t bytes) : slot_(slot) {
  if (bytes == 0) return;
  if (bytes > kKeptScratchBytes) {
    own_.emplace(bytes);
    data_ = own_->floats();
    return;
  }
  void* smaller = nullptr;
  {
    KeptBuffers& kept = kept_buffers();
    std::lock_guard<std::mutex> lock(kept.mutex);
    SlotBuffers& buffers = kept.slots[size_t(slot)];
    std::vector<Kept>& free = buffers.free;
    for (size_t i = free.size(); i-- > 0;)
      if (free[i].bytes >= bytes) {
        data_ = static_cast<float*>(free[i].data);
        bytes_ = free[i].bytes;
        free.erase(free.begin() + std::ptrdiff_t(i));
        return;
      }
    if (!free.empty()) {  // none large enough: the last returned makes way for a larger one
      smaller = free.back().data;
      free.pop_back();
    } else {  // one more buffer: room for it in the list first (a failure here changes nothing)
      free.reserve(buffers.count + 1);
      ++buffers.count;
    }
  }
  std::free(smaller);
  bytes_ = (bytes + 63) / 64 * 64;
  data_ = static_cast<float*>(std::aligned_alloc(64, bytes_));
  if (!data_) throw std::bad_alloc();
}

KeptScratch::~KeptScratch() {
  if (!data_ || own_) return;
  KeptBuffers& kept = kept_buffers();
  std::lock_guard<std::mutex> lock(kept.mutex);
  kept.slots[size_t(slot_)].free.push_back({data_, bytes_});  // within the capacity reserved when it was made
}

}  // namespace flat::cpu

// Arrays carved out of one workspace, for the stages that must not allocate.
#pragma once

#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define FLAT_ARENA_RED_ZONES 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define FLAT_ARENA_RED_ZONES 1
#endif
#endif

namespace flat::cpu {
// Internal linkage: each translation unit, whatever its target flags, keeps its own copy.
namespace {

// Carves 64-byte aligned arrays out of one workspace; with a null base it only measures, so the
// same sequence of take() sizes the workspace and then lays it out.
//
// The workspace is one allocation, so AddressSanitizer alone cannot see one array overrun into the
// next. Under AddressSanitizer every array is therefore followed by a poisoned red zone (the
// alignment gap and 64 bytes more): a read or write one element past the end of any array is
// reported where it happens (tests/test_arena.cpp shows it).
class Arena {
 public:
  explicit Arena(void* base) : base_(static_cast<char*>(base)) {}

  template <class T>
  T* take(size_t count) {
    offset_ = aligned(offset_);
    T* out = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    const size_t bytes = count * sizeof(T);
#ifdef FLAT_ARENA_RED_ZONES
    const size_t end = aligned(offset_ + bytes) + kAlignment;
    if (base_) {
      ASAN_UNPOISON_MEMORY_REGION(base_ + offset_, bytes);
      ASAN_POISON_MEMORY_REGION(base_ + offset_ + bytes, end - offset_ - bytes);
    }
    offset_ = end;
#else
    offset_ += bytes;
#endif
    return out;
  }

  // Bytes the workspace needs, the base being 64-byte aligned.
  size_t used() const { return aligned(offset_); }

 private:
  static constexpr size_t kAlignment = 64;
  static size_t aligned(size_t offset) { return (offset + kAlignment - 1) & ~(kAlignment - 1); }

  char* base_;
  size_t offset_ = 0;
};

}  // namespace
}  // namespace flat::cpu

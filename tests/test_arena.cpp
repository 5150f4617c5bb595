// The stages' workspace arena: arrays laid out as measured, aligned and apart, and, in the
// sanitizer build, an overrun of one element past any array reported by AddressSanitizer.
#include <gtest/gtest.h>

#include <cstdint>

#include "cpu/arena.h"
#include "cpu/buffer.h"

namespace flat::cpu {
namespace {

// The sizes of a workspace's arrays: an odd count, a whole number of cache lines, one element.
template <class Take>
void lay_out(Arena& arena, Take&& take) {
  take(arena.take<float>(15));
  take(arena.take<float>(16));
  take(arena.take<double>(1));
}

TEST(Arena, ArraysAreAlignedDisjointAndInsideTheMeasuredSize) {
  Arena measure(nullptr);
  lay_out(measure, [](const void* p) { EXPECT_EQ(p, nullptr); });
  AlignedBuffer workspace(measure.used());
  Arena arena(workspace.data);
  const char* base = static_cast<const char*>(workspace.data);
  const char* previous_end = base;
  size_t bytes[] = {15 * sizeof(float), 16 * sizeof(float), sizeof(double)};
  int i = 0;
  lay_out(arena, [&](const void* p) {
    const char* start = static_cast<const char*>(p);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(start) % 64, 0u);
    EXPECT_GE(start, previous_end);
    previous_end = start + bytes[i++];
  });
  EXPECT_LE(previous_end, base + measure.used());
}

#ifdef FLAT_ARENA_RED_ZONES
// The bug class an independent check found (a solve's scratch spilling into the next array of
// one workspace), made visible: the write one element past `first` lands in its red zone.
TEST(ArenaDeathTest, OneElementOverrunIsReported) {
  for (const size_t count : {size_t{15}, size_t{16}}) {
    EXPECT_DEATH(
        {
          Arena measure(nullptr);
          measure.take<float>(count);
          measure.take<float>(16);
          AlignedBuffer workspace(measure.used());
          Arena arena(workspace.data);
          volatile float* first = arena.take<float>(count);
          arena.take<float>(16);
          first[count] = 1.0f;
        },
        "AddressSanitizer: use-after-poison");
  }
}
#else
TEST(ArenaDeathTest, OneElementOverrunIsReported) { GTEST_SKIP() << "red zones exist in the AddressSanitizer build only"; }
#endif

}  // namespace
}  // namespace flat::cpu

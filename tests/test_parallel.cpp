// parallel_ranges on the worker threads: every item once, failures passed to the caller, and
// callers the workers cannot serve (nested, concurrent) served by threads of their own.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/parallel.h"

namespace flat::test {
namespace {

// Items visited by parallel_ranges(items, threads): each exactly once, in ranges that tile [0, items).
void expect_each_item_once(int64_t items, int threads) {
  std::vector<std::atomic<int>> visits(static_cast<size_t>(items));
  std::atomic<int64_t> covered{0};
  cpu::parallel_ranges(items, threads, [&](int64_t begin, int64_t end) {
    ASSERT_LE(begin, end);
    for (int64_t i = begin; i < end; ++i) visits[size_t(i)]++;
    covered += end - begin;
  });
  EXPECT_EQ(covered.load(), items);
  for (int64_t i = 0; i < items; ++i) EXPECT_EQ(visits[size_t(i)].load(), 1) << "item " << i;
}

TEST(ParallelRanges, EveryItemOnce) {
  for (int64_t items : {1, 2, 3, 7, 100})
    for (int threads : {1, 2, 3, 8}) {
      SCOPED_TRACE(std::to_string(items) + " items, " + std::to_string(threads) + " threads");
      expect_each_item_once(items, threads);
    }
}

TEST(ParallelRanges, FailureReachesTheCallerAndTheWorkersCarryOn) {
  EXPECT_THROW(cpu::parallel_ranges(8, 4,
                                    [](int64_t begin, int64_t) {
                                      if (begin > 0) throw std::runtime_error("range failed");
                                    }),
               std::runtime_error);
  expect_each_item_once(8, 4);
}

TEST(ParallelRanges, NestedCallsRunOnThreadsOfTheirOwn) {
  std::atomic<int64_t> inner{0};
  cpu::parallel_ranges(4, 2, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      cpu::parallel_ranges(10, 2, [&](int64_t b, int64_t e) { inner += e - b; });
  });
  EXPECT_EQ(inner.load(), 40);
}

TEST(ParallelRanges, ConcurrentCallersBothFinish) {
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round)
        cpu::parallel_ranges(16, 2, [&](int64_t b, int64_t e) { total += e - b; });
    });
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 16);
}

}  // namespace
}  // namespace flat::test

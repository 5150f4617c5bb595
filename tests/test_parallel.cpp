// parallel_ranges on the worker threads: every item once, failures passed to the caller, and
// callers the workers cannot serve (nested, concurrent) served by threads of their own; a child
// forked once the workers run ends normally; each worker's scratch its own while it runs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/buffer.h"
#include "cpu/parallel.h"

namespace flat::test {
namespace {

// Items visited by parallel_ranges(items, threads): each exactly once, in ranges that tile [0, items).
void expect_each_item_once(int64_t items, int threads) {
  std::vector<std::atomic<int>> visits(static_cast<size_t>(items));
  std::atomic<int64_t> covered{0};
  cpu::parallel_ranges(items, {threads}, [&](int64_t begin, int64_t end) {
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
  EXPECT_THROW(cpu::parallel_ranges(8, {4},
                                    [](int64_t begin, int64_t) {
                                      if (begin > 0) throw std::runtime_error("range failed");
                                    }),
               std::runtime_error);
  expect_each_item_once(8, 4);
}

TEST(ParallelRanges, NestedCallsRunOnThreadsOfTheirOwn) {
  std::atomic<int64_t> inner{0};
  cpu::parallel_ranges(4, {2}, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      cpu::parallel_ranges(10, {2}, [&](int64_t b, int64_t e) { inner += e - b; });
  });
  EXPECT_EQ(inner.load(), 40);
}

TEST(ParallelRanges, ConcurrentCallersBothFinish) {
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round)
        cpu::parallel_ranges(16, {2}, [&](int64_t b, int64_t e) { total += e - b; });
    });
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 16);
}

// A request for far more threads than the machine has (10,000, for work of 100,000 items) runs on
// at most max_threads() of them.
TEST(ParallelRanges, ThreadsCappedAtAFewPerHardwareThread) {
  std::mutex mutex;
  std::set<std::thread::id> seen;
  int64_t ranges = 0;
  cpu::parallel_ranges(100000, {10000}, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    seen.insert(std::this_thread::get_id());
    ++ranges;
  });
  EXPECT_EQ(ranges, cpu::max_threads());
  EXPECT_LE(int(seen.size()), cpu::max_threads());
  EXPECT_EQ(cpu::max_threads(), 4 * int(std::max(1u, std::thread::hardware_concurrency())));
}

// The workers are never joined, so exit() has no thread to join: a child forked once they run
// (its copy of the pool names threads it does not have) ends through exit() with status 0. Joining
// the workers at exit killed it (std::system_error from the pool's destructor, or a crash). The
// child starts no thread, which ThreadSanitizer refuses after a fork.
// The backward's kept scratch (cpu/buffer.h) on the workers, calls after calls: no two
// ranges of a call share storage (each range writes its mark over its buffer and finds it
// intact), and ThreadSanitizer sees no shared state.
TEST(ParallelRanges, EachWorkersScratchIsItsOwn) {
  std::atomic<int> intact{0}, ranges{0};
  for (int call = 0; call < 4; ++call)
    cpu::parallel_ranges(8, {4}, [&](int64_t begin, int64_t) {
      const size_t n = size_t(1) << 16;
      cpu::KeptScratch scratch(cpu::ScratchSlot::chunk_states, n * sizeof(float));
      for (size_t i = 0; i < n; ++i) scratch.floats()[i] = float(begin);
      std::this_thread::yield();
      bool same = true;
      for (size_t i = 0; i < n; ++i) same = same && scratch.floats()[i] == float(begin);
      intact += same;
      ranges++;
    });
  EXPECT_GT(ranges.load(), 0);
  EXPECT_EQ(intact.load(), ranges.load());
}

TEST(ParallelRanges, ForkedChildExitsNormally) {
  expect_each_item_once(8, 4);  // the workers are running
  std::fflush(nullptr);         // nothing buffered is written twice
  const pid_t child = fork();
  ASSERT_NE(child, -1);
  if (child == 0) std::exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace flat::test

// Static partition of independent work items over threads. Each item is computed by exactly one
// thread with the same code whatever the thread count, so results do not depend on it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flat::cpu {

// Runs part(0) on the calling thread and part(1) .. part(parts - 1) on the process's worker
// threads (started on first use, then asleep between calls), returning when all are done.
// Returns false, having run nothing, when the workers are busy with another caller or when
// called from one of them.
bool run_on_pool(int parts, const std::function<void(int64_t)>& part);

// The most threads one call runs on: 4 per hardware thread. Beyond the cores, threads only take
// turns (and the pool's workers poll, burning the cores), so a larger request is capped here.
int max_threads();

// Calls body(begin, end) on contiguous ranges that cover [0, items): on the worker threads, or on
// threads of its own when they are busy; min(threads, items, max_threads()) ranges. Starting
// threads per call cost about 60 us of a 140 us decode step (one token, 16 heads).
template <class Body>
void parallel_ranges(int64_t items, int threads, Body&& body) {
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>({int64_t{threads}, items, int64_t{max_threads()}}));
  if (workers == 1) {
    body(int64_t{0}, items);
    return;
  }
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const std::function<void(int64_t)> run = [&](int64_t w) {
    try {
      body(items * w / workers, items * (w + 1) / workers);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  };
  if (!run_on_pool(int(workers), run)) {
    std::vector<std::thread> own;
    for (int64_t w = 1; w < workers; ++w) own.emplace_back(run, w);
    run(0);
    for (auto& t : own) t.join();
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace flat::cpu

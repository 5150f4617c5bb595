// Static partition of independent work items over threads. Each item is computed by exactly one
// thread with the same code whatever the thread count, so results do not depend on it.
#pragma once

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flat::cpu {

// Calls body(begin, end) on contiguous ranges that cover [0, items).
template <class Body>
void parallel_ranges(int64_t items, int threads, Body&& body) {
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(threads, items));
  if (workers == 1) {
    body(int64_t{0}, items);
    return;
  }
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const auto run = [&](int64_t w) {
    try {
      body(items * w / workers, items * (w + 1) / workers);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(run, w);
  run(0);
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace flat::cpu

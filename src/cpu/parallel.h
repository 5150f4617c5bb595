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
// threads (started on first use, then asleep between calls; never joined: they end with the
// process), returning when all are done.
// Returns false, having run nothing, when the workers are busy with another caller or when
// called from one of them.
bool run_on_pool(int parts, const std::function<void(int64_t)>& part);

// The most threads one call runs on: 4 per hardware thread. Beyond the cores, threads only take
// turns (and the pool's workers poll, burning the cores), so a larger request is capped here.
int max_threads();

// A host framework's parallel-for (ExecutionContext::parallel_for): runs run_part(0) ..
// run_part(parts - 1), each once, and returns when all have returned.
using ParallelFor = std::function<void(int parts, const std::function<void(int part)>& run_part)>;

// Who runs a call's ranges: at most `threads` of them at once, on a host framework's parallel-for
// when given, else on flat's worker threads.
struct Workers {
  int threads = 1;
  const ParallelFor* host = nullptr;
};

// Calls body(begin, end) on contiguous ranges that cover [0, items): min(threads, items,
// max_threads()) ranges, on the host's parallel-for, or on the worker threads (on threads of its
// own when those are busy). Starting threads per call cost about 60 us of a 140 us decode step
// (one token, 16 heads). The first exception a range throws is rethrown once all have finished.
template <class Body>
void parallel_ranges(int64_t items, const Workers& workers, Body&& body) {
  const int64_t parts =
      std::max<int64_t>(1, std::min<int64_t>({int64_t{workers.threads}, items, int64_t{max_threads()}}));
  if (parts == 1 && !workers.host) {
    body(int64_t{0}, items);
    return;
  }
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const std::function<void(int64_t)> run = [&](int64_t w) {
    try {
      body(items * w / parts, items * (w + 1) / parts);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  };
  if (workers.host) {
    (*workers.host)(int(parts), [&](int w) { run(w); });
  } else if (!run_on_pool(int(parts), run)) {
    std::vector<std::thread> own;
    for (int64_t w = 1; w < parts; ++w) own.emplace_back(run, w);
    run(0);
    for (auto& t : own) t.join();
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace flat::cpu

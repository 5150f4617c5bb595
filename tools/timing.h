// Wall-clock timing for the benchmarks.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace flat::tool {

inline double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One warm-up run, then the median of `repeats` timed runs.
inline double median_seconds(int repeats, const std::function<void()>& f) {
  f();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) times.push_back(seconds(f));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace flat::tool

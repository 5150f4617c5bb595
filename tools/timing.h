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

// Warm-up runs for at least kWarmupSeconds (and at least one run), then the median of `repeats`
// timed runs. One warm-up run is not enough on our VMs: the first passes over freshly written
// buffers run up to 2x slower (measured on the convolution, which streams 64 MiB in 2.5 ms: its
// first 5-7 runs, about 25 ms, took 3.5-6 ms, and after a pause of the process it starts slow
// again), so timing them would measure the host's memory management rather than the kernel.
inline constexpr double kWarmupSeconds = 0.1;

inline double median_seconds(int repeats, const std::function<void()>& f) {
  for (double warm = 0; warm < kWarmupSeconds;) warm += seconds(f);
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) times.push_back(seconds(f));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace flat::tool

// Wall-clock timing for the benchmarks.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <vector>

namespace flat::tool {

// One implementation of one pass: its median time and the work counted for it
// (docs/performance.md has the formulas).
struct Timing {
  double seconds = 0;
  double flops = 0;
  double bytes = 0;  // what it must move to and from memory
  // Of `flops`, those the pass runs on fp32 FMA rather than on its target's product unit (the
  // bench's product census, tools/vector_work.h); absent where no census was taken.
  std::optional<double> fma_flops;

  double gflops() const { return flops / seconds * 1e-9; }
  double gbs() const { return bytes / seconds * 1e-9; }
  double intensity() const { return flops / bytes; }  // FLOP per byte
};

// Forward then backward: times, FLOPs and bytes add up.
Timing operator+(const Timing& a, const Timing& b);

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

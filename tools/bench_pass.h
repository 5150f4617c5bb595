// What the benches of the streaming operations (the short convolution, tools/bench_conv.h; the
// output norm and gate, tools/bench_norm.h) report per pass, and how: each is timed fused and
// against a naive same-process baseline, and judged by its bytes against the copy bandwidth.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace flat::tool {

// One pass at the bench's shape. bytes and flops are what the operation's bench header counts.
struct PassResult {
  std::string pass;  // "forward" or "backward"
  double seconds = 0;
  double bytes = 0;
  double flops = 0;
  std::optional<double> baseline_seconds;  // the naive baseline on the same inputs

  double gbs() const { return bytes / seconds * 1e-9; }
  double gflops() const { return flops / seconds * 1e-9; }
  std::optional<double> speedup() const {
    if (!baseline_seconds) return std::nullopt;
    return *baseline_seconds / seconds;
  }
};

// The benches of calls on a pool of states (tools/bench_serve.h, the convolution's decode) rotate
// their timed runs over kPoolSets sets of pool rows, so that each run finds its states in memory
// rather than in the last level cache (a server's other layers pass through it between two steps
// of one layer). Set `set` of `rows` (pool rows, -1 kept): each moved by set * rows_per_set.
constexpr int64_t kPoolSets = 4;
std::vector<int64_t> rows_of_set(const std::vector<int64_t>& rows, int64_t set, int64_t rows_per_set);

// The median of `repeats` timed runs (tools/timing.h); with `progress`, "<what> ... 1.23 ms" on it.
double timed_pass(std::ostream* progress, const std::string& what, int repeats, const std::function<void()>& run);

// The passes as a markdown table (fused ms, GB/s, GFLOP/s, the baseline and the speedup); with
// copy_gbs (the measured copy bandwidth, bytes read plus written per second, in GB/s) also each
// pass's share of it.
void write_pass_table(const std::vector<PassResult>& results, std::optional<double> copy_gbs, std::ostream& out);

}  // namespace flat::tool

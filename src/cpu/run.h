// How one call runs on the CPU: which target's kernels, and which workers.
#pragma once

#include <cstdint>

#include "cpu/parallel.h"
#include "cpu/targets.h"

namespace flat::cpu {

struct Run {
  const Target& target;
  Workers workers;
  bool flush_subnormals = true;  // ExecutionContext::flush_subnormals
};

// parallel_ranges over the call's workers, each range inside the per-thread scope.
template <class Body>
void run_ranges(const Run& run, int64_t items, Body&& body) {
  parallel_ranges(items, run.workers, [&](int64_t begin, int64_t end) {
    const ThreadScope scope(run.target, run.flush_subnormals);
    body(begin, end);
  });
}

}  // namespace flat::cpu

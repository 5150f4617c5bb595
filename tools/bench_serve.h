// Serving for `flat bench`: one variant as a server runs it, every state in a pool [P, N, K, V]
// read and written in place through indices (flat::Sequences), the value scan off (the pool holds
// what the library wrote: Options::check_values). Four calls, each timed alone:
//   decode       `decodes` sequences, one token each (the decode path);
//   speculative  the same sequences, `draft` tokens each, the state after every token kept in a
//                pool row of its own (token_state_indices), as a verification step does;
//   prefill      `prefills` sequences of `longest`, longest / 2, ... tokens (the chunkwise path);
//   mixed        the prefills and the decodes packed into one call (cu_seqlens).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "flat/flat.h"
#include "timing.h"

namespace flat::tool {

struct BenchOptions;  // tools/bench_workload.h

struct ServeBenchOptions {
  int64_t decodes = 64, prefills = 4, longest = 1024, draft = 4;
};

// Work counted per call: FLOPs of the path each sequence takes (recurrent for decoding ones,
// chunkwise for prefills: src/variants.h); bytes of q, k, v, gates, strengths and y at their
// dtypes plus every state read from the pool and written to it, fp32.
struct ServeResult {
  std::string variant, part;
  int64_t sequences = 0, tokens = 0;
  Timing timing;

  double tokens_per_second() const { return double(tokens) / timing.seconds; }
};

// The four calls of one variant at the bench's N, K, V, dtype and chunk (and the variant's own
// shape where it has one: tools/bench_workload.h), on `threads` threads, the median of `repeats`
// runs each; "<variant> <part> ... 1.23 ms" lines on `progress` when given.
std::vector<ServeResult> bench_serving(Variant variant, const BenchOptions& bench, const ServeBenchOptions& options,
                                       int threads, int repeats, std::ostream* progress);

}  // namespace flat::tool

// The machine's ceilings, measured in the process that runs the benchmark: copy bandwidth,
// in-place update bandwidth, fp32 FMA peak, bf16 dot-product peak and bf16 tile peak, on 1 thread and on all the
// benchmark's threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace flat::tool {

// A rate measured on 1 thread and on `Ceilings::threads` threads started together.
struct Rate {
  double one = 0, all = 0;
};

struct Ceilings {
  int threads = 1;
  int64_t copy_bytes = 0;  // size of each of the two copy buffers
  Rate copy_gbs;           // GB/s, bytes read plus bytes written
  Rate update_gbs;         // GB/s of an in-place update of a buffer of copy_bytes, read plus written
  Rate fp32_gflops;        // fp32 multiply-add peak, a multiply-add counted as 2 FLOPs
  std::string fp32_loop;   // what measured it: "avx512 fma", "avx2 fma" or "portable"
  std::optional<Rate> bf16_gflops;  // bf16 dot-product peak (AVX512-BF16); absent without it
  // bf16 tile peak (AMX-BF16 tdpbf16ps, tools/peak_tiles.h); absent where the amx target does not run
  std::optional<Rate> tile_bf16_gflops;
};

// Measures every ceiling, best of a few runs each; about 2 s. `quick` shrinks the buffers and
// the loops to a few milliseconds in all, for tests: the numbers are then rough.
Ceilings measure_ceilings(int threads, bool quick);

}  // namespace flat::tool

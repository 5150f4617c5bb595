#include "ceilings.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu/targets.h"
#include "peak_tiles.h"

namespace flat::tool {
namespace {

// The peak loops: independent multiply-add chains on registers only, no memory operand. Each
// returns a value that depends on every chain so that none can be dropped. The chains
// converge (acc <- 0.999999 acc + 1e-6, or small bf16 products) so that no value overflows or
// turns subnormal, which would slow the units down.
struct PeakLoop {
  float (*run)(int64_t iterations);
  double flops_per_iteration;
};

template <size_t n>
float sum(const float (&lanes)[n]) {
  float total = 0.f;
  for (float x : lanes) total += x;
  return total;
}

#if defined(__x86_64__)
// The chain loops are unrolled whatever the optimisation level, so that the accumulators live in
// registers.
// Two FMA ports with 4 cycles of latency keep 8 FMAs in flight; 16 chains leave headroom
// (and cores with longer latencies) and still fit the 32 zmm registers.
constexpr int kZmmChains = 16;

[[gnu::target("avx512f")]] float fma_avx512(int64_t iterations) {
  __m512 acc[kZmmChains];
  for (int i = 0; i < kZmmChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-6f);
  for (int64_t it = 0; it < iterations; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kZmmChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  for (int i = 1; i < kZmmChains; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  return sum(lanes);
}

// vdpbf16ps: per fp32 lane two bf16 products added to the accumulator, 16 lanes x 4 FLOPs = 64
// FLOPs per instruction. Its latency is about that of an FMA; the same 16 chains cover it.
[[gnu::target("avx512f,avx512bf16")]] float dot_bf16_avx512(int64_t iterations) {
  __m512 acc[kZmmChains];
  for (int i = 0; i < kZmmChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 small = _mm512_set1_ps(1e-3f);
  const __m512bh a = _mm512_cvtne2ps_pbh(small, small), b = _mm512_cvtne2ps_pbh(small, small);
  for (int64_t it = 0; it < iterations; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kZmmChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  for (int i = 1; i < kZmmChains; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  return sum(lanes);
}

// 16 ymm registers: 12 chains (more than 2 ports x 4-5 cycles of latency) plus the two operands.
constexpr int kYmmChains = 12;

[[gnu::target("avx2,fma")]] float fma_avx2(int64_t iterations) {
  __m256 acc[kYmmChains];
  for (int i = 0; i < kYmmChains; ++i) acc[i] = _mm256_set1_ps(float(i));
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-6f);
  for (int64_t it = 0; it < iterations; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kYmmChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  for (int i = 1; i < kYmmChains; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  return sum(lanes);
}
#endif

// Any other CPU: whatever the compiler makes of independent lanes of multiply-adds, a multiply
// and an add (or one fused instruction) per element, 2 FLOPs.
constexpr int kPortableLanes = 64;

float fma_portable(int64_t iterations) {
  float acc[kPortableLanes];
  for (int i = 0; i < kPortableLanes; ++i) acc[i] = float(i);
  for (int64_t it = 0; it < iterations; ++it)
    for (float& a : acc) a = a * 0.999999f + 1e-6f;
  return sum(acc);
}

struct Fp32Peak {
  PeakLoop loop;
  const char* name;
};

// The fp32 peak of the instructions the default target's products run on (FLAT_ISA honoured: its
// needs, src/cpu/targets.h), so that the ceiling is that of the code measured against it.
Fp32Peak fp32_peak_loop() {
#if defined(__x86_64__)
  const cpu::CpuFeatures needs = cpu::default_target().needs;
  if (needs & cpu::kCpuAvx512f) return {{fma_avx512, kZmmChains * 16 * 2.0}, "avx512 fma"};
  if (needs & cpu::kCpuAvx2) return {{fma_avx2, kYmmChains * 8 * 2.0}, "avx2 fma"};
#endif
  return {{fma_portable, kPortableLanes * 2.0}, "portable"};
}

// The bf16 dot-product peak where the CPU has the instruction (whichever target runs).
std::optional<PeakLoop> bf16_peak_loop() {
#if defined(__x86_64__)
  if (cpu::cpu_features() & cpu::kCpuAvx512Bf16) return PeakLoop{dot_bf16_avx512, kZmmChains * 64.0};
#endif
  return std::nullopt;
}

// The tile unit's bf16 peak where the amx target runs (its loop built with that target's flags).
std::optional<PeakLoop> tile_peak_loop() {
#if defined(FLAT_TOOL_TILE_PEAK)
  const cpu::Target* amx = cpu::find_target("amx");
  if (amx && cpu::supported(*amx)) return PeakLoop{tile_bf16_peak, kTilePeakFlopsPerIteration};
#endif
  return std::nullopt;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds from the first of `threads` threads starting work(thread) until the last one has
// finished it, best of `repeats`. The threads are created once and start each run together from
// a barrier; each takes its own time stamps, so none depends on another being scheduled.
double best_parallel_seconds(int threads, int repeats, const std::function<void(int)>& work) {
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> start(size_t(threads) * repeats), end(start.size());
  std::barrier sync(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i)
    pool.emplace_back([&, i] {
      for (int r = 0; r < repeats; ++r) {
        sync.arrive_and_wait();
        start[size_t(r) * threads + i] = Clock::now();
        work(i);
        end[size_t(r) * threads + i] = Clock::now();
        sync.arrive_and_wait();
      }
    });
  for (auto& t : pool) t.join();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const auto first = start.begin() + r * threads, last = end.begin() + r * threads;
    const auto span = *std::max_element(last, last + threads) - *std::min_element(first, first + threads);
    best = std::min(best, std::chrono::duration<double>(span).count());
  }
  return best;
}

struct Budget {
  int64_t copy_bytes;
  int copy_repeats;
  double peak_seconds;  // per timed run of a peak loop
  int peak_repeats;
};

// GB/s of a copy between two buffers of `bytes`, split in equal slices over the threads.
// Counted as bytes read plus bytes written, as STREAM's copy does.
Rate measure_copy(int threads, const Budget& budget) {
  const int64_t bytes = budget.copy_bytes;
  // Distinct non-zero fills: every page is touched (mapped) before the timing starts.
  std::vector<char> src(size_t(bytes), 1), dst(size_t(bytes), 2);
  auto rate = [&](int parts) {
    const int64_t slice = bytes / parts / 64 * 64;  // cache-line aligned slices
    const double s = best_parallel_seconds(parts, budget.copy_repeats, [&](int i) {
      std::memcpy(dst.data() + i * slice, src.data() + i * slice, size_t(slice));
    });
    return 2.0 * double(slice * parts) / s * 1e-9;
  };
  return {rate(1), rate(threads)};
}

// GB/s of an in-place update of a buffer of `bytes` (each float read, scaled and written back),
// split in equal slices over the threads; bytes read plus bytes written. The roof of what updates
// states where they are (a serving pool's decode step): no write-allocate read, unlike a copy to a
// second buffer, where a copy by non-temporal stores may run below it on some machines.
Rate measure_update(int threads, const Budget& budget) {
  const int64_t count = budget.copy_bytes / int64_t(sizeof(float));
  std::vector<float> data(size_t(count), 1.0f);
  auto rate = [&](int parts) {
    const int64_t slice = count / parts / 16 * 16;  // cache-line aligned slices
    const double s = best_parallel_seconds(parts, budget.copy_repeats, [&](int i) {
      float* x = data.data() + i * slice;
      for (int64_t e = 0; e < slice; ++e) x[e] = x[e] * 0.5f + 0.5f;  // stays 1: no denormals
    });
    return 2.0 * double(slice * parts) * sizeof(float) / s * 1e-9;
  };
  return {rate(1), rate(threads)};
}

// GFLOP/s of a peak loop on 1 and on all threads, each thread running the same iterations. The
// iteration count is first sized to take `peak_seconds` on one thread.
Rate measure_peak(const PeakLoop& loop, int threads, const Budget& budget) {
  std::vector<float> sink(static_cast<size_t>(threads));
  int64_t iterations = 1024;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    sink[0] += loop.run(iterations);
    const double s = seconds_since(t0);
    if (s >= budget.peak_seconds / 8) {
      iterations = std::max<int64_t>(1, int64_t(double(iterations) * budget.peak_seconds / s));
      break;
    }
    iterations *= 4;
  }
  auto rate = [&](int parts) {
    const double s =
        best_parallel_seconds(parts, budget.peak_repeats, [&](int i) { sink[size_t(i)] += loop.run(iterations); });
    return loop.flops_per_iteration * double(iterations) * parts / s * 1e-9;
  };
  const Rate r{rate(1), rate(threads)};
  // The sums are kept, so the loops are not optimised away.
  volatile float kept = 0.f;
  for (float s : sink) kept = kept + s;
  return r;
}

}  // namespace

Ceilings measure_ceilings(int threads, bool quick) {
  // Full: buffers far beyond L2 and of the size of the benchmark's own tensors; peak runs long
  // enough for the clock to settle. Quick: some tens of milliseconds in all, the best of nine runs
  // of 2 ms per peak. In a shared VM the second vCPU is at times late or busy for milliseconds:
  // with two runs of 1 ms the 2-thread FMA peak read at the 1-thread level in 12 of 30 runs on an
  // EPYC Zen 3 (102.5 against 205 GFLOP/s; the bench then printed kernels at over 100% of it), with
  // nine of 2 ms in 1 of 30.
  const Budget budget = quick ? Budget{4 << 20, 3, 2e-3, 9} : Budget{256 << 20, 5, 0.04, 3};
  Ceilings c;
  c.threads = threads;
  c.copy_bytes = budget.copy_bytes;
  c.copy_gbs = measure_copy(threads, budget);
  c.update_gbs = measure_update(threads, budget);
  const Fp32Peak fp32 = fp32_peak_loop();
  c.fp32_loop = fp32.name;
  c.fp32_gflops = measure_peak(fp32.loop, threads, budget);
  if (const auto bf16 = bf16_peak_loop()) c.bf16_gflops = measure_peak(*bf16, threads, budget);
  if (const auto tiles = tile_peak_loop()) c.tile_bf16_gflops = measure_peak(*tiles, threads, budget);
  return c;
}

}  // namespace flat::tool

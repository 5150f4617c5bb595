// The floating-point mode flat's work runs in: subnormal numbers flushed to zero, as inputs
// (denormals-are-zero) and as results (flush-to-zero), for the span of the work on each thread,
// the thread's own mode restored after.
//
// Why: on Intel cores (Sapphire and Emerald Rapids among them) an arithmetic operation with a
// subnormal operand or result leaves the fast path for a microcode assist of about a hundred
// cycles. A chunk's decay factors exp(G_i - G_j) underflow gradually through the subnormal range
// (below 1.2e-38, a cumulative log-decay under -87) when gates are as strong as real models'
// (Gated DeltaNet's -exp(A_log) * softplus(a + dt_bias), a few units below 0 per token), and
// with the products built on them the chunked passes ran 8-18x slower. AMD's Zen 4 handles most
// subnormals in hardware, which hid it. What flushing means for the results: docs/algorithm.md,
// "Subnormal numbers".
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace flat::cpu {

// Sets the mode on construction when `flush`, and restores the thread's previous mode (every
// bit of it: rounding, exception masks, sticky flags) on destruction. Scopes nest. A flag in
// the control register, so it holds for every instruction set the thread runs: SSE, AVX and
// AVX-512 arithmetic all read MXCSR (the bf16 dot products and conversions flush regardless).
class FlushSubnormals {
 public:
  explicit FlushSubnormals(bool flush) : flush_(flush) {
    if (!flush_) return;
    saved_ = read();
    write(saved_ | kFlushBits);
  }
  ~FlushSubnormals() {
    if (flush_) write(saved_);
  }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

  // The bits of the control register that flush, and whether the calling thread has them set
  // (for the tests; false where the architecture has no such mode).
#if defined(__x86_64__) || defined(__i386__)
  static constexpr uint64_t kFlushBits = 0x8040;  // MXCSR: FTZ (bit 15) and DAZ (bit 6)
  static uint64_t read() { return _mm_getcsr(); }
  static void write(uint64_t mode) { _mm_setcsr(static_cast<unsigned>(mode)); }
#elif defined(__aarch64__)
  static constexpr uint64_t kFlushBits = uint64_t{1} << 24;  // FPCR.FZ: inputs and results
  static uint64_t read() { return __builtin_aarch64_get_fpcr64(); }
  static void write(uint64_t mode) { __builtin_aarch64_set_fpcr64(mode); }
#else
  static constexpr uint64_t kFlushBits = 0;
  static uint64_t read() { return 0; }
  static void write(uint64_t) {}
#endif
  static bool active() { return kFlushBits != 0 && (read() & kFlushBits) == kFlushBits; }

 private:
  bool flush_;
  uint64_t saved_ = 0;
};

}  // namespace flat::cpu

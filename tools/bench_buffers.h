// What the benches of the streaming operations (tools/bench_conv.cpp, tools/bench_norm.cpp) share
// to set up their problems and their naive baselines: deterministic inputs, aligned storage,
// tensors held in the bench's dtype, and the naive baselines' per-worker sums over rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <new>
#include <vector>

#include "cpu/parallel.h"
#include "flat/flat.h"

namespace flat::tool {

// Deterministic values in [-scale, scale): the same inputs in every run, so that runs compare.
inline std::vector<float> values(size_t n, uint64_t seed, float scale) {
  std::vector<float> out(n);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& v : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = scale * (float(state >> 40) / float(1 << 24) * 2.0f - 1.0f);
  }
  return out;
}

// 64-byte aligned storage, as a framework's allocator gives: the kernels' time should not depend
// on where a std::vector happened to land.
template <class T>
struct Aligned {
  explicit Aligned(size_t n) : count(n), data(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64))) {
    if (!data) throw std::bad_alloc();
  }
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  T* begin() const { return data; }
  T* end() const { return data + count; }
  size_t count;
  T* data;
};

// A dense tensor in the bench's dtype (bf16 or fp32), filled from fp32 values.
struct Sequence {
  DType dtype;
  Aligned<uint16_t> bf16;
  Aligned<float> f32;
  Sequence(DType d, const std::vector<float>& v)
      : dtype(d), bf16(d == DType::bf16 ? v.size() : 0), f32(d == DType::f32 ? v.size() : 0) {
    if (d == DType::bf16) std::transform(v.begin(), v.end(), bf16.data, to_bf16);
    else std::copy(v.begin(), v.end(), f32.data);
  }
  Tensor view(std::initializer_list<int64_t> shape) {
    void* data = dtype == DType::bf16 ? static_cast<void*>(bf16.data) : f32.data;
    return Tensor::contiguous(data, dtype, shape);
  }
  // The values as the kernels see them, for the fp32 baselines: the same inputs for both.
  std::vector<float> widened() const {
    if (dtype == DType::f32) return {f32.data, f32.data + f32.count};
    std::vector<float> out(bf16.count);
    std::transform(bf16.data, bf16.data + bf16.count, out.begin(), from_bf16);
    return out;
  }
};

// A naive baseline's gradient of a weight: `rows` split into one contiguous range per worker
// (at most `threads`), each summed by accumulate(begin, end, acc) into its own `width` floats of
// zeros, and the partial sums added in worker order at the end, as a framework's reduction
// over the batch and sequence does.
inline std::vector<float> sum_over_rows(int64_t rows, int threads, size_t width,
                                        const std::function<void(int64_t begin, int64_t end, float* acc)>& accumulate) {
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(threads, rows));
  std::vector<std::vector<float>> partial(size_t(workers), std::vector<float>(width, 0.0f));
  cpu::parallel_ranges(workers, {threads}, [&](int64_t wb, int64_t we) {
    for (int64_t worker = wb; worker < we; ++worker)
      accumulate(rows * worker / workers, rows * (worker + 1) / workers, partial[size_t(worker)].data());
  });
  std::vector<float> sum(width, 0.0f);
  for (const std::vector<float>& acc : partial)
    for (size_t i = 0; i < width; ++i) sum[i] += acc[i];
  return sum;
}

}  // namespace flat::tool

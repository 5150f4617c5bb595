// `flat bench` for the short convolution: the fused kernels (flat::conv_forward /
// conv_backward) and the naive unfused baseline, timed in the same process on the same inputs.
#include "bench_conv.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>
#include <ostream>
#include <thread>

#include "cpu/parallel.h"
#include "timing.h"

namespace flat::tool {
namespace {

// Deterministic values in [-scale, scale).
std::vector<float> values(size_t n, uint64_t seed, float scale) {
  std::vector<float> out(n);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& v : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = scale * (float(state >> 40) / float(1 << 24) * 2.0f - 1.0f);
  }
  return out;
}

// 64-byte aligned storage, as a framework's allocator gives.
template <class T>
struct Aligned {
  explicit Aligned(size_t n) : count(n), data(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64))) {
    if (!data) throw std::bad_alloc();
  }
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  size_t count;
  T* data;
};

// A [B, S, C] tensor in the bench's dtype.
struct Sequence {
  DType dtype;
  Aligned<uint16_t> bf16;
  Aligned<float> f32;
  Sequence(DType d, const std::vector<float>& v)
      : dtype(d), bf16(d == DType::bf16 ? v.size() : 0), f32(d == DType::f32 ? v.size() : 0) {
    if (d == DType::bf16) std::transform(v.begin(), v.end(), bf16.data, to_bf16);
    else std::copy(v.begin(), v.end(), f32.data);
  }
  Tensor view(const ConvBenchOptions& o) {
    void* data = dtype == DType::bf16 ? static_cast<void*>(bf16.data) : f32.data;
    return Tensor::contiguous(data, dtype, {o.B, o.S, o.C});
  }
  std::vector<float> widened() const {
    if (dtype == DType::f32) return {f32.data, f32.data + f32.count};
    std::vector<float> out(bf16.count);
    std::transform(bf16.data, bf16.data + bf16.count, out.begin(), from_bf16);
    return out;
  }
};

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// The naive baseline, fp32 [B, S, C] buffers, rows (b, t) split over threads.
struct Naive {
  const ConvBenchOptions& o;
  int threads;
  const std::vector<float>&x, &weight, &bias, &dy;  // bias empty: none
  std::vector<float> z, y, dz, dx, dweight, dbias;

  int64_t rows() const { return o.B * o.S; }
  size_t at(int64_t b, int64_t t, int64_t c) const { return size_t((b * o.S + t) * o.C + c); }
  bool silu() const { return o.activation == Activation::silu; }

  void forward() {
    const int W = o.W;
    cpu::parallel_ranges(rows(), {threads}, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / o.S, t = r % o.S;
        for (int64_t c = 0; c < o.C; ++c) {
          float acc = bias.empty() ? 0.0f : bias[size_t(c)];
          for (int w = 0; w < W; ++w) {
            const int64_t s = t - W + 1 + w;
            if (s >= 0) acc += weight[size_t(c * W + w)] * x[at(b, s, c)];
          }
          z[at(b, t, c)] = acc;
        }
      }
    });
    cpu::parallel_ranges(rows(), {threads}, [&](int64_t begin, int64_t end) {
      for (size_t i = size_t(begin * o.C); i < size_t(end * o.C); ++i) y[i] = silu() ? z[i] * sigmoid(z[i]) : z[i];
    });
  }

  void backward() {
    const int W = o.W;
    cpu::parallel_ranges(rows(), {threads}, [&](int64_t begin, int64_t end) {
      for (size_t i = size_t(begin * o.C); i < size_t(end * o.C); ++i) {
        float g = dy[i];
        if (silu()) {
          const float s = sigmoid(z[i]);
          g *= s * (1.0f + z[i] * (1.0f - s));
        }
        dz[i] = g;
      }
    });
    cpu::parallel_ranges(rows(), {threads}, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / o.S, t = r % o.S;
        for (int64_t c = 0; c < o.C; ++c) {
          float acc = 0.0f;
          for (int w = 0; w < W; ++w) {
            const int64_t s = t + W - 1 - w;
            if (s < o.S) acc += weight[size_t(c * W + w)] * dz[at(b, s, c)];
          }
          dx[at(b, t, c)] = acc;
        }
      }
    });
    // The weight and bias gradients: another pass over the whole sequence, one partial sum per
    // worker, added at the end.
    const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(threads, rows()));
    std::vector<std::vector<float>> partial(size_t(workers), std::vector<float>(size_t(o.C * (W + 1)), 0.0f));
    cpu::parallel_ranges(workers, {threads}, [&](int64_t wb, int64_t we) {
      for (int64_t worker = wb; worker < we; ++worker) {
        std::vector<float>& acc = partial[size_t(worker)];
        for (int64_t r = rows() * worker / workers; r < rows() * (worker + 1) / workers; ++r) {
          const int64_t b = r / o.S, t = r % o.S;
          for (int64_t c = 0; c < o.C; ++c) {
            const float g = dz[at(b, t, c)];
            for (int w = 0; w < W; ++w) {
              const int64_t s = t - W + 1 + w;
              if (s >= 0) acc[size_t(c * W + w)] += g * x[at(b, s, c)];
            }
            acc[size_t(o.C * W + c)] += g;
          }
        }
      }
    });
    std::fill(dweight.begin(), dweight.end(), 0.0f);
    std::fill(dbias.begin(), dbias.end(), 0.0f);
    for (const auto& acc : partial) {
      for (size_t i = 0; i < dweight.size(); ++i) dweight[i] += acc[i];
      for (size_t c = 0; c < dbias.size(); ++c) dbias[c] += acc[dweight.size() + c];
    }
  }
};

}  // namespace

std::vector<ConvBenchResult> bench_conv(const ConvBenchOptions& o, std::ostream* progress) {
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const size_t elements = size_t(o.B * o.S * o.C);
  const int W = o.W;
  Sequence x(o.dtype, values(elements, 1, 2.0f)), dy(o.dtype, values(elements, 2, 1.0f));
  Sequence y(o.dtype, std::vector<float>(elements)), dx(o.dtype, std::vector<float>(elements));
  std::vector<float> weight = values(size_t(o.C * W), 3, 0.5f), bias = values(size_t(o.C), 4, 0.2f);
  std::vector<float> dweight(weight.size()), dbias(bias.size());

  ConvInputs in;
  in.x = x.view(o);
  in.weight = Tensor::contiguous(weight.data(), DType::f32, {o.C, W});
  if (o.bias) in.bias = Tensor::contiguous(bias.data(), DType::f32, {o.C});
  ConvArgs fa(in);
  fa.y = y.view(o);
  ConvBackwardArgs ba(in);
  ba.dy = dy.view(o);
  ba.dx = dx.view(o);
  ba.dweight = Tensor::contiguous(dweight.data(), DType::f32, {o.C, W});
  if (o.bias) ba.dbias = Tensor::contiguous(dbias.data(), DType::f32, {o.C});
  ConvOptions options;
  options.activation = o.activation;
  ExecutionContext context;
  context.threads = threads;

  const double n = double(elements), e = o.dtype == DType::bf16 ? 2 : 4;
  const double taps = double(o.C) * W * 4 + (o.bias ? double(o.C) * 4 : 0);
  const double conv = 2.0 * W - (o.bias ? 0 : 1);
  const bool silu = o.activation == Activation::silu;
  ConvBenchResult forward{"forward", 0, 2 * n * e + taps, n * (conv + (silu ? 6 : 0)), std::nullopt};
  ConvBenchResult backward{"backward", 0, 3 * n * e + 2 * taps,
                           n * (conv + (silu ? 9 : 0) + (2.0 * W - 1) + 2.0 * W + (o.bias ? 1 : 0)), std::nullopt};

  const auto note = [&](const char* what) {
    if (progress) *progress << "conv " << what << " ..." << std::flush;
  };
  const auto done = [&](double s) {
    if (!progress) return;
    char text[32];
    std::snprintf(text, sizeof text, " %.2f ms\n", s * 1e3);
    *progress << text << std::flush;
  };
  note("forward, fused");
  forward.seconds = median_seconds(o.repeats, [&] { conv_forward(fa, options, context); });
  done(forward.seconds);
  note("backward, fused");
  backward.seconds = median_seconds(o.repeats, [&] { conv_backward(ba, options, context); });
  done(backward.seconds);

  if (o.baseline_repeats > 0) {
    const std::vector<float> xf = x.widened(), dyf = dy.widened(), no_bias;
    Naive naive{o, threads, xf, weight, o.bias ? bias : no_bias, dyf, {}, {}, {}, {}, {}, {}};
    naive.z.resize(elements);
    naive.y.resize(elements);
    naive.dz.resize(elements);
    naive.dx.resize(elements);
    naive.dweight.resize(weight.size());
    naive.dbias.resize(bias.size());
    note("forward, naive");
    forward.baseline_seconds = median_seconds(o.baseline_repeats, [&] { naive.forward(); });
    done(*forward.baseline_seconds);
    note("backward, naive");
    backward.baseline_seconds = median_seconds(o.baseline_repeats, [&] { naive.backward(); });
    done(*backward.baseline_seconds);
  }
  return {forward, backward};
}

void write_conv_markdown(const ConvBenchOptions& o, const std::vector<ConvBenchResult>& results,
                         std::optional<double> copy_gbs, std::ostream& out) {
  char line[256];
  std::snprintf(line, sizeof line, "Short convolution: B=%lld S=%lld C=%lld W=%d, %s, %s, %s\n\n", (long long)o.B,
                (long long)o.S, (long long)o.C, o.W, o.bias ? "bias" : "no bias",
                std::string(activation_name(o.activation)).c_str(), std::string(dtype_name(o.dtype)).c_str());
  out << line;
  out << "| pass | fused ms | GB/s | % of copy | GFLOP/s | naive ms | speedup |\n";
  out << "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const ConvBenchResult& r : results) {
    std::string share = "-", naive = "-", speedup = "-";
    if (copy_gbs) share = std::to_string(int(std::lround(100.0 * r.gbs() / *copy_gbs))) + "%";
    if (r.baseline_seconds) {
      std::snprintf(line, sizeof line, "%.2f", *r.baseline_seconds * 1e3);
      naive = line;
      std::snprintf(line, sizeof line, "%.1fx", *r.speedup());
      speedup = line;
    }
    std::snprintf(line, sizeof line, "| %s | %.2f | %.1f | %s | %.1f | %s | %s |\n", r.pass.c_str(), r.seconds * 1e3,
                  r.gbs(), share.c_str(), r.gflops(), naive.c_str(), speedup.c_str());
    out << line;
  }
}

}  // namespace flat::tool

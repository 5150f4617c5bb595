// `flat bench` for the short convolution: the fused kernels (flat::conv_forward /
// conv_backward) and the naive unfused baseline, timed in the same process on the same inputs.
#include "bench_conv.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstdio>
#include <ostream>
#include <thread>

#include "bench_buffers.h"
#include "cpu/parallel.h"

namespace flat::tool {
namespace {

constexpr int64_t kDecodeSequences = 64;
constexpr int kDecodeRepeats = 101;  // one position per sequence: fast and noisy, so many

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
    // The weight and bias gradients: another pass over the whole sequence.
    const std::vector<float> sums =
        sum_over_rows(rows(), threads, size_t(o.C * (W + 1)), [&](int64_t begin, int64_t end, float* acc) {
          for (int64_t r = begin; r < end; ++r) {
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
        });
    std::copy_n(sums.begin(), dweight.size(), dweight.begin());
    std::copy_n(sums.begin() + std::ptrdiff_t(o.C * W), dbias.size(), dbias.begin());
  }
};

}  // namespace

std::vector<PassResult> bench_conv(const ConvBenchOptions& o, std::ostream* progress) {
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const size_t elements = size_t(o.B * o.S * o.C);
  const int W = o.W;
  Sequence x(o.dtype, values(elements, 1, 2.0f)), dy(o.dtype, values(elements, 2, 1.0f));
  Sequence y(o.dtype, std::vector<float>(elements)), dx(o.dtype, std::vector<float>(elements));
  std::vector<float> weight = values(size_t(o.C * W), 3, 0.5f), bias = values(size_t(o.C), 4, 0.2f);
  std::vector<float> dweight(weight.size()), dbias(bias.size());

  ConvInputs in;
  in.x = x.view({o.B, o.S, o.C});
  in.weight = Tensor::contiguous(weight.data(), DType::f32, {o.C, W});
  if (o.bias) in.bias = Tensor::contiguous(bias.data(), DType::f32, {o.C});
  ConvArgs fa(in);
  fa.y = y.view({o.B, o.S, o.C});
  ConvBackwardArgs ba(in);
  ba.dy = dy.view({o.B, o.S, o.C});
  ba.dx = dx.view({o.B, o.S, o.C});
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
  PassResult forward{"forward", 0, 2 * n * e + taps, n * (conv + (silu ? 6 : 0)), std::nullopt};
  PassResult backward{"backward", 0, 3 * n * e + 2 * taps,
                           n * (conv + (silu ? 9 : 0) + (2.0 * W - 1) + 2.0 * W + (o.bias ? 1 : 0)), std::nullopt};

  forward.seconds = timed_pass(progress, "conv forward, fused", o.repeats, [&] { conv_forward(fa, options, context); });
  backward.seconds =
      timed_pass(progress, "conv backward, fused", o.repeats, [&] { conv_backward(ba, options, context); });

  // Decode: kDecodeSequences sequences of one position each, packed (cu_seqlens), their states in
  // a pool updated in place, its rows rotated over kPoolSets sets (tools/bench_pass.h).
  std::vector<PassResult> passes{forward, backward};
  if (W > 1 && o.S * o.B >= kDecodeSequences) {
    std::vector<float> pool = values(size_t(kPoolSets * kDecodeSequences * o.C * (W - 1)), 5, 1.0f);
    std::vector<int64_t> cu(kDecodeSequences + 1);
    std::iota(cu.begin(), cu.end(), 0);
    std::vector<int64_t> first_set(kDecodeSequences);
    std::iota(first_set.begin(), first_set.end(), 0);
    std::vector<std::vector<int64_t>> rows;
    for (int64_t set = 0; set < kPoolSets; ++set) rows.push_back(rows_of_set(first_set, set, kDecodeSequences));
    ConvArgs da(in);
    da.x = x.view({1, kDecodeSequences, o.C});
    da.y = y.view({1, kDecodeSequences, o.C});
    da.state0 = da.state =
        Tensor::contiguous(pool.data(), DType::f32, {kPoolSets * kDecodeSequences, o.C, int64_t(W - 1)});
    const double tokens = double(kDecodeSequences) * double(o.C);
    PassResult decode{"decode, 64 sequences from a pool", 0, 2 * tokens * e + 2 * tokens * (W - 1) * 4 + taps,
                      tokens * (conv + (silu ? 6 : 0)), std::nullopt};
    int turn = 0;
    decode.seconds = timed_pass(progress, "conv decode, fused", kDecodeRepeats, [&] {
      const std::vector<int64_t>& r = rows[size_t(turn++ % kPoolSets)];
      da.sequences = {cu, r, r, {}};
      conv_forward(da, options, context);
    });
    passes.push_back(decode);
  }

  if (o.baseline_repeats > 0) {
    const std::vector<float> xf = x.widened(), dyf = dy.widened(), no_bias;
    Naive naive{o, threads, xf, weight, o.bias ? bias : no_bias, dyf, {}, {}, {}, {}, {}, {}};
    naive.z.resize(elements);
    naive.y.resize(elements);
    naive.dz.resize(elements);
    naive.dx.resize(elements);
    naive.dweight.resize(weight.size());
    naive.dbias.resize(bias.size());
    passes[0].baseline_seconds =
        timed_pass(progress, "conv forward, naive", o.baseline_repeats, [&] { naive.forward(); });
    passes[1].baseline_seconds =
        timed_pass(progress, "conv backward, naive", o.baseline_repeats, [&] { naive.backward(); });
  }
  return passes;
}

void write_conv_markdown(const ConvBenchOptions& o, const std::vector<PassResult>& results,
                         std::optional<double> copy_gbs, std::ostream& out) {
  char line[256];
  std::snprintf(line, sizeof line, "Short convolution: B=%lld S=%lld C=%lld W=%d, %s, %s, %s\n\n", (long long)o.B,
                (long long)o.S, (long long)o.C, o.W, o.bias ? "bias" : "no bias",
                std::string(activation_name(o.activation)).c_str(), std::string(dtype_name(o.dtype)).c_str());
  out << line;
  write_pass_table(results, copy_gbs, out);
}

}  // namespace flat::tool

// What `flat bench` measures the variants on: its options, the problem of one variant (Shape) and
// its inputs and outputs (Workload), shared by the kernels' passes (tools/bench.cpp) and the
// serving passes (tools/bench_serve.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench_buffers.h"
#include "bench_conv.h"
#include "bench_model.h"
#include "bench_norm.h"
#include "bench_serve.h"
#include "cpu/targets.h"
#include "flat/flat.h"
#include "variants.h"

namespace flat::tool {

inline std::vector<Variant> every_variant() {
  std::vector<Variant> out;
  for (const VariantInfo& v : all_variants()) out.push_back(v.variant);
  return out;
}

// Whether a variant's gates come from the input, one or more per head and token, and so can be
// drawn as the models draw them (Workload::draw_model_gates); retnet's are constants of the model.
inline bool has_model_gates(const VariantInfo& variant) {
  return variant.gate != Gate::none && variant.gate != Gate::per_sequence;
}

struct BenchOptions {
  int64_t B = 2, S = 4096, N = 16, K = 128, V = 128;
  std::vector<Variant> variants = every_variant();
  int threads = 0;
  DType dtype = DType::bf16;
  int chunk = 64;
  int repeats = 5;
  Solve solve = Solve::automatic;
  Precision precision = Precision::exact;
  // A second target the fused kernels run on in the same run, each pass right after the default
  // target's, for the speedup (--against avx512); null for none.
  const cpu::Target* against = nullptr;
  bool conv = true;                 // the short convolution,
  ConvBenchOptions conv_shape;      // at this shape (--conv-shape B,S,C,W; tools/bench_conv.h)
  bool norm_gate = true;            // the output norm and gate,
  NormGateBenchOptions norm_shape;  // at this shape (--norm-shape B,S,N,D; tools/bench_norm.h)
  ServeBenchOptions serving;        // the serving calls (--serving-shape; tools/bench_serve.h)
  std::string json, plot;       // output files, empty for none
  bool quick_ceilings = false;  // milliseconds of ceiling measurement instead of seconds (tests)
};

// The problem one variant is measured on: the bench's shape, except where the variant has its
// own (bench_shape, tools/bench_model.h: sla's K = 256, each key head shared by 4 value heads: q, k, g, beta at
// N / R heads). The delta family runs with in-kernel L2 normalisation of q and k, as the models
// using it do (raw keys of this size would make I - beta k k^T expand the state).
struct Shape : ProblemSize {
  Shape(const BenchOptions& o, Variant variant_) : variant(info(variant_)), own(bench_shape(variant_)) {
    B = o.B;
    S = o.S;
    N = o.N;
    K = own.K > 0 ? own.K : o.K;
    V = o.V;
    R = o.N % own.value_heads == 0 ? own.value_heads : 1;
    G = variant.default_gate_group > 0 ? variant.default_gate_group : 1;
    chunk = o.chunk;
    dtype = o.dtype;
  }

  const VariantInfo& variant;
  const BenchShape own;

  std::string label() const {
    if (own.K == 0 && own.value_heads == 1) return variant.name;
    return std::string(variant.name) + " (K=" + std::to_string(K) + ", R=" + std::to_string(R) + ")";
  }
  int64_t gate_width() const { return variant.gate_width(K, G); }
};

// Inputs and outputs of one variant's problem, stored in the benchmarked dtype; shared by the
// fused kernels and the baselines, so all run on the same inputs.
struct Workload {
  // 64-byte aligned (Aligned, bench_buffers.h), as a framework's allocator gives: rows of whole
  // cache lines start on one, as the library's streamed outputs find them in a caller's tensors.
  struct Array {
    DType dtype;
    Aligned<float> f32;
    Aligned<uint16_t> bf16;
    Array(DType d, size_t n, std::mt19937& rng, float lo, float hi)
        : dtype(d), f32(d == DType::f32 ? n : 0), bf16(d == DType::bf16 ? n : 0) {
      std::uniform_real_distribution<float> dist(lo, hi);
      if (d == DType::bf16) {
        for (uint16_t& x : bf16) x = to_bf16(dist(rng));
      } else {
        for (float& x : f32) x = dist(rng);
      }
    }
    void* data() { return dtype == DType::bf16 ? static_cast<void*>(bf16.data) : f32.data; }
  };

  const Shape sh;
  std::mt19937 rng{7};
  Array q, k, v, g, beta, b, w, dy, y, dq, dk, dv, dg, dbeta, db, dw;
  Array h0, ht;  // [B, N, K, V] fp32, read and written by the decode steps

  Workload(const BenchOptions& o, Variant variant)
      : sh(o, variant),
        q(o.dtype, n(sh.key_heads(), sh.K), rng, -1, 1),
        k(o.dtype, n(sh.key_heads(), sh.K), rng, -1, 1),
        v(o.dtype, n(sh.N, sh.V), rng, -1, 1),
        g(DType::f32, n(sh.key_heads(), std::max<int64_t>(1, sh.gate_width())), rng, -0.2f, 0.f),
        beta(o.dtype, n(sh.key_heads(), 1), rng, 0.f, 1.f),
        b(o.dtype, n(sh.N, sh.K), rng, 0.f, 1.f),
        w(o.dtype, n(sh.N, sh.V), rng, 0.f, 1.f),
        dy(o.dtype, n(sh.N, sh.V), rng, -1, 1),
        y(o.dtype, n(sh.N, sh.V), rng, 0, 0),
        dq(o.dtype, n(sh.key_heads(), sh.K), rng, 0, 0),
        dk(o.dtype, n(sh.key_heads(), sh.K), rng, 0, 0),
        dv(o.dtype, n(sh.N, sh.V), rng, 0, 0),
        dg(DType::f32, n(sh.key_heads(), std::max<int64_t>(1, sh.gate_width())), rng, 0, 0),
        dbeta(o.dtype, n(sh.key_heads(), 1), rng, 0, 0),
        db(o.dtype, n(sh.N, sh.K), rng, 0, 0),
        dw(o.dtype, n(sh.N, sh.V), rng, 0, 0),
        h0(DType::f32, size_t(sh.B * sh.N * sh.K * sh.V), rng, -0.1f, 0.1f),
        ht(DType::f32, size_t(sh.B * sh.N * sh.K * sh.V), rng, 0, 0) {}

  // g drawn as Mamba-2, Gated DeltaNet and Kimi Linear (KDA) compute it from their parameters at
  // initialisation, in place of the weak uniform [-0.2, 0] draw: g = -A * softplus(a + dt_bias),
  // A = exp(A_log) ~ U(1, 16) per head, dt_bias = softplus^-1(dt) with dt log-uniform in
  // [0.001, 0.1] per gate column (per head, or per channel for KDA), a ~ N(0, 1) per token (the
  // projection of a normalised hidden state). A token's log-decay reaches -5, a chunk's sum
  // hundreds, so the chunk's decay factors pass through the subnormal range.
  void draw_model_gates() {
    std::mt19937 draws{11};
    const int64_t width = std::max<int64_t>(1, sh.gate_width()), columns = sh.key_heads() * width;
    std::uniform_real_distribution<double> decay_rate(1, 16), log_dt(std::log(1e-3), std::log(1e-1));
    std::normal_distribution<double> token(0, 1);
    const auto softplus = [](double x) { return x > 20 ? x : std::log1p(std::exp(x)); };
    std::vector<double> A(static_cast<size_t>(sh.key_heads())), dt_bias(static_cast<size_t>(columns));
    for (double& a : A) a = decay_rate(draws);
    for (double& bias : dt_bias) {
      const double dt = std::exp(log_dt(draws));
      bias = std::log(std::expm1(dt));
    }
    for (size_t i = 0; i < g.f32.count; ++i) {
      const size_t column = i % size_t(columns);
      g.f32.data[i] = float(-A[column / size_t(width)] * softplus(token(draws) + dt_bias[column]));
    }
  }

  size_t n(int64_t heads, int64_t width) const { return size_t(sh.B * sh.S * heads * width); }
  Tensor view(Array& a, int64_t heads, int64_t width) {
    return Tensor::contiguous(a.data(), a.dtype, {sh.B, sh.S, heads, width});
  }
  Tensor gate(Array& a) {
    if (!sh.variant.has_gate()) return {};
    const std::vector<int64_t> shape = sh.variant.gate_shape(sh.B, sh.S, sh.key_heads(), sh.K, sh.G);
    return Tensor::contiguous(a.data(), DType::f32, std::span<const int64_t>(shape));
  }
  // The strengths in place of the inputs, or their gradients in place of the outputs.
  void strengths(Inputs& in, Array& beta_, Array& b_, Array& w_) {
    if (sh.variant.has_erase_write()) {
      in.b = view(b_, sh.N, sh.K);
      in.w = view(w_, sh.N, sh.V);
    }
    if (sh.variant.has_beta()) in.beta = Tensor::contiguous(beta_.data(), beta_.dtype, {sh.B, sh.S, sh.key_heads()});
  }
  Inputs inputs() {
    Inputs a;
    a.q = view(q, sh.key_heads(), sh.K);
    a.k = view(k, sh.key_heads(), sh.K);
    a.v = view(v, sh.N, sh.V);
    a.g = gate(g);
    strengths(a, beta, b, w);
    return a;
  }
  ForwardArgs forward_args() {
    ForwardArgs a{inputs()};
    a.y = view(y, sh.N, sh.V);
    return a;
  }
  // The forward with the state read from h0 and written to ht, as a decode step runs it.
  ForwardArgs step_args() {
    ForwardArgs a = forward_args();
    a.h0 = Tensor::contiguous(h0.data(), DType::f32, {sh.B, sh.N, sh.K, sh.V});
    a.ht = Tensor::contiguous(ht.data(), DType::f32, {sh.B, sh.N, sh.K, sh.V});
    return a;
  }
  double state_bytes() const { return double(sh.B * sh.N * sh.K * sh.V) * 4; }
  BackwardArgs backward_args() {
    BackwardArgs a{inputs()};
    a.dy = view(dy, sh.N, sh.V);
    a.dq = view(dq, sh.key_heads(), sh.K);
    a.dk = view(dk, sh.key_heads(), sh.K);
    a.dv = view(dv, sh.N, sh.V);
    a.dg = gate(dg);
    Inputs grads;
    strengths(grads, dbeta, db, dw);
    a.dbeta = grads.beta;
    a.db = grads.b;
    a.dw = grads.w;
    return a;
  }
  Options options(const BenchOptions& o) const {
    Options opt;
    opt.chunk = o.chunk;
    opt.solve = o.solve;
    opt.precision = o.precision;
    opt.l2norm_qk = sh.variant.is_delta();
    return opt;
  }
};

}  // namespace flat::tool

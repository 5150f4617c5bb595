#include "bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "flat/flat.h"

namespace flat::tool {
namespace {

struct BenchOptions {
  int64_t B = 2, S = 4096, N = 16, K = 128, V = 128;
  std::vector<Variant> variants = {Variant::la, Variant::retnet, Variant::mamba2, Variant::gla};
  int threads = 0;
  DType dtype = DType::bf16;
  int chunk = 64;
  int repeats = 5;
};

// FLOPs of the chunkwise algorithm (docs/performance.md): per (batch, head) and chunk of L
// tokens, causal score tiles count L(L+1)/2 entries, state products L*K*V; a multiply-add is 2.
double chunk_flops(const BenchOptions& o, bool backward) {
  double total = 0;
  for (int64_t t0 = 0; t0 < o.S; t0 += o.chunk) {
    const double L = double(std::min<int64_t>(o.chunk, o.S - t0));
    const double tri = L * (L + 1) / 2, kv = L * double(o.K) * double(o.V);
    total += backward ? tri * (3.0 * o.K + 2.0 * o.V) + 5 * kv : tri * double(o.K + o.V) + 2 * kv;
  }
  return 2 * total * double(o.B * o.N);
}

// Inputs and outputs of one problem, stored in the benchmarked dtype.
struct Workload {
  struct Array {
    DType dtype;
    std::vector<float> f32;
    std::vector<uint16_t> bf16;
    Array(DType d, size_t n, std::mt19937& rng, float lo, float hi) : dtype(d) {
      std::uniform_real_distribution<float> dist(lo, hi);
      if (d == DType::bf16) {
        bf16.resize(n);
        for (auto& x : bf16) x = to_bf16(dist(rng));
      } else {
        f32.resize(n);
        for (auto& x : f32) x = dist(rng);
      }
    }
    void* data() { return dtype == DType::bf16 ? static_cast<void*>(bf16.data()) : f32.data(); }
  };

  const BenchOptions& o;
  std::mt19937 rng{7};
  Array q, k, v, g, dy, y, dq, dk, dv, dg;

  explicit Workload(const BenchOptions& opt)
      : o(opt),
        q(o.dtype, n(o.K), rng, -1, 1),
        k(o.dtype, n(o.K), rng, -1, 1),
        v(o.dtype, n(o.V), rng, -1, 1),
        g(DType::f32, n(o.K), rng, -0.2f, 0.f),
        dy(o.dtype, n(o.V), rng, -1, 1),
        y(o.dtype, n(o.V), rng, 0, 0),
        dq(o.dtype, n(o.K), rng, 0, 0),
        dk(o.dtype, n(o.K), rng, 0, 0),
        dv(o.dtype, n(o.V), rng, 0, 0),
        dg(DType::f32, n(o.K), rng, 0, 0) {}

  size_t n(int64_t width) const { return size_t(o.B * o.S * o.N * width); }
  Tensor view(Array& a, int64_t width) { return Tensor::contiguous(a.data(), a.dtype, {o.B, o.S, o.N, width}); }
  Tensor gate(Array& a, Variant variant) {
    switch (variant) {
      case Variant::la: return {};
      case Variant::retnet: return Tensor::contiguous(a.data(), DType::f32, {o.N});
      case Variant::mamba2: return Tensor::contiguous(a.data(), DType::f32, {o.B, o.S, o.N});
      case Variant::gla: return view(a, o.K);
    }
    return {};
  }
  Inputs inputs(Variant variant) {
    Inputs a;
    a.q = view(q, o.K);
    a.k = view(k, o.K);
    a.v = view(v, o.V);
    a.g = gate(g, variant);
    return a;
  }
  ForwardArgs forward_args(Variant variant) {
    ForwardArgs a{inputs(variant)};
    a.y = view(y, o.V);
    return a;
  }
  BackwardArgs backward_args(Variant variant) {
    BackwardArgs a{inputs(variant)};
    a.dy = view(dy, o.V);
    a.dq = view(dq, o.K);
    a.dk = view(dk, o.K);
    a.dv = view(dv, o.V);
    a.dg = gate(dg, variant);
    return a;
  }
};

double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One warm-up run, then the median of `repeats` timed runs.
double median_seconds(int repeats, const std::function<void()>& f) {
  f();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) times.push_back(seconds(f));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<int64_t> parse_ints(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) out.push_back(std::stoll(item));
  return out;
}

BenchOptions parse(const std::vector<std::string>& args) {
  BenchOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw Error("flat bench: " + a + " needs a value");
      return args[++i];
    };
    if (a == "--shape") {
      const auto d = parse_ints(value());
      if (d.size() != 5) throw Error("flat bench: --shape expects B,S,N,K,V");
      o.B = d[0], o.S = d[1], o.N = d[2], o.K = d[3], o.V = d[4];
    } else if (a == "--variant") {
      o.variants = {parse_variant(value())};
    } else if (a == "--threads") {
      o.threads = std::stoi(value());
    } else if (a == "--dtype") {
      const std::string& d = value();
      if (d != "f32" && d != "bf16") throw Error("flat bench: --dtype expects f32 or bf16, got " + d);
      o.dtype = d == "bf16" ? DType::bf16 : DType::f32;
    } else if (a == "--chunk") {
      o.chunk = std::stoi(value());
    } else if (a == "--repeats") {
      o.repeats = std::max(1, std::stoi(value()));
    } else {
      throw Error("flat bench: unknown option " + a);
    }
  }
  return o;
}

}  // namespace

int bench_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  BenchOptions o;
  try {
    o = parse(args);
  } catch (const std::exception& e) {
    err << e.what() << "\n";
    return 2;
  }
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  Options options;
  options.chunk = o.chunk;
  options.threads = threads;
  Workload w(o);

  char line[256];
  std::snprintf(line, sizeof line, "flat bench: B=%lld S=%lld N=%lld K=%lld V=%lld %s chunk=%d threads=%d, median of %d\n",
                (long long)o.B, (long long)o.S, (long long)o.N, (long long)o.K, (long long)o.V,
                std::string(dtype_name(o.dtype)).c_str(), o.chunk, threads, o.repeats);
  out << line;
  out << "| variant | pass     |  time ms | GFLOP/s |\n|---|---|---:|---:|\n";
  try {
    for (Variant variant : o.variants) {
      const std::string name(variant_name(variant));
      err << "timing " << name << " ...\n";
      const ForwardArgs fa = w.forward_args(variant);
      const BackwardArgs ba = w.backward_args(variant);
      const double fwd = median_seconds(o.repeats, [&] { forward(variant, fa, options); });
      const double bwd = median_seconds(o.repeats, [&] { backward(variant, ba, options); });
      const double fwd_flops = chunk_flops(o, false), bwd_flops = chunk_flops(o, true);
      for (auto [pass, t, flops] : {std::tuple{"forward", fwd, fwd_flops}, std::tuple{"backward", bwd, bwd_flops},
                                    std::tuple{"fwd+bwd", fwd + bwd, fwd_flops + bwd_flops}}) {
        std::snprintf(line, sizeof line, "| %-7s | %-8s | %8.2f | %7.1f |\n", name.c_str(), pass, t * 1e3,
                      flops / t * 1e-9);
        out << line;
      }
    }
  } catch (const Error& e) {
    err << "flat bench: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

}  // namespace flat::tool

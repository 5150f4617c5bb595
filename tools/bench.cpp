// `flat bench`: in one process, the machine's ceilings, then per variant the fused forward and
// backward, the baselines on the same inputs and the fused kernels on 1 thread, then the short
// convolution and the output norm and gate against their naive baselines; results as markdown
// tables, optionally JSON and a roofline plot (tools/report.h).
#include "bench.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <thread>

#include "baseline/baselines.h"
#include "bench_conv.h"
#include "bench_norm.h"
#include "ceilings.h"
#include "cpu/run.h"
#include "cpu/targets.h"
#include "flat/flat.h"
#include "params.h"
#include "variants.h"
#include "report.h"
#include "timing.h"

namespace flat::tool {
namespace {

// The baselines and the 1-thread runs take the median of at most this many runs: the fp32
// recurrence is slow, and the fused kernels are timed `repeats` times on all threads.
constexpr int kMaxBaselineRepeats = 3;
constexpr int kDecodeRepeats = 101;  // one-token steps: fast and noisy, so many

std::vector<Variant> every_variant() {
  std::vector<Variant> out;
  for (const VariantInfo& v : all_variants()) out.push_back(v.variant);
  return out;
}

struct BenchOptions {
  int64_t B = 2, S = 4096, N = 16, K = 128, V = 128;
  std::vector<Variant> variants = every_variant();
  int threads = 0;
  DType dtype = DType::bf16;
  int chunk = 64;
  int repeats = 5;
  Solve solve = Solve::automatic;
  bool conv = true;                 // the short convolution,
  ConvBenchOptions conv_shape;      // at this shape (--conv-shape B,S,C,W; tools/bench_conv.h)
  bool norm_gate = true;            // the output norm and gate,
  NormGateBenchOptions norm_shape;  // at this shape (--norm-shape B,S,N,D; tools/bench_norm.h)
  std::string json, plot;       // output files, empty for none
  bool quick_ceilings = false;  // milliseconds of ceiling measurement instead of seconds (tests)
};

// The problem one variant is measured on: the bench's shape, except where the variant has its
// own (src/variants.h: sla's K = 256, each key head shared by 4 value heads: q, k, g, beta at
// N / R heads). The delta family runs with in-kernel L2 normalisation of q and k, as the models
// using it do (raw keys of this size would make I - beta k k^T expand the state).
struct Shape : ProblemSize {
  Shape(const BenchOptions& o, Variant variant_) : variant(info(variant_)) {
    B = o.B;
    S = o.S;
    N = o.N;
    K = variant.bench_K > 0 ? variant.bench_K : o.K;
    V = o.V;
    R = o.N % variant.bench_value_heads == 0 ? variant.bench_value_heads : 1;
    G = variant.default_gate_group > 0 ? variant.default_gate_group : 1;
    chunk = o.chunk;
    dtype = o.dtype;
  }

  const VariantInfo& variant;

  std::string label() const {
    if (variant.bench_K == 0 && variant.bench_value_heads == 1) return variant.name;
    return std::string(variant.name) + " (K=" + std::to_string(K) + ", R=" + std::to_string(R) + ")";
  }
  int64_t gate_width() const { return variant.gate_width(K, G); }
};

// What the unfused baseline moves on top: every chunk-start state [items, chunks, K, W] fp32
// written once and read back once; in the backward the chunks' dH as well.
double state_round_trips(const Shape& sh, bool backward) {
  const double chunks = double((sh.S + sh.chunk - 1) / sh.chunk);
  const double states = double(sh.B * sh.N) * chunks * double(sh.K * sh.V) * 4;
  return (backward ? 4 : 2) * states;
}

// Inputs and outputs of one variant's problem, stored in the benchmarked dtype; shared by the
// fused kernels and the baselines, so all run on the same inputs.
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
    opt.l2norm_qk = sh.variant.is_delta();
    return opt;
  }
};

// "[3/32] gla backward, fused ... 412.3 ms" on the error stream, one line per measurement.
class Progress {
 public:
  Progress(std::ostream& err, int total) : err_(err), total_(total) {}
  void start(const std::string& what) {
    err_ << "[" << ++done_ << "/" << total_ << "] " << what << " ... " << std::flush;
  }
  void finish(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f ms\n", seconds * 1e3);
    err_ << text << std::flush;
  }
  void fail(const std::string& why) { err_ << "not measured: " << why << "\n" << std::flush; }

 private:
  std::ostream& err_;
  int total_, done_ = 0;
};

std::optional<Timing> operator+(const std::optional<Timing>& a, const std::optional<Timing>& b) {
  if (!a || !b) return std::nullopt;
  return *a + *b;
}

int64_t parse_integer(const std::string& option, const std::string& text, int64_t min) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || value < min)
    throw Error("flat bench: " + option + " expects an integer of at least " + std::to_string(min) + ", got '" +
                text + "'");
  return value;
}

// A shape's comma-separated sizes, each at least 1.
std::vector<int64_t> parse_sizes(const std::string& option, const std::string& text) {
  std::vector<int64_t> sizes;
  std::stringstream s(text);
  for (std::string item; std::getline(s, item, ',');) sizes.push_back(parse_integer(option, item, 1));
  return sizes;
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
      const std::string& text = value();
      const std::vector<int64_t> dims = parse_sizes(a, text);
      if (dims.size() != 5) throw Error("flat bench: --shape expects B,S,N,K,V, got '" + text + "'");
      o.B = dims[0], o.S = dims[1], o.N = dims[2], o.K = dims[3], o.V = dims[4];
    } else if (a == "--conv-shape") {
      const std::string& text = value();
      const std::vector<int64_t> dims = parse_sizes(a, text);
      if (dims.size() != 4 || dims[3] > 8)
        throw Error("flat bench: --conv-shape expects B,S,C,W with W from 1 to 8, got '" + text + "'");
      o.conv_shape.B = dims[0], o.conv_shape.S = dims[1], o.conv_shape.C = dims[2], o.conv_shape.W = int(dims[3]);
    } else if (a == "--norm-shape") {
      const std::string& text = value();
      const std::vector<int64_t> dims = parse_sizes(a, text);
      if (dims.size() != 4) throw Error("flat bench: --norm-shape expects B,S,N,D, got '" + text + "'");
      o.norm_shape.B = dims[0], o.norm_shape.S = dims[1], o.norm_shape.N = dims[2], o.norm_shape.D = dims[3];
    } else if (a == "--variant") {
      // One variant of the recurrence, or one of the other operations alone.
      const std::string& name = value();
      o.conv = name == "conv";
      o.norm_gate = name == "norm_gate";
      o.variants.clear();
      if (!o.conv && !o.norm_gate) o.variants.push_back(parse_variant(name));
    } else if (a == "--threads") {
      o.threads = int(parse_integer(a, value(), 0));
    } else if (a == "--dtype") {
      const std::string& d = value();
      if (d != "f32" && d != "bf16") throw Error("flat bench: --dtype expects f32 or bf16, got '" + d + "'");
      o.dtype = d == "bf16" ? DType::bf16 : DType::f32;
    } else if (a == "--chunk") {
      o.chunk = int(parse_integer(a, value(), 1));
    } else if (a == "--repeats") {
      o.repeats = int(parse_integer(a, value(), 1));
    } else if (a == "--json") {
      o.json = value();
    } else if (a == "--plot") {
      o.plot = value();
    } else if (a == "--solve") {
      const std::string& text = value();
      const std::pair<const char*, Solve> solves[] = {
          {"subst", Solve::substitution}, {"blocked", Solve::blocked}, {"doubling", Solve::doubling}};
      const auto it = std::find_if(std::begin(solves), std::end(solves), [&](const auto& e) { return text == e.first; });
      if (it == std::end(solves)) throw Error("flat bench: --solve expects subst, blocked or doubling, got '" + text + "'");
      o.solve = it->second;
    } else if (a == "--quick-ceilings") {
      o.quick_ceilings = true;
    } else {
      throw Error("flat bench: unknown option '" + a + "'");
    }
  }
  return o;
}

// An output file opened before anything is measured, so that a bad path fails at once.
std::ofstream open_output(const std::string& path) {
  std::ofstream file;
  if (path.empty()) return file;
  file.open(path);
  if (!file) throw Error("flat bench: cannot write '" + path + "'");
  return file;
}

// Times every pass of one variant: the fused kernels on all threads and on 1, and the
// baselines. A baseline that throws is reported as not measured; the fused kernels must run.
// Passes: forward and backward at the bench's shape; decode, one token (S = 1) with the state
// read from h0 and written to ht, as inference runs it, kDecodeRepeats times.
void bench_variant(Variant variant, const BenchOptions& o, int threads, Progress& progress, BenchReport& report) {
  BenchOptions one_token = o;
  one_token.S = 1;
  Workload w(o, variant), step(one_token, variant);
  const std::string name = w.sh.label();

  auto measure = [&](const std::string& what, int repeats, const std::function<void()>& run) {
    progress.start(name + " " + what);
    const double s = median_seconds(repeats, run);
    progress.finish(s);
    return s;
  };
  // A baseline that throws is reported as not measured.
  auto baseline = [&](const std::string& what, int repeats, const std::function<void()>& run) -> std::optional<double> {
    try {
      return measure(what, repeats, run);
    } catch (const std::exception& e) {
      progress.fail(e.what());
      return std::nullopt;
    }
  };
  auto timing = [](std::optional<double> s, double flops, double bytes) -> std::optional<Timing> {
    if (!s) return std::nullopt;
    return Timing{*s, flops, bytes};
  };

  enum class Pass { forward, backward, decode };
  auto bench_pass = [&](Pass pass) {
    const bool backward = pass == Pass::backward;
    Workload& data = pass == Pass::decode ? step : w;
    const std::string label = pass == Pass::forward ? "forward" : backward ? "backward" : "decode";
    const int repeats = pass == Pass::decode ? kDecodeRepeats : o.repeats;
    const int baseline_repeats = pass == Pass::decode ? kDecodeRepeats : report.baseline_repeats;
    const Options options = data.options(o);
    const ForwardArgs fa = pass == Pass::decode ? data.step_args() : data.forward_args();
    const BackwardArgs ba = data.backward_args();
    const Params fp = describe_forward(variant, fa, options), bp = describe_backward(variant, ba, options);
    const cpu::Run baselines{cpu::default_target(), {threads}};
    const double flops = chunk_flops(data.sh.variant, data.sh, backward),
                 bytes = io_bytes(data.sh.variant, data.sh, backward) + (pass == Pass::decode ? 2 * data.state_bytes() : 0);
    auto run_fused = [&](int on_threads) -> std::function<void()> {
      ExecutionContext context;
      context.threads = on_threads;
      return [&, context] {
        backward ? flat::backward(variant, ba, options, context) : flat::forward(variant, fa, options, context);
      };
    };
    KernelResult k;
    k.variant = name;
    k.pass = label;
    k.fused = {measure(label + ", fused", repeats, run_fused(threads)), flops, bytes};
    if (threads > 1)
      k.fused_1thread = timing(measure(label + ", fused on 1 thread", baseline_repeats, run_fused(1)),
                               flops, bytes);
    k.unfused = timing(baseline(label + ", unfused chunked baseline", baseline_repeats,
                                [&] {
                                  backward ? baseline::unfused_backward(bp, baselines)
                                           : baseline::unfused_forward(fp, baselines);
                                }),
                       flops, bytes + state_round_trips(data.sh, backward));
    k.recurrent =
        timing(baseline(label + ", fp32 recurrent baseline", baseline_repeats,
                        [&] {
                          backward ? baseline::recurrent_backward(bp, baselines)
                                   : baseline::recurrent_forward(fp, baselines);
                        }),
               recurrent_flops(data.sh.variant, data.sh, backward), bytes);
    return k;
  };

  const KernelResult forward = bench_pass(Pass::forward), backward = bench_pass(Pass::backward);
  report.kernels.push_back(forward);
  report.kernels.push_back(backward);
  report.kernels.push_back({name, "fwd+bwd", forward.fused + backward.fused,
                            forward.fused_1thread + backward.fused_1thread, forward.unfused + backward.unfused,
                            forward.recurrent + backward.recurrent});
  report.kernels.push_back(bench_pass(Pass::decode));
}

}  // namespace

int bench_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  BenchOptions o;
  std::ofstream json, plot;
  try {
    o = parse(args);
    json = open_output(o.json);
    plot = open_output(o.plot);
  } catch (const std::exception& e) {
    err << e.what() << "\n";
    return 2;
  }
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  // Every variant's arguments validated before anything is measured (on one token: the checks
  // do not depend on S).
  try {
    BenchOptions one_token = o;
    one_token.S = 1;
    for (Variant variant : o.variants) {
      Workload w(one_token, variant);
      describe_forward(variant, w.forward_args(), w.options(o));
      describe_backward(variant, w.backward_args(), w.options(o));
    }
  } catch (const Error& e) {
    err << e.what() << "\n";
    return 2;
  }

  BenchReport report;
  report.B = o.B, report.S = o.S, report.N = o.N, report.K = o.K, report.V = o.V;
  report.dtype = dtype_name(o.dtype);
  report.chunk = o.chunk;
  report.threads = threads;
  report.repeats = o.repeats;
  report.baseline_repeats = std::min(o.repeats, kMaxBaselineRepeats);
  report.decode_repeats = kDecodeRepeats;
  report.isa = cpu::default_target().name;
  report.products = cpu::default_target().products;

  const int per_variant = threads > 1 ? 12 : 9;
  Progress progress(err, 1 + per_variant * int(o.variants.size()));
  try {
    progress.start(o.quick_ceilings ? "ceilings (quick)" : "ceilings");
    const double ceiling_seconds = seconds([&] { report.ceilings = measure_ceilings(threads, o.quick_ceilings); });
    progress.finish(ceiling_seconds);
    for (Variant variant : o.variants) bench_variant(variant, o, threads, progress, report);
    if (o.conv) {
      ConvBenchOptions conv = o.conv_shape;
      conv.threads = threads;
      conv.dtype = o.dtype;
      conv.repeats = o.repeats;
      conv.baseline_repeats = report.baseline_repeats;
      report.conv = BenchReport::Conv{conv, bench_conv(conv, &err)};
    }
    if (o.norm_gate) {
      NormGateBenchOptions norm = o.norm_shape;
      norm.threads = threads;
      norm.dtype = o.dtype;
      norm.repeats = o.repeats;
      norm.baseline_repeats = report.baseline_repeats;
      report.norm_gate = BenchReport::NormGate{norm, bench_norm_gate(norm, &err)};
    }
  } catch (const std::exception& e) {
    err << "\nflat bench: " << e.what() << "\n";
    return 1;
  }

  write_markdown(report, out);
  const std::pair<std::ofstream*, void (*)(const BenchReport&, std::ostream&)> files[] = {{&json, write_json},
                                                                                          {&plot, write_roofline_svg}};
  for (const auto& [file, write] : files) {
    if (!file->is_open()) continue;
    write(report, *file);
    file->close();
    if (!*file) {
      err << "flat bench: failed writing " << (file == &json ? o.json : o.plot) << "\n";
      return 2;
    }
  }
  return 0;
}

}  // namespace flat::tool

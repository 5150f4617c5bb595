// `flat bench`: in one process, the machine's ceilings, then per variant the fused forward and
// backward, the baselines on the same inputs and the fused kernels on 1 thread; results as
// markdown tables, optionally JSON and a roofline plot (tools/report.h).
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
#include "ceilings.h"
#include "cpu/isa.h"
#include "flat/flat.h"
#include "params.h"
#include "report.h"
#include "timing.h"

namespace flat::tool {
namespace {

// The baselines and the 1-thread runs take the median of at most this many runs: the fp32
// recurrence is slow, and the fused kernels are timed `repeats` times on all threads.
constexpr int kMaxBaselineRepeats = 3;
constexpr int kDecodeRepeats = 101;  // one-token steps: fast and noisy, so many

struct BenchOptions {
  int64_t B = 2, S = 4096, N = 16, K = 128, V = 128;
  std::vector<Variant> variants = {Variant::la,       Variant::retnet,        Variant::mamba2,
                                   Variant::gla,      Variant::deltanet,      Variant::gated_deltanet,
                                   Variant::kda,      Variant::gdn2,          Variant::sla};
  int threads = 0;
  DType dtype = DType::bf16;
  int chunk = 64;
  int repeats = 5;
  Solve solve = Solve::automatic;
  // sla's own shape (SLA-R4): keys this wide, shared by this many value heads (N / R key heads).
  int64_t sla_K = 256, sla_R = 4;
  bool conv = true;                // the short convolution,
  ConvBenchOptions conv_shape;     // at this shape (--conv-shape B,S,C,W; tools/bench_conv.h)
  std::string json, plot;       // output files, empty for none
  bool quick_ceilings = false;  // milliseconds of ceiling measurement instead of seconds (tests)
};

// The problem one variant is measured on: the bench's shape, except sla's (K = sla_K, each key
// head shared by R value heads: q, k, g, beta at N / R heads). The delta family runs with
// in-kernel L2 normalisation of q and k, as the models using it do (raw keys of this size would
// make I - beta k k^T expand the state).
struct Shape {
  Shape(const BenchOptions& o, Variant variant)
      : variant(variant),
        B(o.B),
        S(o.S),
        N(o.N),
        K(variant == Variant::sla ? o.sla_K : o.K),
        V(o.V),
        R(variant == Variant::sla && o.N % o.sla_R == 0 ? o.sla_R : 1),
        delta(delta_kind(variant) != Delta::none) {}

  Variant variant;
  int64_t B, S, N, K, V, R;
  bool delta;

  int64_t key_heads() const { return N / R; }
  std::string label() const {
    if (variant != Variant::sla) return std::string(variant_name(variant));
    return std::string(variant_name(variant)) + " (K=" + std::to_string(K) + ", R=" + std::to_string(R) + ")";
  }
  // Values per token and key head of the gate: 0, 1, K, or K / G with the variant's default G.
  int64_t gate_width() const {
    switch (gate_kind(variant)) {
      case GateKind::none: return 0;
      case GateKind::scalar: return 1;
      case GateKind::channel: return default_gate_group(variant) > 0 ? K / default_gate_group(variant) : K;
    }
    return 0;
  }
  double gate_elements() const {
    return variant == Variant::retnet ? double(N) : double(B * S * key_heads() * gate_width());
  }
  // The delta rule's strengths per token and key head: beta, or gdn2's b [K] (w [V] is per head).
  double strength_elements() const {
    if (!delta) return 0;
    const double tokens = double(B * S);
    return variant == Variant::gdn2 ? tokens * double(N * K + N * V) : tokens * double(key_heads());
  }
};

// FLOPs of the chunkwise algorithm (docs/performance.md), a multiply-add as 2. Per item (batch
// and key head, its R value heads side by side: W = R*V) and chunk of L tokens, with
// tri = L(L+1)/2 causal score entries (tri' = L(L-1)/2 strictly causal), no padding counted:
//   additive forward  tri*(K + W) + 2*L*K*W
//   additive backward tri*(3K + 2W) + 5*L*K*W
//   delta forward     the additive forward with v := the new values, plus the chunk solve:
//                     tri'*K (L) + L^3/6 (T) + L*K*W (Bp H0) + tri*W (T Z)
//   delta backward    the additive backward, plus the solve twice (state pass and gradient pass:
//                     2*(tri'*K + L^3/6 + L*K*W + tri*W)), plus dZ = T^T dR (tri*W),
//                     dL = dZ R^T (tri'*W), dBp = dZ H0^T (L*K*W), dL through L (2*tri'*K),
//                     and Bp^T dZ into dH (L*K*W)
double chunk_flops(const BenchOptions& o, const Shape& sh, bool backward) {
  double total = 0;
  const double K = double(sh.K), W = double(sh.V * sh.R);
  for (int64_t t0 = 0; t0 < sh.S; t0 += o.chunk) {
    const double L = double(std::min<int64_t>(o.chunk, sh.S - t0));
    const double tri = L * (L + 1) / 2, strict = L * (L - 1) / 2, lkw = L * K * W;
    total += backward ? tri * (3 * K + 2 * W) + 5 * lkw : tri * (K + W) + 2 * lkw;
    if (!sh.delta) continue;
    const double solve = strict * K + L * L * L / 6 + lkw + tri * W;
    total += backward ? 2 * solve + tri * W + strict * W + lkw + 2 * strict * K + lkw : solve;
  }
  return 2 * total * double(sh.B * sh.key_heads());
}

// FLOPs of the step-by-step recurrence, per token and head in units of K*V (a multiply-add 2):
//   additive forward 5 (decay and k v^T into the state 3, y 2); backward 17 (the state advanced
//   twice, once to take the checkpoints and once to replay each segment, 6; dq 2; q dy^T into dH
//   2; dk 2; dv 2; the gate's dot product 2; dH's decay 1).
//   delta forward 7 (decay 1, r 2, k r^T 2, y 2); backward 26 (the state advanced twice 10, dq 2,
//   q dy^T 2, dk 2, dr 2, dH' 2, dbt 2, the gate's dot product 2, dH's decay 1, H' 1).
double recurrent_flops(const Shape& sh, bool backward) {
  const double per_token = sh.delta ? (backward ? 26.0 : 7.0) : (backward ? 17.0 : 5.0);
  return per_token * double(sh.K) * double(sh.V) * double(sh.B * sh.S * sh.N);
}

// Bytes a pass must move: every input read once and every output written once, at their
// dtypes (q, k, v, beta / b / w, y and their gradients in the bench's dtype, g and dg fp32).
//   forward:  q, k, v, g (, beta / b, w) read; y written
//   backward: the same and dy read; dq, dk, dv, dg (, dbeta / db, dw) written
double io_bytes(const BenchOptions& o, const Shape& sh, bool backward) {
  const double element = o.dtype == DType::bf16 ? 2 : 4;
  const double tokens = double(sh.B * sh.S);
  const double qk = tokens * double(2 * sh.key_heads() * sh.K) * element;
  const double v = tokens * double(sh.N * sh.V) * element, y = v;
  const double inputs = qk + v + sh.gate_elements() * 4 + sh.strength_elements() * element;
  return backward ? 2 * inputs + y : inputs + y;
}

// What the unfused baseline moves on top: every chunk-start state [items, chunks, K, W] fp32
// written once and read back once; in the backward the chunks' dH as well.
double state_round_trips(const BenchOptions& o, const Shape& sh, bool backward) {
  const double chunks = double((sh.S + o.chunk - 1) / o.chunk);
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
    if (sh.variant == Variant::retnet) return Tensor::contiguous(a.data(), DType::f32, {sh.N});
    if (sh.gate_width() == 1) return Tensor::contiguous(a.data(), DType::f32, {sh.B, sh.S, sh.N});
    if (sh.gate_width() == 0) return {};
    return view(a, sh.key_heads(), sh.gate_width());
  }
  // The strengths in place of the inputs, or their gradients in place of the outputs.
  void strengths(Inputs& in, Array& beta_, Array& b_, Array& w_) {
    if (!sh.delta) return;
    if (sh.variant == Variant::gdn2) {
      in.b = view(b_, sh.N, sh.K);
      in.w = view(w_, sh.N, sh.V);
    } else {
      in.beta = Tensor::contiguous(beta_.data(), beta_.dtype, {sh.B, sh.S, sh.key_heads()});
    }
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
  Options options(const BenchOptions& o, int threads) const {
    Options opt;
    opt.chunk = o.chunk;
    opt.threads = threads;
    opt.solve = o.solve;
    opt.l2norm_qk = sh.delta;
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
      std::vector<int64_t> dims;
      std::stringstream s(text);
      for (std::string item; std::getline(s, item, ',');) dims.push_back(parse_integer("--shape", item, 1));
      if (dims.size() != 5) throw Error("flat bench: --shape expects B,S,N,K,V, got '" + text + "'");
      o.B = dims[0], o.S = dims[1], o.N = dims[2], o.K = dims[3], o.V = dims[4];
    } else if (a == "--conv-shape") {
      const std::string& text = value();
      std::vector<int64_t> dims;
      std::stringstream s(text);
      for (std::string item; std::getline(s, item, ',');) dims.push_back(parse_integer("--conv-shape", item, 1));
      if (dims.size() != 4 || dims[3] > 8)
        throw Error("flat bench: --conv-shape expects B,S,C,W with W from 1 to 8, got '" + text + "'");
      o.conv_shape.B = dims[0], o.conv_shape.S = dims[1], o.conv_shape.C = dims[2], o.conv_shape.W = int(dims[3]);
    } else if (a == "--variant") {
      const std::string& name = value();
      o.conv = name == "conv";
      o.variants.clear();
      if (!o.conv) o.variants.push_back(parse_variant(name));
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
    const BenchOptions& shape = pass == Pass::decode ? one_token : o;
    const std::string label = pass == Pass::forward ? "forward" : backward ? "backward" : "decode";
    const int repeats = pass == Pass::decode ? kDecodeRepeats : o.repeats;
    const int baseline_repeats = pass == Pass::decode ? kDecodeRepeats : report.baseline_repeats;
    const Options options = data.options(o, threads), one_thread = data.options(o, 1);
    const ForwardArgs fa = pass == Pass::decode ? data.step_args() : data.forward_args();
    const BackwardArgs ba = data.backward_args();
    const Params fp = describe_forward(variant, fa, options), bp = describe_backward(variant, ba, options);
    const double flops = chunk_flops(shape, data.sh, backward),
                 bytes = io_bytes(shape, data.sh, backward) + (pass == Pass::decode ? 2 * data.state_bytes() : 0);
    auto run_fused = [&](const Options& opt) -> std::function<void()> {
      return [&, opt] { backward ? flat::backward(variant, ba, opt) : flat::forward(variant, fa, opt); };
    };
    KernelResult k;
    k.variant = name;
    k.pass = label;
    k.fused = {measure(label + ", fused", repeats, run_fused(options)), flops, bytes};
    if (threads > 1)
      k.fused_1thread = timing(measure(label + ", fused on 1 thread", baseline_repeats, run_fused(one_thread)),
                               flops, bytes);
    k.unfused = timing(baseline(label + ", unfused chunked baseline", baseline_repeats,
                                [&] { backward ? baseline::unfused_backward(bp) : baseline::unfused_forward(fp); }),
                       flops, bytes + state_round_trips(shape, data.sh, backward));
    k.recurrent =
        timing(baseline(label + ", fp32 recurrent baseline", baseline_repeats,
                        [&] { backward ? baseline::recurrent_backward(bp) : baseline::recurrent_forward(fp); }),
               recurrent_flops(data.sh, backward), bytes);
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
      describe_forward(variant, w.forward_args(), w.options(o, threads));
      describe_backward(variant, w.backward_args(), w.options(o, threads));
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
  report.isa = cpu::isa_name(cpu::active_isa());

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

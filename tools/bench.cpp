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
#include "bench_serve.h"
#include "bench_workload.h"
#include "ceilings.h"
#include "cpu/on_target.h"
#include "cpu/run.h"
#include "cpu/targets.h"
#include "flat/flat.h"
#include "params.h"
#include "variants.h"
#include "report.h"
#include "timing.h"
#include "vector_work.h"

namespace flat::tool {
namespace {

// The baselines and the 1-thread runs take the median of at most this many runs: the fp32
// recurrence is slow, and the fused kernels are timed `repeats` times on all threads.
constexpr int kMaxBaselineRepeats = 3;
constexpr int kDecodeRepeats = 101;  // one-token steps: fast and noisy, so many
constexpr int kServingRepeats = 21;  // the serving calls: a few to tens of milliseconds each

// What the unfused baseline moves on top: every chunk-start state [items, chunks, K, W] fp32
// written once and read back once; in the backward the chunks' dH as well.
double state_round_trips(const Shape& sh, bool backward) {
  const double chunks = double((sh.S + sh.chunk - 1) / sh.chunk);
  const double states = double(sh.B * sh.N) * chunks * double(sh.K * sh.V) * 4;
  return (backward ? 4 : 2) * states;
}

// The fastest unit a target's chunk products run on: the tile unit for a target with tile
// products, the bf16 dot products for one that needs them (its products of bf16 values run there),
// the FMA units otherwise.
ProductUnit product_unit(const cpu::Target& target) {
  if (target.tile_products) return ProductUnit::bf16_tiles;
  if (target.needs & cpu::kCpuAvx512Bf16) return ProductUnit::bf16_dot;
  return ProductUnit::fp32_fma;
}

// What the target's chunk products run on, in words: the report's title.
const char* products_in_words(const cpu::Target& target) {
  switch (product_unit(target)) {
    case ProductUnit::bf16_tiles:
      return "products with an operand of bf16 values on AMX tiles (every product at fast precision), the others on "
             "fp32 FMA";
    case ProductUnit::bf16_dot:
      return "products of bf16 values on bf16 dot products (every product at fast precision), the others on fp32 FMA";
    case ProductUnit::fp32_fma: break;
  }
  return target.needs & cpu::kCpuFma ? "chunk products on fp32 FMA" : "chunk products in portable C++";
}

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
    } else if (a == "--serving-shape") {
      const std::string& text = value();
      const std::vector<int64_t> dims = parse_sizes(a, text);
      if (dims.size() != 4)
        throw Error("flat bench: --serving-shape expects DECODES,PREFILLS,LONGEST,DRAFT, got '" + text + "'");
      o.serving = {dims[0], dims[1], dims[2], dims[3]};
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
      o.solve = parse_solve(value());
    } else if (a == "--precision") {
      o.precision = parse_precision(value());
    } else if (a == "--against") {
      const std::string& name = value();
      o.against = cpu::find_target(name);
      if (!o.against) throw Error("flat bench: --against: no target named '" + name + "' in this build");
      if (!cpu::supported(*o.against))
        throw Error("flat bench: --against: this CPU (or its OS) does not run the " + name + " target");
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

// `params` with every row of its token-row tensors (q, k, v, g, the strengths, y, dy and their
// gradients) at one place: token stride 0, so that each (batch, head) reads and writes a single row
// of each, in the L1 cache, while the pass does all the work it does on the real rows; the outputs
// stored as cached rows (not streamed past the caches, Params::streamed_outputs). Its time is the
// pass without the memory traffic of its rows (the states' stay); the results are wrong: timing
// only, through the driver's entry.
Params rows_in_cache(Params params) {
  for (RowView* rows : {&params.q, &params.k, &params.v, &params.g, &params.beta, &params.b, &params.w, &params.y,
                        &params.dy, &params.dq, &params.dk, &params.dv, &params.dg, &params.dbeta, &params.db,
                        &params.dw})
    rows->stride1 = 0;
  params.streamed_outputs = false;
  return params;
}

// Times every pass of one variant: the fused kernels on all threads and on 1, and the
// baselines. A baseline that throws is reported as not measured; the fused kernels must run.
// Passes: forward and backward at the bench's shape; decode, one token (S = 1) with the state
// read from h0 and written to ht, as inference runs it, kDecodeRepeats times.
void bench_variant(Variant variant, const BenchOptions& o, int threads, const std::optional<cpu::Target>& vector_work,
                   Progress& progress, BenchReport& report) {
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
    return Timing{*s, flops, bytes, std::nullopt};
  };

  // A pass (the backward when `backward`, else the forward, of `params`) on `target` through the
  // driver's entry (no argument or value checks), timed `repeats` times and counted as `counts`.
  auto on_driver = [&](const std::string& what, const cpu::Target& target, bool backward, const Params& params,
                       int repeats, const Timing& counts) {
    ExecutionContext context;
    context.threads = threads;
    const double s = measure(what, repeats, [&] {
      backward ? cpu::backward_on(target, params, context) : cpu::forward_on(target, params, context);
    });
    return Timing{s, counts.flops, counts.bytes, counts.fma_flops};
  };
  // The same on the bench's target with its chunk products zeroed (tools/vector_work.h): the pass's
  // vector work. Absent where the build has no such stages.
  auto vector_work_of = [&](const std::string& what, bool backward, const Params& params,
                            const Timing& counts) -> std::optional<Timing> {
    if (!vector_work) return std::nullopt;
    return on_driver(what + ", vector work alone (products zeroed, results wrong)", *vector_work, backward, params,
                     o.repeats, counts);
  };

  // The pass's FLOPs on fp32 FMA: `flops` split as its product census (tools/vector_work.h), one run
  // on the bench's target with each product counted by the unit it runs on, splits its
  // multiply-adds. Absent where the build has no counting stages.
  auto fma_flops_of = [&](bool backward, const Params& params, double flops) -> std::optional<double> {
    ExecutionContext context;
    context.threads = threads;
    const std::optional<ProductCensus> census = product_census(cpu::default_target(), [&](const cpu::Target& counting) {
      backward ? cpu::backward_on(counting, params, context) : cpu::forward_on(counting, params, context);
    });
    if (!census) return std::nullopt;
    return flops * census->fma_share();
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
    k.fused = {measure(label + ", fused", repeats, run_fused(threads)), flops, bytes, std::nullopt};
    const Params& params = backward ? bp : fp;
    if (pass != Pass::decode) k.fused.fma_flops = fma_flops_of(backward, params, flops);
    if (o.against || pass != Pass::decode)
      k.compared = on_driver(label + ", fused on " + cpu::default_target().name + " (driver)", cpu::default_target(),
                             backward, params, repeats, k.fused);
    if (o.against)
      k.against = on_driver(label + ", fused on " + o.against->name + " (driver)", *o.against, backward, params,
                            repeats, k.fused);
    if (pass != Pass::decode) {
      k.rows_in_cache = on_driver(label + ", every row in cache (token stride 0, results wrong)", cpu::default_target(),
                                  backward, rows_in_cache(params), repeats, k.fused);
      k.vector_work = vector_work_of(label, backward, params, k.fused);
    }
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
  if (has_model_gates(w.sh.variant)) {
    // The same passes on gates as the models draw them, subnormals flushed as the library runs
    // and kept as the CPU runs by default: the first against the weak gates' time above shows
    // what strong gates cost, the second what flushing saves.
    w.draw_model_gates();
    const Options options = w.options(o);
    const ForwardArgs fa = w.forward_args();
    const BackwardArgs ba = w.backward_args();
    const Params fp = describe_forward(variant, fa, options), bp = describe_backward(variant, ba, options);
    for (const KernelResult* weak : {&forward, &backward}) {
      auto run_fused = [&](bool flush) {
        ExecutionContext context;
        context.threads = threads;
        context.flush_subnormals = flush;
        return median_seconds(o.repeats, [&] {
          weak == &backward ? flat::backward(variant, ba, options, context)
                            : flat::forward(variant, fa, options, context);
        });
      };
      auto timed = [&](const std::string& what, bool flush) {
        progress.start(name + " " + weak->pass + ", " + what);
        const double s = run_fused(flush);
        progress.finish(s);
        return Timing{s, weak->fused.flops, weak->fused.bytes, weak->fused.fma_flops};
      };
      const Timing model = timed("model gates", true), kept = timed("model gates, subnormals kept", false);
      const bool is_backward = weak == &backward;
      report.gates.push_back({name, weak->pass, weak->fused, model, kept,
                              vector_work_of(weak->pass + ", model gates", is_backward, is_backward ? bp : fp,
                                             weak->fused)});
    }
  }
  report.kernels.push_back({name, "fwd+bwd", forward.fused + backward.fused,
                            forward.fused_1thread + backward.fused_1thread, forward.unfused + backward.unfused,
                            forward.recurrent + backward.recurrent, forward.against + backward.against,
                            forward.compared + backward.compared, forward.vector_work + backward.vector_work,
                            forward.rows_in_cache + backward.rows_in_cache});
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
  report.precision = precision_name(o.precision);
  report.chunk = o.chunk;
  report.threads = threads;
  report.repeats = o.repeats;
  report.baseline_repeats = std::min(o.repeats, kMaxBaselineRepeats);
  report.decode_repeats = kDecodeRepeats;
  report.serving_repeats = kServingRepeats;
  report.isa = cpu::default_target().name;
  report.products = products_in_words(cpu::default_target());
  report.product_unit = product_unit(cpu::default_target());
  if (o.against) report.against = o.against->name;
  const std::optional<cpu::Target> vector_work = vector_work_target(cpu::default_target());

  // Per variant: the fused passes on all threads and on 1 and the baselines (forward, backward,
  // decode); the forward and the backward through the driver's entry and with every row in cache, and
  // the decode's through the driver with --against; each pass on the --against target; the vector
  // work of the forward and the backward.
  const int per_variant = (threads > 1 ? 12 : 9) + 4 + (o.against ? 4 : 0) + (vector_work ? 2 : 0),
            per_gated_variant = vector_work ? 6 : 4;
  int measurements = 1;
  for (Variant variant : o.variants) measurements += per_variant + (has_model_gates(info(variant)) ? per_gated_variant : 0);
  Progress progress(err, measurements);
  try {
    progress.start(o.quick_ceilings ? "ceilings (quick)" : "ceilings");
    const double ceiling_seconds = seconds([&] { report.ceilings = measure_ceilings(threads, o.quick_ceilings); });
    progress.finish(ceiling_seconds);
    for (Variant variant : o.variants) bench_variant(variant, o, threads, vector_work, progress, report);
    if (!o.variants.empty()) report.serving = BenchReport::Serving{o.serving, {}};
    for (Variant variant : o.variants) {
      const std::vector<ServeResult> served = bench_serving(variant, o, o.serving, threads, kServingRepeats, &err);
      report.serving->results.insert(report.serving->results.end(), served.begin(), served.end());
    }
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

#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <ostream>

namespace flat::tool {

Timing operator+(const Timing& a, const Timing& b) {
  std::optional<double> fma_flops;
  if (a.fma_flops && b.fma_flops) fma_flops = *a.fma_flops + *b.fma_flops;
  return {a.seconds + b.seconds, a.flops + b.flops, a.bytes + b.bytes, fma_flops};
}

namespace {

template <class... Args>
std::string format(const char* pattern, Args... args) {
  char text[1024];
  std::snprintf(text, sizeof text, pattern, args...);
  return text;
}

std::optional<double> speedup(const std::optional<Timing>& baseline, const Timing& fused) {
  if (!baseline) return std::nullopt;
  return baseline->seconds / fused.seconds;
}

// The bench's own target against BenchReport::against, both timed through the driver's entry.
std::optional<double> speedup_over_against(const KernelResult& k) {
  return k.compared ? speedup(k.against, *k.compared) : std::nullopt;
}

std::optional<double> seconds(const std::optional<Timing>& t) {
  if (!t) return std::nullopt;
  return t->seconds;
}

std::string cell(const std::optional<double>& x, const char* pattern) { return x ? format(pattern, *x) : "n/a"; }

// Milliseconds with three decimals below 1 ms (decode steps), two above.
std::string ms(const std::optional<double>& seconds) {
  if (!seconds) return "n/a";
  return format(*seconds < 1e-3 ? "%8.3f" : "%8.2f", *seconds * 1e3);
}

std::string shape_line(const BenchReport& r) {
  return format("B=%lld S=%lld N=%lld K=%lld V=%lld %s precision=%s chunk=%d threads=%d", (long long)r.B,
                (long long)r.S, (long long)r.N, (long long)r.K, (long long)r.V, r.dtype.c_str(), r.precision.c_str(),
                r.chunk, r.threads);
}

}  // namespace

namespace {

// The mixed call's tokens/s against its parts' run alone, the decode and prefill calls of the same
// variant together: their tokens over the sum of their times. Absent for the other calls.
std::optional<double> mixed_against_parts(const std::vector<ServeResult>& results, const ServeResult& mixed) {
  if (mixed.part != "mixed") return std::nullopt;
  double tokens = 0, seconds = 0;
  for (const ServeResult& r : results)
    if (r.variant == mixed.variant && (r.part == "decode" || r.part == "prefill")) {
      tokens += double(r.tokens);
      seconds += r.timing.seconds;
    }
  return mixed.tokens_per_second() / (tokens / seconds);
}

void write_serving_markdown(const BenchReport& r, std::ostream& out) {
  const ServeBenchOptions& o = r.serving->options;
  out << format("\nServing, every state in a pool [P, N, K, V] read and written in place through indices, the value "
                "scan off; median of %d runs each: decode (%lld sequences, 1 token each), speculative (the same, %lld "
                "tokens each, every token's state kept in a pool row), prefill (%lld sequences of %lld, %lld, ... "
                "tokens), mixed (the prefills and the decodes in one call; against the decode and prefill calls' "
                "tokens over their summed times):\n\n",
                r.serving_repeats, (long long)o.decodes, (long long)o.draft, (long long)o.prefills,
                (long long)o.longest, (long long)(o.longest / 2));
  out << "| variant | call | sequences | tokens | time ms | tokens/s | GB/s | % of copy | % of update | GFLOP/s | "
         "% of FMA peak | vs parts alone |\n"
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  const Ceilings& c = r.ceilings;
  for (const ServeResult& k : r.serving->results) {
    const Timing& t = k.timing;
    out << format("| %s | %s | %lld | %lld | %s | %.0f | %.1f | %.0f | %.0f | %.1f | %.0f | %s |\n", k.variant.c_str(),
                  k.part.c_str(), (long long)k.sequences, (long long)k.tokens, ms(t.seconds).c_str(),
                  k.tokens_per_second(), t.gbs(), 100 * t.gbs() / c.copy_gbs.all, 100 * t.gbs() / c.update_gbs.all,
                  t.gflops(), 100 * t.gflops() / c.fp32_gflops.all,
                  cell(mixed_against_parts(r.serving->results, k), "x%.2f").c_str());
  }
}

}  // namespace

const char* unit_name(ProductUnit unit) {
  switch (unit) {
    case ProductUnit::fp32_fma: return "fp32 FMA";
    case ProductUnit::bf16_dot: return "bf16 dot products";
    case ProductUnit::bf16_tiles: return "bf16 tiles";
  }
  return "";
}

namespace {

// The all-thread peak of the unit alone, GFLOP/s (the FMA's where the CPU lacks it).
double unit_peak(const BenchReport& r) {
  const Ceilings& c = r.ceilings;
  switch (r.product_unit) {
    case ProductUnit::fp32_fma: break;
    case ProductUnit::bf16_dot:
      if (c.bf16_gflops) return c.bf16_gflops->all;
      break;
    case ProductUnit::bf16_tiles:
      if (c.tile_bf16_gflops) return c.tile_bf16_gflops->all;
      break;
  }
  return c.fp32_gflops.all;
}

// The roof of a pass with no product census: every FLOP at the unit's peak, where the bf16
// dot-product unit's roof is the faster of it and the FMA units (its products of fp32 values run
// on the FMA units: the FMA's on Intel, the dot products' on AMD).
double product_peak(const BenchReport& r) {
  if (r.product_unit == ProductUnit::bf16_dot) return std::max(r.ceilings.fp32_gflops.all, unit_peak(r));
  return unit_peak(r);
}

// Seconds of a pass's FLOPs at the peak of the unit each runs on: with a product census, those on
// fp32 FMA at its peak and the rest at the product unit's; without, every one at product_peak.
double product_seconds(const BenchReport& r, const Timing& t) {
  if (!t.fma_flops) return t.flops / (product_peak(r) * 1e9);
  return (t.flops - *t.fma_flops) / (unit_peak(r) * 1e9) + *t.fma_flops / (r.ceilings.fp32_gflops.all * 1e9);
}

// The share of a pass's FLOPs on fp32 FMA, by its census.
std::optional<double> fma_share(const Timing& t) {
  if (!t.fma_flops || t.flops <= 0) return std::nullopt;
  return *t.fma_flops / t.flops;
}

// Milliseconds of a pass through the driver's entry beyond the same with every row in cache: the
// time of its rows' memory traffic that its work does not hide.
std::optional<double> exposed_memory_ms(const KernelResult& k) {
  if (!k.compared || !k.rows_in_cache) return std::nullopt;
  return (k.compared->seconds - k.rows_in_cache->seconds) * 1e3;
}

std::optional<double> vector_work_over_memory(const KernelResult& k, const Standing& s) {
  if (!k.vector_work) return std::nullopt;
  return k.vector_work->seconds / s.memory_seconds;
}

}  // namespace

Standing standing(const BenchReport& r, const Timing& t) {
  const Ceilings& c = r.ceilings;
  Standing s;
  s.memory_seconds = t.bytes / (c.copy_gbs.all * 1e9);
  s.product_seconds = product_seconds(r, t);
  s.percent_of_roofline = s.roofline_seconds() / t.seconds * 100;
  s.percent_of_product_peak = s.product_seconds / t.seconds * 100;
  if (c.bf16_gflops) s.percent_of_bf16_peak = t.gflops() / c.bf16_gflops->all * 100;
  if (c.tile_bf16_gflops) s.percent_of_tile_peak = t.gflops() / c.tile_bf16_gflops->all * 100;
  return s;
}

void write_markdown(const BenchReport& r, std::ostream& out) {
  const Ceilings& c = r.ceilings;
  out << "flat bench: " << shape_line(r) << "\n";
  out << "fused kernels on " << r.isa << ": " << r.products << "\n\n";

  out << "Ceilings, measured in this run (best of a few):\n\n";
  out << format("| ceiling | 1 thread | %d threads |\n|---|---:|---:|\n", c.threads);
  out << format("| copy bandwidth GB/s (2 x %lld MiB, read + written) | %.1f | %.1f |\n",
                (long long)(c.copy_bytes >> 20), c.copy_gbs.one, c.copy_gbs.all);
  out << format("| in-place update GB/s (%lld MiB, read + written back) | %.1f | %.1f |\n",
                (long long)(c.copy_bytes >> 20), c.update_gbs.one, c.update_gbs.all);
  out << format("| fp32 FMA peak GFLOP/s (%s) | %.1f | %.1f |\n", c.fp32_loop.c_str(), c.fp32_gflops.one,
                c.fp32_gflops.all);
  if (c.bf16_gflops)
    out << format("| bf16 dot-product peak GFLOP/s (avx512_bf16) | %.1f | %.1f |\n", c.bf16_gflops->one,
                  c.bf16_gflops->all);
  else
    out << "| bf16 dot-product peak GFLOP/s | none on this CPU | none on this CPU |\n";
  if (c.tile_bf16_gflops)
    out << format("| bf16 tile peak GFLOP/s (amx tdpbf16ps, 4 accumulator tiles) | %.1f | %.1f |\n",
                  c.tile_bf16_gflops->one, c.tile_bf16_gflops->all);
  else
    out << "| bf16 tile peak GFLOP/s (amx) | none on this CPU | none on this CPU |\n";

  out << format("\nFused kernels on %s at %s precision, %d threads, median of %d runs after a warm-up (fwd+bwd: "
                "the sum of the two; decode: one token, the state read from h0 and written to ht, median of %d "
                "runs). Memory: the pass's bytes at the copy bandwidth; products: its FLOPs at the peak of the unit "
                "each runs on, by the pass's product census (a run with each product counted by the unit the "
                "target's table chooses for it, and the diagonal blocks on fp32 FMA; on FMA: the share of its "
                "FLOPs there): %s %.1f GFLOP/s, fp32 FMA %.1f GFLOP/s (without a census, every FLOP at %.1f "
                "GFLOP/s); the roofline is the larger. Vector work: the pass with its products replaced by a kernel "
                "that only zeroes their outputs (timing only, its results wrong), through the driver's entry:\n\n",
                r.isa.c_str(), r.precision.c_str(), r.threads, r.repeats, r.decode_repeats, unit_name(r.product_unit),
                unit_peak(r), c.fp32_gflops.all, product_peak(r));
  out << "| variant | pass | time ms | GFLOP/s | GB/s | FLOP/B | memory ms | products ms | on FMA | bound "
         "| % of roofline | % of product peak | vector work ms | vector work / memory |\n"
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|\n";
  for (const KernelResult& k : r.kernels) {
    const Timing& t = k.fused;
    const Standing s = standing(r, t);
    const std::optional<double> on_fma = fma_share(t);
    out << format("| %-6s | %-8s | %s | %7.1f | %6.1f | %6.1f | %s | %s | %s | %-7s | %5.1f | %5.1f | %s | %s |\n",
                  k.variant.c_str(), k.pass.c_str(), ms(t.seconds).c_str(), t.gflops(), t.gbs(), t.intensity(),
                  ms(s.memory_seconds).c_str(), ms(s.product_seconds).c_str(),
                  cell(on_fma ? std::optional<double>(*on_fma * 100) : std::nullopt, "%.0f%%").c_str(),
                  s.compute_bound() ? "compute" : "memory", s.percent_of_roofline, s.percent_of_product_peak,
                  ms(seconds(k.vector_work)).c_str(), cell(vector_work_over_memory(k, s), "x%.2f").c_str());
  }

  out << format("\nWhere each pass's time goes, on %s through the driver's entry (no argument or value checks), "
                "median of %d runs: the pass as it runs; the same with every row of its token-row tensors at one "
                "place (token stride 0: all its work, its rows read and written in the L1 cache, results wrong); "
                "the difference, exposed: the time of the rows' memory traffic that the work does not hide, and that over "
                "the pass's memory time:\n\n",
                r.isa.c_str(), r.repeats);
  out << "| variant | pass | driver ms | rows in cache ms | in cache / driver | exposed ms | memory ms "
         "| exposed / memory |\n"
         "|---|---|---:|---:|---:|---:|---:|---:|\n";
  for (const KernelResult& k : r.kernels) {
    if (!k.rows_in_cache) continue;
    const Standing s = standing(r, k.fused);
    const std::optional<double> exposed = exposed_memory_ms(k);
    out << format("| %-6s | %-8s | %s | %s | %s | %s | %s | %s |\n", k.variant.c_str(), k.pass.c_str(),
                  ms(seconds(k.compared)).c_str(), ms(seconds(k.rows_in_cache)).c_str(),
                  cell(k.compared ? std::optional<double>(k.rows_in_cache->seconds / k.compared->seconds * 100)
                                  : std::nullopt,
                       "%.0f%%")
                      .c_str(),
                  cell(exposed, "%.2f").c_str(), ms(s.memory_seconds).c_str(),
                  cell(exposed ? std::optional<double>(*exposed / (s.memory_seconds * 1e3)) : std::nullopt,
                       "x%.2f")
                      .c_str());
  }

  if (!r.against.empty()) {
    out << format("\nThe same fused kernels on %s and %s in this run, same inputs, threads and precision (%s), "
                  "both through the driver's entry (no argument or value checks), each pass timed on %s right "
                  "after %s; speedup = its time / %s's:\n\n",
                  r.isa.c_str(), r.against.c_str(), r.precision.c_str(), r.against.c_str(), r.isa.c_str(),
                  r.isa.c_str());
    out << format("| variant | pass | %s ms | %s ms | speedup | %s GFLOP/s |\n|---|---|---:|---:|---:|---:|\n",
                  r.isa.c_str(), r.against.c_str(), r.against.c_str());
    for (const KernelResult& k : r.kernels)
      out << format("| %-6s | %-8s | %s | %s | %s | %s |\n", k.variant.c_str(), k.pass.c_str(),
                    ms(seconds(k.compared)).c_str(), ms(seconds(k.against)).c_str(),
                    cell(speedup_over_against(k), "x%.2f").c_str(),
                    cell(k.against ? std::optional<double>(k.against->gflops()) : std::nullopt, "%.1f").c_str());
  }

  out << format("\nBaselines on the same inputs in this run, median of %d runs after a warm-up; speedup = their "
                "time / the fused time (decode: median of %d runs). The fused kernels on 1 thread, and their scaling "
                "to %d threads:\n\n",
                r.baseline_repeats, r.decode_repeats, r.threads);
  out << "| variant | pass | fused ms | unfused ms | speedup | recurrent fp32 ms | speedup | 1 thread ms | scaling |\n"
         "|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const KernelResult& k : r.kernels) {
    const std::optional<double> scaling = speedup(k.fused_1thread, k.fused);
    out << format("| %-6s | %-8s | %s | %s | %s | %s | %s | %s | %s |\n", k.variant.c_str(), k.pass.c_str(),
                  ms(k.fused.seconds).c_str(), ms(seconds(k.unfused)).c_str(),
                  cell(speedup(k.unfused, k.fused), "x%.2f").c_str(), ms(seconds(k.recurrent)).c_str(),
                  cell(speedup(k.recurrent, k.fused), "x%.2f").c_str(), ms(seconds(k.fused_1thread)).c_str(),
                  cell(scaling, "x%.2f").c_str());
  }
  if (!r.gates.empty()) {
    out << format("\nGates as the models draw them (g = -exp(A_log) * softplus(a + dt_bias) at Mamba-2's, Gated "
                  "DeltaNet's and Kimi Linear's initialisation) against the weak gates above, fused on %d threads, "
                  "median of %d runs; subnormals flushed as the library runs, then kept as the CPU runs by "
                  "default (ExecutionContext::flush_subnormals = false); the model gates' pass with its products "
                  "zeroed (vector work, as above) and the same over the pass's memory time:\n\n",
                  r.threads, r.repeats);
    out << "| variant | pass | weak gates ms | model gates ms | model / weak | subnormals kept ms | kept / flushed "
           "| model gates vector work ms | vector work / memory |\n"
           "|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const GateResult& g : r.gates) {
      const std::optional<double> over_memory =
          g.model_vector_work ? std::optional<double>(g.model_vector_work->seconds / standing(r, g.model).memory_seconds)
                              : std::nullopt;
      out << format("| %-6s | %-8s | %s | %s | x%.2f | %s | x%.2f | %s | %s |\n", g.variant.c_str(), g.pass.c_str(),
                    ms(g.weak.seconds).c_str(), ms(g.model.seconds).c_str(), g.model.seconds / g.weak.seconds,
                    ms(g.model_subnormals_kept.seconds).c_str(), g.model_subnormals_kept.seconds / g.model.seconds,
                    ms(seconds(g.model_vector_work)).c_str(), cell(over_memory, "x%.2f").c_str());
    }
  }
  if (r.conv) {
    out << "\n";
    write_conv_markdown(r.conv->options, r.conv->results, c.copy_gbs.all, out);
  }
  if (r.norm_gate) {
    out << "\n";
    write_norm_gate_markdown(r.norm_gate->options, r.norm_gate->results, c.copy_gbs.all, out);
  }
  if (r.serving) write_serving_markdown(r, out);
}

namespace {

std::string json_number(double x) { return std::isfinite(x) ? format("%.6g", x) : "null"; }

std::string json_number(const std::optional<double>& x) { return x ? json_number(*x) : "null"; }

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) out += format("\\u%04x", ch);
    else out += ch;
  }
  return out + "\"";
}

std::string json_rate(const Rate& r) {
  return "{\"one_thread\": " + json_number(r.one) + ", \"all_threads\": " + json_number(r.all) + "}";
}

std::string json_timing(const std::optional<Timing>& t) {
  if (!t) return "null";
  return "{\"ms\": " + json_number(t->seconds * 1e3) + ", \"flops\": " + json_number(t->flops) +
         ", \"fma_flops\": " + json_number(t->fma_flops) + ", \"bytes\": " + json_number(t->bytes) + ", \"gflop_per_s\": " + json_number(t->gflops()) +
         ", \"gb_per_s\": " + json_number(t->gbs()) + ", \"flop_per_byte\": " + json_number(t->intensity()) + "}";
}

// The passes of a streaming operation's bench (tools/bench_pass.h) as a JSON array, one object a
// line, indented to sit inside an object at the top level.
std::string json_passes(const std::vector<PassResult>& passes, double copy_gbs) {
  std::string out = "[";
  for (size_t i = 0; i < passes.size(); ++i) {
    const PassResult& p = passes[i];
    out += (i ? "," : "") + std::string("\n      {\"pass\": ") + json_string(p.pass) +
           ", \"ms\": " + json_number(p.seconds * 1e3) + ", \"bytes\": " + json_number(p.bytes) +
           ", \"flops\": " + json_number(p.flops) + ", \"gb_per_s\": " + json_number(p.gbs()) +
           ", \"percent_of_copy\": " + json_number(100.0 * p.gbs() / copy_gbs) +
           ", \"gflop_per_s\": " + json_number(p.gflops()) + ",\n       \"naive_ms\": " +
           json_number(p.baseline_seconds ? std::optional<double>(*p.baseline_seconds * 1e3) : std::nullopt) +
           ", \"speedup_over_naive\": " + json_number(p.speedup()) + "}";
  }
  return out + "\n    ]";
}

}  // namespace

void write_json(const BenchReport& r, std::ostream& out) {
  const Ceilings& c = r.ceilings;
  out << "{\n";
  out << "  \"command\": \"flat bench\",\n";
  out << format("  \"shape\": {\"B\": %lld, \"S\": %lld, \"N\": %lld, \"K\": %lld, \"V\": %lld},\n", (long long)r.B,
                (long long)r.S, (long long)r.N, (long long)r.K, (long long)r.V);
  out << "  \"dtype\": " << json_string(r.dtype) << ",\n";
  out << "  \"precision\": " << json_string(r.precision) << ",\n";
  out << format("  \"chunk\": %d,\n  \"threads\": %d,\n  \"repeats\": %d,\n  \"baseline_repeats\": %d,\n"
                "  \"decode_repeats\": %d,\n",
                r.chunk, r.threads, r.repeats, r.baseline_repeats, r.decode_repeats);
  out << "  \"isa\": " << json_string(r.isa) << ",\n";
  out << "  \"product_unit\": " << json_string(unit_name(r.product_unit))
      << ", \"product_unit_peak_gflop_per_s\": " << json_number(unit_peak(r))
      << ", \"product_peak_gflop_per_s\": " << json_number(product_peak(r)) << ",\n";
  out << "  \"against\": " << (r.against.empty() ? "null" : json_string(r.against)) << ",\n";
  out << "  \"ceilings\": {\n";
  out << format("    \"threads\": %d,\n    \"copy_buffer_bytes\": %lld,\n", c.threads, (long long)c.copy_bytes);
  out << "    \"copy_gb_per_s\": " << json_rate(c.copy_gbs) << ",\n";
  out << "    \"update_gb_per_s\": " << json_rate(c.update_gbs) << ",\n";
  out << "    \"fp32_fma_gflop_per_s\": " << json_rate(c.fp32_gflops) << ",\n";
  out << "    \"fp32_fma_loop\": " << json_string(c.fp32_loop) << ",\n";
  out << "    \"bf16_dot_gflop_per_s\": " << (c.bf16_gflops ? json_rate(*c.bf16_gflops) : "null") << ",\n";
  out << "    \"bf16_tile_gflop_per_s\": " << (c.tile_bf16_gflops ? json_rate(*c.tile_bf16_gflops) : "null") << "\n";
  out << "  },\n";
  out << "  \"kernels\": [";
  for (size_t i = 0; i < r.kernels.size(); ++i) {
    const KernelResult& k = r.kernels[i];
    const Standing s = standing(r, k.fused);
    out << (i ? "," : "") << "\n    {";
    out << "\"variant\": " << json_string(k.variant) << ", \"pass\": " << json_string(k.pass) << ",\n";
    out << "     \"fused\": " << json_timing(k.fused) << ",\n";
    out << "     \"memory_ms\": " << json_number(s.memory_seconds * 1e3)
        << ", \"products_ms\": " << json_number(s.product_seconds * 1e3)
        << ", \"roofline_ms\": " << json_number(s.roofline_seconds() * 1e3)
        << ", \"bound\": " << json_string(s.compute_bound() ? "compute" : "memory")
        << ", \"percent_of_roofline\": " << json_number(s.percent_of_roofline)
        << ", \"percent_of_product_peak\": " << json_number(s.percent_of_product_peak) << ",\n";
    out << "     \"vector_work\": " << json_timing(k.vector_work)
        << ", \"vector_work_over_memory\": " << json_number(vector_work_over_memory(k, s))
        << ", \"percent_of_bf16_dot_peak\": " << json_number(s.percent_of_bf16_peak)
        << ", \"percent_of_bf16_tile_peak\": " << json_number(s.percent_of_tile_peak) << ",\n";
    out << "     \"fused_1_thread\": " << json_timing(k.fused_1thread)
        << ", \"thread_scaling\": " << json_number(speedup(k.fused_1thread, k.fused)) << ",\n";
    out << "     \"unfused\": " << json_timing(k.unfused)
        << ", \"speedup_over_unfused\": " << json_number(speedup(k.unfused, k.fused)) << ",\n";
    out << "     \"recurrent_fp32\": " << json_timing(k.recurrent)
        << ", \"speedup_over_recurrent\": " << json_number(speedup(k.recurrent, k.fused)) << ",\n";
    const std::optional<double> exposed = exposed_memory_ms(k);
    out << "     \"rows_in_cache\": " << json_timing(k.rows_in_cache)
        << ", \"exposed_memory_ms\": " << json_number(exposed) << ", \"exposed_over_memory\": "
        << json_number(exposed ? std::optional<double>(*exposed / (s.memory_seconds * 1e3)) : std::nullopt)
        << ",\n";
    out << "     \"against\": " << json_timing(k.against) << ", \"compared\": " << json_timing(k.compared)
        << ", \"speedup_over_against\": " << json_number(speedup_over_against(k)) << "}";
  }
  out << "\n  ],\n  \"gates\": [";
  for (size_t i = 0; i < r.gates.size(); ++i) {
    const GateResult& g = r.gates[i];
    out << (i ? "," : "") << "\n    {\"variant\": " << json_string(g.variant) << ", \"pass\": " << json_string(g.pass)
        << ",\n     \"weak\": " << json_timing(g.weak) << ",\n     \"model\": " << json_timing(g.model)
        << ",\n     \"model_subnormals_kept\": " << json_timing(g.model_subnormals_kept)
        << ",\n     \"model_vector_work\": " << json_timing(g.model_vector_work) << "}";
  }
  out << "\n  ]";
  if (r.conv) {
    const ConvBenchOptions& o = r.conv->options;
    out << ",\n  \"conv\": {\n";
    out << format("    \"shape\": {\"B\": %lld, \"S\": %lld, \"C\": %lld, \"W\": %d},\n", (long long)o.B,
                  (long long)o.S, (long long)o.C, o.W);
    out << "    \"bias\": " << (o.bias ? "true" : "false") << ", \"activation\": "
        << json_string(std::string(activation_name(o.activation))) << ", \"dtype\": "
        << json_string(std::string(dtype_name(o.dtype))) << ",\n";
    out << "    \"passes\": " << json_passes(r.conv->results, c.copy_gbs.all) << "\n  }";
  }
  if (r.norm_gate) {
    const NormGateBenchOptions& o = r.norm_gate->options;
    out << ",\n  \"norm_gate\": {\n";
    out << format("    \"shape\": {\"B\": %lld, \"S\": %lld, \"N\": %lld, \"D\": %lld},\n", (long long)o.B,
                  (long long)o.S, (long long)o.N, (long long)o.D);
    out << "    \"gate\": " << (o.gate ? "true" : "false") << ", \"activation\": "
        << json_string(std::string(activation_name(o.activation)))
        << ", \"norm_before_gate\": " << (o.norm_before_gate ? "true" : "false")
        << ", \"weight_per_head\": " << (o.weight_per_head ? "true" : "false")
        << ", \"dtype\": " << json_string(std::string(dtype_name(o.dtype))) << ",\n";
    out << "    \"passes\": " << json_passes(r.norm_gate->results, c.copy_gbs.all) << "\n  }";
  }
  if (r.serving) {
    const ServeBenchOptions& o = r.serving->options;
    out << ",\n  \"serving\": {\n";
    out << format("    \"decodes\": %lld, \"prefills\": %lld, \"longest\": %lld, \"draft\": %lld, \"repeats\": %d,\n",
                  (long long)o.decodes, (long long)o.prefills, (long long)o.longest, (long long)o.draft,
                  r.serving_repeats);
    out << "    \"calls\": [";
    const std::vector<ServeResult>& calls = r.serving->results;
    for (size_t i = 0; i < calls.size(); ++i) {
      const ServeResult& k = calls[i];
      out << (i ? "," : "") << "\n      {\"variant\": " << json_string(k.variant) << ", \"call\": " << json_string(k.part)
          << format(", \"sequences\": %lld, \"tokens\": %lld,\n       ", (long long)k.sequences, (long long)k.tokens)
          << "\"timing\": " << json_timing(k.timing) << ", \"tokens_per_s\": " << json_number(k.tokens_per_second())
          << ",\n       \"percent_of_copy\": " << json_number(100 * k.timing.gbs() / c.copy_gbs.all)
          << ", \"percent_of_update\": " << json_number(100 * k.timing.gbs() / c.update_gbs.all)
          << ", \"percent_of_fp32_fma_peak\": " << json_number(100 * k.timing.gflops() / c.fp32_gflops.all)
          << ", \"against_parts_alone\": " << json_number(mixed_against_parts(calls, k)) << "}";
    }
    out << "\n    ]\n  }";
  }
  out << "\n}\n";
}

namespace {

// A logarithmic axis from `lo` to `hi` (whole decades) drawn from pixel `from` to pixel `to`.
struct LogAxis {
  double lo, hi, from, to;

  // The decades around [min, max], at least one.
  static LogAxis around(double min, double max, double from, double to) {
    const double lo = std::pow(10.0, std::floor(std::log10(min)));
    const double hi = std::max(lo * 10, std::pow(10.0, std::ceil(std::log10(max))));
    return {lo, hi, from, to};
  }
  double at(double v) const {
    return from + (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) * (to - from);
  }
  double per_decade() const { return (to - from) / (std::log10(hi) - std::log10(lo)); }
};

struct Point {
  double intensity, gflops;
  std::string label;
  int kind;  // index into kKinds
};

struct Kind {
  const char* name;
  const char* color;
};
constexpr Kind kKinds[] = {{"fused", "#1f77b4"}, {"unfused chunked", "#ff7f0e"}, {"recurrent fp32", "#d62728"}};

// A marker per kind: circle, square, triangle.
std::string marker(int kind, double x, double y, const std::string& title) {
  const char* color = kKinds[kind].color;
  const std::string tip = "<title>" + title + "</title>";
  switch (kind) {
    case 0: return format("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\">", x, y, color) + tip + "</circle>";
    case 1:
      return format("<rect x=\"%.1f\" y=\"%.1f\" width=\"9\" height=\"9\" fill=\"%s\">", x - 4.5, y - 4.5,
                    color) +
             tip + "</rect>";
    default:
      return format("<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"%s\">", x, y - 6, x - 5.5, y + 4,
                    x + 5.5, y + 4, color) +
             tip + "</polygon>";
  }
}

std::vector<Point> roofline_points(const BenchReport& r) {
  std::vector<Point> points;
  for (const KernelResult& k : r.kernels) {
    if (k.pass == "fwd+bwd") continue;  // the two passes are plotted on their own
    const std::string label = k.variant + (k.pass == "forward" ? " fwd" : k.pass == "backward" ? " bwd" : " dec");
    const std::optional<Timing> timings[] = {k.fused, k.unfused, k.recurrent};
    for (int kind = 0; kind < 3; ++kind) {
      const auto& t = timings[kind];
      if (t && std::isfinite(t->gflops()) && t->gflops() > 0 && std::isfinite(t->intensity()) && t->intensity() > 0)
        points.push_back({t->intensity(), t->gflops(), label, kind});
    }
  }
  return points;
}

}  // namespace

void write_roofline_svg(const BenchReport& r, std::ostream& out) {
  const Ceilings& c = r.ceilings;
  constexpr double kWidth = 960, kHeight = 640, kLeft = 80, kRight = 930, kTop = 60, kBottom = 580;
  const double bandwidth = c.copy_gbs.all;  // GB/s: GFLOP/s per FLOP/byte
  struct Roof {
    std::string name;
    double gflops;
  };
  std::vector<Roof> roofs = {{"fp32 FMA peak", c.fp32_gflops.all}};
  if (c.bf16_gflops) roofs.push_back({"bf16 dot peak", c.bf16_gflops->all});
  if (c.tile_bf16_gflops) roofs.push_back({"bf16 tile peak", c.tile_bf16_gflops->all});
  const std::vector<Point> points = roofline_points(r);

  // The ranges hold every point, the ridges with some of the bandwidth slope below them, and
  // margins so that no point or label sits on the frame.
  const double inf = std::numeric_limits<double>::infinity();
  double x_min = inf, x_max = 0, y_min = inf, y_max = 0;
  for (const Roof& roof : roofs) {
    x_min = std::min(x_min, roof.gflops / bandwidth / 4);
    x_max = std::max(x_max, roof.gflops / bandwidth * 4);
    y_min = std::min(y_min, roof.gflops / 4);
    y_max = std::max(y_max, roof.gflops);
  }
  for (const Point& p : points) {
    x_min = std::min(x_min, p.intensity);
    x_max = std::max(x_max, p.intensity);
    y_min = std::min(y_min, p.gflops);
    y_max = std::max(y_max, p.gflops);
  }
  const LogAxis x = LogAxis::around(x_min / 2, x_max * 2, kLeft, kRight);
  const LogAxis y = LogAxis::around(y_min / 2, y_max * 1.5, kBottom, kTop);

  out << format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                "font-family=\"sans-serif\">\n",
                kWidth, kHeight, kWidth, kHeight);
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out << format("<text x=\"%.0f\" y=\"30\" font-size=\"16\" text-anchor=\"middle\">flat bench roofline: %s, "
                "%s</text>\n",
                kWidth / 2, shape_line(r).c_str(), r.isa.c_str());
  out << format("<clipPath id=\"plot\"><rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\"/></clipPath>\n",
                kLeft, kTop, kRight - kLeft, kBottom - kTop);

  // Decade grid with tick labels, and fainter lines at 2 to 9 times each decade.
  out << "<g stroke=\"#eee\">\n";
  for (double decade = x.lo; decade < x.hi; decade *= 10)
    for (int m = 2; m <= 9; ++m)
      out << format("<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\"/>\n", x.at(m * decade), kTop,
                    x.at(m * decade), kBottom);
  for (double decade = y.lo; decade < y.hi; decade *= 10)
    for (int m = 2; m <= 9; ++m)
      out << format("<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\"/>\n", kLeft, y.at(m * decade), kRight,
                    y.at(m * decade));
  out << "</g>\n<g stroke=\"#ccc\" font-size=\"12\">\n";
  for (double v = x.lo; v <= x.hi * 1.001; v *= 10) {
    out << format("<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\"/>", x.at(v), kTop, x.at(v), kBottom);
    out << format("<text x=\"%.1f\" y=\"%.0f\" stroke=\"none\" text-anchor=\"middle\">%g</text>\n", x.at(v),
                  kBottom + 18, v);
  }
  for (double v = y.lo; v <= y.hi * 1.001; v *= 10) {
    out << format("<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\"/>", kLeft, y.at(v), kRight, y.at(v));
    out << format("<text x=\"%.0f\" y=\"%.1f\" stroke=\"none\" text-anchor=\"end\">%g</text>\n", kLeft - 6,
                  y.at(v) + 4, v);
  }
  out << "</g>\n";
  out << format("<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"black\"/>\n", kLeft,
                kTop, kRight - kLeft, kBottom - kTop);
  out << format("<text x=\"%.0f\" y=\"%.0f\" font-size=\"13\" text-anchor=\"middle\">arithmetic intensity "
                "(FLOP/byte)</text>\n",
                (kLeft + kRight) / 2, kBottom + 42);
  out << format("<text x=\"20\" y=\"%.0f\" font-size=\"13\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
                "%.0f)\">GFLOP/s</text>\n",
                (kTop + kBottom) / 2, (kTop + kBottom) / 2);

  // Roofs: the copy bandwidth up to each compute peak, then the peak.
  out << "<g clip-path=\"url(#plot)\" fill=\"none\" stroke=\"#444\" stroke-width=\"2\">\n";
  for (const Roof& roof : roofs) {
    const double ridge = roof.gflops / bandwidth;
    out << format("<polyline points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\"/>\n", x.at(x.lo), y.at(bandwidth * x.lo),
                  x.at(ridge), y.at(roof.gflops), x.at(x.hi), y.at(roof.gflops));
  }
  out << "</g>\n<g font-size=\"12\" fill=\"#444\">\n";
  for (const Roof& roof : roofs)
    out << format("<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s, %.0f GFLOP/s</text>\n", kRight - 6,
                  y.at(roof.gflops) - 6, roof.name.c_str(), roof.gflops);
  // The bandwidth label along the slope, a decade right of where it enters the plot.
  const double label_x = std::max(x.lo, y.lo / bandwidth) * 10;
  const double angle = -std::atan2(-y.per_decade(), x.per_decade()) * 180 / std::numbers::pi;
  out << format("<text x=\"%.1f\" y=\"%.1f\" transform=\"rotate(%.1f %.1f %.1f)\">copy %.1f GB/s</text>\n",
                x.at(label_x), y.at(bandwidth * label_x) - 6, angle, x.at(label_x), y.at(bandwidth * label_x) - 6,
                bandwidth);
  out << "</g>\n";

  // One labelled point per kernel pass and implementation, the label in its marker's colour. Each
  // label takes the first of the places around its point that covers the fewest markers and
  // labels placed before it.
  struct Box {
    double x0, y0, x1, y1;
    bool overlaps(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
  };
  std::vector<Box> taken;
  for (const Point& p : points) {
    const double px = x.at(p.intensity), py = y.at(p.gflops);
    taken.push_back({px - 6, py - 6, px + 6, py + 6});
  }
  constexpr double kCharWidth = 5.5, kLineHeight = 11;  // at font-size 10
  const struct {
    double dx, dy;
    bool left;
  } places[] = {{7, -4, false},  {7, 9, false},  {-7, -4, true},  {-7, 9, true},  {7, -14, false},
                {7, 19, false}, {-7, -14, true}, {-7, 19, true}, {7, -24, false}, {7, 29, false}};
  out << "<g font-size=\"10\">\n";
  for (const Point& p : points) {
    const double px = x.at(p.intensity), py = y.at(p.gflops);
    const double width = kCharWidth * double(p.label.size());
    auto box = [&](const auto& place) {
      const double x0 = place.left ? px + place.dx - width : px + place.dx;
      return Box{x0, py + place.dy - kLineHeight + 2, x0 + width, py + place.dy + 2};
    };
    const auto* place = &places[0];
    auto covered = [&](const auto& candidate) {
      return std::count_if(taken.begin(), taken.end(), [&](const Box& b) { return b.overlaps(box(candidate)); });
    };
    for (const auto& candidate : places)
      if (covered(candidate) < covered(*place)) place = &candidate;
    taken.push_back(box(*place));
    out << marker(p.kind, px, py,
                  format("%s %s: %.1f GFLOP/s at %.2f FLOP/byte", p.label.c_str(), kKinds[p.kind].name, p.gflops,
                         p.intensity))
        << format("<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\"%s>%s</text>\n", px + place->dx, py + place->dy,
                  kKinds[p.kind].color, place->left ? " text-anchor=\"end\"" : "", p.label.c_str());
  }
  out << "</g>\n";

  // Legend.
  out << "<g font-size=\"12\">\n";
  for (int kind = 0; kind < 3; ++kind) {
    const double ly = kTop + 20 + 18 * kind;
    out << marker(kind, kLeft + 18, ly, kKinds[kind].name)
        << format("<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", kLeft + 30, ly + 4, kKinds[kind].name);
  }
  out << "</g>\n</svg>\n";
}

}  // namespace flat::tool

// The results of `flat bench` and the three ways it shows them, all from the same numbers: the
// markdown tables on the terminal, the JSON file and the roofline plot (SVG).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "bench_conv.h"
#include "bench_norm.h"
#include "bench_serve.h"
#include "ceilings.h"
#include "timing.h"

namespace flat::tool {

// The units a target's chunk products run on, each measured among the ceilings.
enum class ProductUnit { fp32_fma, bf16_dot, bf16_tiles };
const char* unit_name(ProductUnit unit);

struct KernelResult {
  std::string variant;
  std::string pass;                          // "forward", "backward", "fwd+bwd" or "decode"
  Timing fused;                              // on the bench's threads
  std::optional<Timing> fused_1thread;       // absent when the bench runs on 1 thread
  std::optional<Timing> unfused, recurrent;  // absent when a baseline could not run
  // The fused kernels on the bench's own target through the driver's entry (cpu::forward_on: no
  // argument or value checks, which `fused` includes): for the forward and the backward, and for
  // decode with BenchReport::against. With it, `against`: the same on that target, so that their
  // ratio compares the targets' kernels alone.
  std::optional<Timing> against, compared;
  // The same pass on the bench's target with its chunk products replaced by a kernel that only
  // zeroes their outputs (tools/vector_work.h; through the driver's entry, results wrong): the
  // vector work beside the products. Absent for decode and where the build has no such stages.
  std::optional<Timing> vector_work;
  // The same pass as `compared` with every row of its token-row tensors at one place (token stride
  // 0, tools/bench.cpp's rows_in_cache: results wrong): all its work, none of its rows' memory
  // traffic. `compared` less this is the time of the memory traffic that the work does not hide.
  // Absent for decode.
  std::optional<Timing> rows_in_cache;
};

// One pass of a variant with the weak gates of the tables above and with gates as the models
// draw them (tools/bench_workload.h), both with subnormals flushed as the library runs, and the
// model's gates again with them kept (ExecutionContext::flush_subnormals = false).
struct GateResult {
  std::string variant;
  std::string pass;  // "forward" or "backward"
  Timing weak, model, model_subnormals_kept;
  // The model's gates' pass with its products zeroed (KernelResult::vector_work), subnormals
  // flushed; absent where the build has no such stages.
  std::optional<Timing> model_vector_work;
};

struct BenchReport {
  int64_t B = 0, S = 0, N = 0, K = 0, V = 0;
  std::string dtype;
  std::string precision;  // of the chunk products (Options::precision)
  int chunk = 0, threads = 1, repeats = 0, baseline_repeats = 0, decode_repeats = 0, serving_repeats = 0;
  std::string isa;       // the target the fused kernels run on (src/cpu/targets.h)
  std::string products;  // what its chunk products run on, in words
  // The unit whose all-thread peak bounds the time of the chunk products (the roofline's compute
  // roof): the fastest the target's products run on (product_unit, tools/bench.cpp).
  ProductUnit product_unit = ProductUnit::fp32_fma;
  // A second target the fused kernels ran on in the same run, for the speedup (flat bench
  // --against); empty when none.
  std::string against;
  Ceilings ceilings;
  std::vector<KernelResult> kernels;
  std::vector<GateResult> gates;  // the variants whose gates come from the input
  // The short convolution at its own shape, when it was measured.
  struct Conv {
    ConvBenchOptions options;
    std::vector<PassResult> results;
  };
  std::optional<Conv> conv;
  // The output norm and gate at its own shape, when it was measured.
  struct NormGate {
    NormGateBenchOptions options;
    std::vector<PassResult> results;
  };
  std::optional<NormGate> norm_gate;
  // The serving calls of every variant (tools/bench_serve.h), when they were measured.
  struct Serving {
    ServeBenchOptions options;
    std::vector<ServeResult> results;
  };
  std::optional<Serving> serving;
};

// Where a timing stands under the all-thread ceilings, its roofline: the time of its bytes at the
// copy bandwidth (memory) and of its FLOPs at the peak of the unit its products run on
// (BenchReport::product_unit); the larger bounds it (compute bound when the products' time is).
struct Standing {
  double memory_seconds = 0, product_seconds = 0;
  double roofline_seconds() const { return std::max(memory_seconds, product_seconds); }
  bool compute_bound() const { return product_seconds >= memory_seconds; }
  double percent_of_roofline = 0;      // the roofline's time over the timing's
  double percent_of_product_peak = 0;  // GFLOP/s over the product unit's peak
  std::optional<double> percent_of_bf16_peak;  // absent without a bf16 dot-product unit
  std::optional<double> percent_of_tile_peak;  // absent where the amx target does not run
};

Standing standing(const BenchReport& report, const Timing& timing);

void write_markdown(const BenchReport& report, std::ostream& out);
void write_json(const BenchReport& report, std::ostream& out);
// Log-log roofline: achieved GFLOP/s against FLOP per byte under the measured all-thread
// ceilings, one point per forward and backward of every kernel and baseline.
void write_roofline_svg(const BenchReport& report, std::ostream& out);

}  // namespace flat::tool

// flat: command-line tool.
//   flat run VARIANT --in DIR --out DIR [options]     run the kernels on .npy files
//   flat run conv --in DIR --out DIR [options]        the short convolution on .npy files
//   flat run norm_gate --in DIR --out DIR [options]   the output norm and gate on .npy files
//   flat bench [options]                              time kernels and baselines
#include <iostream>
#include <string>
#include <vector>

#include "bench.h"
#include "run.h"
#include "variants.h"

namespace {

std::string usage() {
  std::string variants;
  for (const flat::VariantInfo& v : flat::all_variants()) variants += (variants.empty() ? "" : ", ") + std::string(v.name);
  return "usage: flat run VARIANT --in DIR --out DIR [--dtype f32|bf16] [--chunk N] [--scale X]\n"
         "                [--l2norm] [--threads N] [--solve auto|subst|blocked|doubling] [--gate-group G]\n"
         "                [--precision exact|fast]\n"
         "       flat run conv --in DIR --out DIR [--dtype f32|bf16] [--activation silu|none] [--threads N]\n"
         "       flat run norm_gate --in DIR --out DIR [--dtype f32|bf16] [--activation silu|sigmoid|none]\n"
         "                [--gate-first] [--eps X] [--threads N]\n"
         "       flat bench [--shape B,S,N,K,V] [--variant NAME|conv|norm_gate] [--conv-shape B,S,C,W]\n"
         "                  [--norm-shape B,S,N,D] [--serving-shape DECODES,PREFILLS,LONGEST,DRAFT]\n"
         "                  [--threads N] [--dtype f32|bf16] [--chunk N] [--repeats N]\n"
         "                  [--solve auto|subst|blocked|doubling] [--precision exact|fast]\n"
         "                  [--against TARGET] [--json FILE] [--plot FILE.svg]\n"
         "VARIANT: " + variants + "\n"
         "run VARIANT and run conv also read optional sequence files from --in (int64 or int32):\n"
         "  cu_seqlens.npy             sequences packed along S of one batch row: states a row each\n"
         "  initial_state_indices.npy  h0.npy (state0.npy) is a pool, read at these rows (-1: zero)\n"
         "  final_state_indices.npy    ht.npy (state.npy) is that pool after the run, with each\n"
         "  token_state_indices.npy    sequence's final state, each token's state at these rows\n"
         "--threads N: 0 (the default) for every hardware thread; a call runs on at most one thread per\n"
         "             work item and 4 per hardware thread, whatever N asks\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << usage();
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "run") return flat::tool::run_command(args, std::cout, std::cerr);
  if (command == "bench") return flat::tool::bench_command(args, std::cout, std::cerr);
  std::cerr << "flat: unknown command '" << command << "'\n" << usage();
  return 2;
}

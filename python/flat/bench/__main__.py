"""python -m flat.bench [--shape B,T,H,K,V] [--dtype bf16|f32] [--repeats N] [--no-compile] [--json FILE]
python -m flat.bench --layer [--layer-shape B,T,D,H] [--dtype bf16|f32] [--repeats N] [--no-compile] [--json FILE]
python -m flat.bench --transformers [--quick] [--dtype bf16|f32] [--models M,..] [--rows KIND,..] [--repeats N]
                     [--json FILE]   (flat/bench/models.py)
python -m flat.bench --context-parallel [--cp-shape B,T,H,K,V] [--variants V,..] [--dtype bf16|f32] [--repeats N]
                     [--json FILE]   (flat/bench/context_parallel.py)
python -m flat.bench --tpu [--tpu-shape B,S,N,K,V] [--variants V,..] [--chunk C] [--precision exact|fast]
                     [--tpu-backend tpu|interpret] [--dtype bf16|f32] [--repeats N] [--json FILE]
                     (flat/bench/tpu.py: the seed paper's table rows for flat.jax's Pallas TPU kernels, on a
                     TPU; no timing of ours comes from one)

Times, side by side in one process on the same inputs (gla, bf16, PyTorch's threads):

1. the overhead of the Python binding: the custom ops flat::forward and flat::backward against the
   library's entry points called alone through flat._core, with outputs allocated once and freshly
   for every call;
2. flat.torch.gla against the same variant written in plain PyTorch, chunked as users write it
   (FLA's naive chunk form: decays as exp of cumulative log-gates, one chunk's state at a time),
   eagerly and under torch.compile, forward and forward+backward; the ratio is their time over
   flat's.

With --layer, one whole layer instead (flat.nn.GatedLinearAttention configured as the seed paper's:
4-tap convolution on q, k, v, per-head RMSNorm times a SiLU output gate; heads of K = V = D / H), its
forward+backward as flat runs it against the same module on plain-PyTorch operations (the chunked
GLA above, F.conv1d, the norm's formula), eager and under torch.compile, and where flat's time goes:
the projections, the convolution, the recurrence, the norm and gate, the rest.

3. Gated DeltaNet and KDA (flat.torch.gated_deltanet and kda, with the in-kernel L2 norm of q and k
   as the models run them) on weak gates (uniform in [-0.1, 0]) against gates as the models draw
   them: g = -exp(A_log) * softplus(a + dt_bias), per head (Gated DeltaNet) or per channel (Kimi
   Linear's KDA), at the models' initialisation. Strong gates make a chunk's decays underflow
   through the subnormal range, which costs a microcode assist per operation on Intel cores; the
   library flushes subnormals for the span of its work. --keep-subnormals (FLAT_SUBNORMALS=keep)
   keeps them, to show that cost.

Medians of --repeats runs after a warm-up.
"""

import argparse
import json
import os

from . import tpu

# Every mode but --tpu runs on PyTorch; a TPU machine may have JAX alone, and --tpu needs only it.
try:
    import torch

    from . import context_parallel, kernels, models
    _NO_TORCH = None
except ImportError as missing:
    _NO_TORCH = str(missing)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flat.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="2,4096,16,128,128", help="B,T,H,K,V")
    parser.add_argument("--layer", action="store_true", help="time a whole layer instead (see above)")
    parser.add_argument("--layer-shape", default="1,4096,2048,16",
                        help="B,T,hidden,heads of --layer (the seed paper's layer at batch 1)")
    parser.add_argument("--transformers", action="store_true",
                        help="transformers' Qwen3.5 and Mamba-2 models, their PyTorch path against flat's kernels")
    parser.add_argument("--quick", action="store_true", help="tiny models and lengths for --transformers")
    parser.add_argument("--context-parallel", action="store_true",
                        help="flat.torch.context_parallel on 1 and 2 processes (flat/bench/context_parallel.py)")
    parser.add_argument("--cp-shape", default="1,16384,4,128,128", help="B,T,H,K,V of --context-parallel")
    parser.add_argument("--variants", help="with --context-parallel: some of gla,gated_deltanet (default both); "
                        "with --tpu: some of la,mamba2,gla (default all)")
    parser.add_argument("--tpu", action="store_true",
                        help="flat.jax's Pallas TPU kernels at the seed paper's shape (flat/bench/tpu.py)")
    parser.add_argument("--tpu-shape", default="8,4096,16,128,128", help="B,S,N,K,V of --tpu (the paper's)")
    parser.add_argument("--chunk", type=int, default=64, help="with --tpu: chunk_size (rows per grid step)")
    parser.add_argument("--precision", choices=["exact", "fast"], default="exact", help="with --tpu: precision=")
    parser.add_argument("--tpu-backend", choices=["tpu", "interpret"], default="tpu",
                        help="with --tpu: interpret runs the kernels in TPU interpret mode (a smoke run, no timing)")
    parser.add_argument("--dtype", choices=["bf16", "f32"],
                        help="bf16 unless given; with --transformers both unless given")
    parser.add_argument("--models", help="with --transformers: some of qwen3_5,mamba2 (default both)")
    parser.add_argument("--rows", help="with --transformers: some of prefill,decode,train,share (default all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--json", help="write the numbers to this file")
    parser.add_argument("--keep-subnormals", action="store_true",
                        help="run the kernels in the CPU's default mode, subnormals kept (FLAT_SUBNORMALS=keep)")
    args = parser.parse_args(argv)
    if _NO_TORCH is not None and not args.tpu:
        parser.error(f"every mode but --tpu needs PyTorch: {_NO_TORCH}")
    if args.keep_subnormals:
        # Read by the library once, at its first call, which comes after this.
        os.environ["FLAT_SUBNORMALS"] = "keep"
    if args.transformers:
        results = models.transformers_bench(args)
        if args.json:
            models.write_json(results, args.json)
        return
    args.dtype = args.dtype or "bf16"
    if args.tpu:
        rows = tpu.tpu_bench(args)
        if args.json:
            tpu.write_json(args, rows, args.json)
        return
    if args.context_parallel:
        rows = context_parallel.context_parallel_bench(args)
        if args.json:
            context_parallel.write_json(args, rows, args.json)
        return
    if args.layer:
        results = kernels.layer_bench(args, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        return
    kernels.recurrence_bench(args)


if __name__ == "__main__":
    main()

"""python -m flat.bench [--shape B,T,H,K,V] [--dtype bf16|f32] [--repeats N] [--no-compile] [--json FILE]
python -m flat.bench --layer [--layer-shape B,T,D,H] [--dtype bf16|f32] [--repeats N] [--no-compile] [--json FILE]
python -m flat.bench --transformers [--quick] [--dtype bf16|f32] [--models M,..] [--rows KIND,..] [--repeats N]
                     [--json FILE]   (flat/bench_transformers.py)
python -m flat.bench --context-parallel [--cp-shape B,T,H,K,V] [--variants V,..] [--dtype bf16|f32] [--repeats N]
                     [--json FILE]   (flat/bench_context_parallel.py)

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
import math
import os
import statistics
import time

import torch

import flat
import flat.torch as ft
from flat import _core
from flat.nn import GatedLinearAttention
from flat.nn.ops import Ops, reference_conv, reference_norm


def median_ms(function, repeats):
    # Warm-up: three calls at least and 0.2 s (the first calls compile, allocate and fault pages in).
    start = time.perf_counter()
    for calls in range(1, 1000):
        function()
        if calls >= 3 and time.perf_counter() - start > 0.2:
            break
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def chunk_gla_torch(q, k, v, g, scale, chunk=64):
    """GLA in plain PyTorch, chunked: [B, T, H, K] inputs, g log-decays. Intra-chunk scores from
    q exp(G) and k exp(-G) (G the chunk's cumulative log-gate), states carried chunk to chunk; matmuls
    in the inputs' dtype, decays in fp32."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    n = T // chunk
    split = lambda x: x.transpose(1, 2).reshape(B, H, n, chunk, x.shape[-1])  # noqa: E731
    q, k, v, g = split(q), split(k), split(v), split(g.float())
    G = g.cumsum(-2)
    mask = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    state = torch.zeros(B, H, K, V, dtype=torch.float32)
    outputs = []
    for i in range(n):
        Gi = G[:, :, i]
        qg = (q[:, :, i].float() * Gi.exp()).to(q.dtype)
        kg = (k[:, :, i].float() * (-Gi).exp()).to(k.dtype)
        scores = (qg @ kg.transpose(-1, -2)).float().masked_fill(~mask, 0) * scale
        o = scores.to(v.dtype) @ v[:, :, i] + ((qg.float() @ state) * scale).to(v.dtype)
        outputs.append(o)
        decay = (Gi[:, :, -1:] - Gi).exp()
        state = state * Gi[:, :, -1].exp()[..., None] + ((k[:, :, i].float() * decay).transpose(-1, -2)
                                                          @ v[:, :, i].float())
    return torch.stack(outputs, 2).reshape(B, H, T, V).transpose(1, 2)


def model_gates(B, T, H, K, per_channel):
    """g [B, T, H] (Gated DeltaNet) or [B, T, H, K] (Kimi Linear's KDA) as the models compute it at
    initialisation: -exp(A_log) * softplus(a + dt_bias), A = exp(A_log) ~ U(1, 16) per head,
    dt_bias = softplus^-1(dt) with dt log-uniform in [0.001, 0.1] per head or channel, a ~ N(0, 1)
    per token (the projection of a normalised hidden state)."""
    columns = (H, K) if per_channel else (H,)
    A = torch.empty(H).uniform_(1, 16).reshape((H, 1) if per_channel else (H,))
    dt = torch.exp(torch.empty(columns).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    return -A * torch.nn.functional.softplus(torch.randn(B, T, *columns) + dt_bias)


def gates_bench(args, q, k, v):
    """Section 3: gated_deltanet and kda on weak gates and on the models' gates."""
    B, T, H, K = q.shape
    beta = torch.rand(B, T, H, dtype=q.dtype)
    results = []
    print("\n| variant | gates | forward ms | forward+backward ms | against weak gates |")
    print("|---|---|---:|---:|---:|")
    for variant, per_channel in (("gated_deltanet", False), ("kda", True)):
        function = getattr(ft, variant)
        shape = (B, T, H, K) if per_channel else (B, T, H)
        base = None
        for gates, g in (("weak", -0.1 * torch.rand(shape)), ("model", model_gates(B, T, H, K, per_channel))):
            inputs = [t.clone().requires_grad_() for t in (q, k, v, g, beta)]

            def run(inputs=inputs, function=function):
                function(*inputs, use_qk_l2norm_in_kernel=True)[0].float().sum().backward()

            with torch.no_grad():
                forward_ms = median_ms(lambda: function(*inputs, use_qk_l2norm_in_kernel=True),  # noqa: B023
                                       args.repeats)
            both_ms = median_ms(run, args.repeats)
            base = base or (forward_ms, both_ms)
            print(f"| {variant} | {gates} | {forward_ms:.1f} | {both_ms:.1f} | "
                  f"x{forward_ms / base[0]:.2f}, x{both_ms / base[1]:.2f} |")
            results.append(dict(variant=variant, gates=gates, forward_ms=forward_ms, forward_backward_ms=both_ms))
    print("\n(against weak gates: forward, forward+backward; subnormals "
          f"{'kept (--keep-subnormals)' if args.keep_subnormals else 'flushed, as the library runs'})")
    return results


# The layer in plain PyTorch: the same module on these operations.
PLAIN = Ops(recurrence=lambda variant, q, k, v, g=None, scale=None, **_: (
    chunk_gla_torch(q, k, v, g, q.shape[-1] ** -0.5 if scale is None else scale), None),
    conv=reference_conv, norm=reference_norm)

# Where a layer's time goes: the profiler's operations by part (self time; the rest is "other").
PARTS = {
    "projections": ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul"),
    "convolution": ("flat::conv_forward", "flat::conv_backward"),
    "recurrence": ("flat::forward", "flat::backward"),
    "norm and gate": ("flat::norm_gate_forward", "flat::norm_gate_backward"),
}


def layer_bench(args, dtype):
    B, T, D, H = (int(x) for x in args.layer_shape.split(","))
    torch.manual_seed(0)
    layer = GatedLinearAttention(hidden_size=D, num_heads=H, expand_k=1.0, expand_v=1.0, use_short_conv=True)
    layer = layer.to(dtype)
    plain = GatedLinearAttention(hidden_size=D, num_heads=H, expand_k=1.0, expand_v=1.0, use_short_conv=True)
    plain.load_state_dict(layer.state_dict())
    plain = plain.to(dtype)
    plain.ops = PLAIN
    x = torch.randn(B, T, D, dtype=dtype, requires_grad=True)
    threads = torch.get_num_threads()
    print(f"flat.bench --layer: GatedLinearAttention B={B} T={T} hidden={D} heads={H} (K = V = {D // H}), "
          f"convolution on {3 * D} channels, {args.dtype}, {threads} threads (PyTorch's), target {flat.target()}, "
          f"torch {torch.__version__}")

    def step(module):
        def run():
            module.zero_grad(set_to_none=True)
            x.grad = None
            module(x)[0].float().sum().backward()
        return run

    contenders = [("flat.nn layer", step(layer)), ("plain PyTorch, eager", step(plain))]
    if not args.no_compile:
        contenders.append(("plain PyTorch, torch.compile", step(torch.compile(plain))))
    print("\n| layer | forward+backward ms | ratio |")
    print("|---|---:|---:|")
    results = {"shape": dict(B=B, T=T, hidden=D, heads=H), "dtype": args.dtype, "threads": threads,
               "target": flat.target(), "implementations": []}
    base = None
    for name, run in contenders:
        ms = median_ms(run, args.repeats)
        base = base or ms
        print(f"| {name} | {ms:.1f} | x{ms / base:.2f} |")
        results["implementations"].append(dict(name=name, forward_backward_ms=ms))
    print("\n(ratio: the time over flat's layer)")

    # Where flat's time goes, from the profiler's operations over --repeats steps.
    run = step(layer)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(args.repeats):
            run()
    totals = {part: 0.0 for part in list(PARTS) + ["other"]}
    for event in profile.key_averages():
        part = next((p for p, names in PARTS.items() if event.key in names), "other")
        totals[part] += event.self_cpu_time_total
    whole = sum(totals.values())
    print("\n| part of flat's layer | ms per step | share |")
    print("|---|---:|---:|")
    for part, us in totals.items():
        print(f"| {part} | {us / 1e3 / args.repeats:.1f} | {100 * us / whole:.0f}% |")
    results["breakdown_ms"] = {part: us / 1e3 / args.repeats for part, us in totals.items()}
    return results


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
                        help="flat.torch.context_parallel on 1 and 2 processes (flat/bench_context_parallel.py)")
    parser.add_argument("--cp-shape", default="1,16384,4,128,128", help="B,T,H,K,V of --context-parallel")
    parser.add_argument("--variants", help="with --context-parallel: some of gla,gated_deltanet (default both)")
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
    if args.keep_subnormals:
        # Read by the library once, at its first call, which comes after this.
        os.environ["FLAT_SUBNORMALS"] = "keep"
    if args.transformers:
        from flat.bench_transformers import transformers_bench, write_json
        results = transformers_bench(args)
        if args.json:
            write_json(results, args.json)
        return
    args.dtype = args.dtype or "bf16"
    if args.context_parallel:
        from flat.bench_context_parallel import context_parallel_bench, write_json
        rows = context_parallel_bench(args)
        if args.json:
            write_json(args, rows, args.json)
        return
    if args.layer:
        results = layer_bench(args, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        return
    B, T, H, K, V = (int(x) for x in args.shape.split(","))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    q, k = (torch.randn(B, T, H, K, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, dtype=dtype)
    g = -0.1 * torch.rand(B, T, H, K)
    scale = K ** -0.5
    threads = torch.get_num_threads()
    print(f"flat.bench: gla B={B} T={T} H={H} K={K} V={V} {args.dtype}, {threads} threads (PyTorch's), "
          f"target {flat.target()}, torch {torch.__version__}")

    # 1. The binding's overhead: the custom ops against the library's entry points on the same
    # inputs, with outputs allocated once (as flat bench runs them) and freshly for every call (as
    # an operation returning new tensors must: the kernel then also pays the first touch of their
    # pages).
    view = ft._view
    dy = torch.randn(B, T, H, V, dtype=dtype)
    keep = {}

    def library_forward(fresh):
        y = torch.empty(B, T, H, V, dtype=dtype) if fresh else keep.setdefault("y", torch.empty(B, T, H, V, dtype=dtype))
        _core.call("forward", "gla", dict(q=view("q", q), k=view("k", k), v=view("v", v), g=view("g", g),
                                          y=view("y", y)), ([], [], [], []), dict(chunk=64), threads, "openmp")

    def library_backward(fresh):
        grads = [torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v, g)] if fresh else keep.setdefault(
            "grads", [torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v, g)])
        dq, dk, dv, dg = (view(n, t) for n, t in zip(("dq", "dk", "dv", "dg"), grads))
        _core.call("backward", "gla", dict(q=view("q", q), k=view("k", k), v=view("v", v), g=view("g", g),
                                           dy=view("dy", dy), dq=dq, dk=dk, dv=dv, dg=dg), ([], [], [], []),
                   dict(chunk=64, check_values=False), threads, "openmp")

    op_forward = lambda: torch.ops.flat.forward("gla", q, k, v, g, None, None, None, None, None, None,  # noqa: E731
                                                None, 64, False, "auto", "exact", 0, True, False)
    op_backward = lambda: torch.ops.flat.backward("gla", q, k, v, g, None, None, None, None, None, None, dy,  # noqa: E731
                                                  None, None, 64, False, "auto", "exact", 0)
    results = {"shape": dict(B=B, T=T, H=H, K=K, V=V), "dtype": args.dtype, "threads": threads,
               "target": flat.target()}
    print("\n| pass | library, outputs reused ms | library, fresh outputs ms | custom op ms | op / fresh | op / reused |")
    print("|---|---:|---:|---:|---:|---:|")
    results["overhead"] = []
    for name, library, op in (("forward", library_forward, op_forward), ("backward", library_backward, op_backward)):
        # Alternated twice, the best of each kept, so that neither gets the quieter moments alone.
        rows = [(median_ms(lambda: library(False), args.repeats), median_ms(lambda: library(True), args.repeats),  # noqa: B023
                 median_ms(op, args.repeats)) for _ in range(2)]
        reused, fresh, through_op = (min(r[i] for r in rows) for i in range(3))
        print(f"| {name} | {reused:.2f} | {fresh:.2f} | {through_op:.2f} | x{through_op / fresh:.3f} | "
              f"x{through_op / reused:.3f} |")
        results["overhead"].append(dict(name=name, library_reused_ms=reused, library_fresh_ms=fresh,
                                        custom_op_ms=through_op))

    # 2. Against plain PyTorch.
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g)]

    def forward_backward(function):
        def run():
            o = function(*leaves)
            o.float().sum().backward()
        return run

    flat_fn = lambda q, k, v, g: ft.gla(q, k, v, g)[0]  # noqa: E731
    plain = lambda q, k, v, g: chunk_gla_torch(q, k, v, g, scale)  # noqa: E731
    contenders = [("flat.torch.gla", flat_fn), ("plain PyTorch, eager", plain)]
    if not args.no_compile:
        contenders.append(("plain PyTorch, torch.compile", torch.compile(plain)))
    print("\n| implementation | forward ms | forward+backward ms | forward ratio | fwd+bwd ratio |")
    print("|---|---:|---:|---:|---:|")
    base = None
    results["implementations"] = []
    for name, function in contenders:
        with torch.no_grad():
            forward_ms = median_ms(lambda: function(q, k, v, g), args.repeats)  # noqa: B023
        both_ms = median_ms(forward_backward(function), args.repeats)
        base = base or (forward_ms, both_ms)
        print(f"| {name} | {forward_ms:.1f} | {both_ms:.1f} | x{forward_ms / base[0]:.2f} | x{both_ms / base[1]:.2f} |")
        results["implementations"].append(dict(name=name, forward_ms=forward_ms, forward_backward_ms=both_ms))
    print("\n(ratio: the time over flat.torch.gla's)")
    results["gates"] = gates_bench(args, q, k, v)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

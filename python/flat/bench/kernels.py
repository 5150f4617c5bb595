"""python -m flat.bench's own sections (flat/bench/__main__.py says what each times): the binding's
overhead, flat.torch.gla against plain PyTorch and the models' gates (recurrence_bench), and a whole
layer (layer_bench)."""


import json
import statistics
import time

import torch

import flat
import flat.torch as ft
from flat import _core
from flat.nn import GatedLinearAttention
from flat.nn.ops import Ops, reference_conv, reference_norm
from flat.torch.ops import _view

from .gates import model_gates


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


def recurrence_bench(args):
    """Sections 1 to 3 (python -m flat.bench without --layer, --transformers or --context-parallel)."""
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
    view = _view
    forward_options = _core.options("forward", dict(chunk=64))
    backward_options = _core.options("backward", dict(chunk=64, check_values=False))
    dy = torch.randn(B, T, H, V, dtype=dtype)
    keep = {}

    def library_forward(fresh):
        y = torch.empty(B, T, H, V, dtype=dtype) if fresh else keep.setdefault("y", torch.empty(B, T, H, V, dtype=dtype))
        _core.call("forward", "gla", dict(q=view("q", q), k=view("k", k), v=view("v", v), g=view("g", g),
                                          y=view("y", y)), ([], [], [], []), forward_options, threads, "openmp")

    def library_backward(fresh):
        grads = [torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v, g)] if fresh else keep.setdefault(
            "grads", [torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v, g)])
        dq, dk, dv, dg = (view(n, t) for n, t in zip(("dq", "dk", "dv", "dg"), grads))
        _core.call("backward", "gla", dict(q=view("q", q), k=view("k", k), v=view("v", v), g=view("g", g),
                                           dy=view("dy", dy), dq=dq, dk=dk, dv=dv, dg=dg), ([], [], [], []),
                   backward_options, threads, "openmp")

    options = dict(chunk=64, l2norm_qk=False, solve="auto", precision="exact", gate_group=0, check_values=True)
    op_forward = lambda: torch.ops.flat.forward("gla", q, k, v, g, None, None, None, None, None, None,  # noqa: E731
                                                final_state=False, **options)
    op_backward = lambda: torch.ops.flat.backward("gla", q, k, v, g, None, None, None, None, None, None, dy,  # noqa: E731
                                                  None, **{**options, "check_values": False})
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


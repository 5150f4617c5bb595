"""python -m flat.bench --tpu: the seed paper's table rows for flat.jax's Pallas TPU kernels
(flat.jax.tpu, docs/tpu.md): Linear Attention, Mamba-2 and GLA, forward and forward+backward, at
B=8, S=4096, N=16, K=V=128 in bf16 (--tpu-shape), q, k, v made in the projection's [B, S, N*K]
layout. For whoever has a TPU: no timing of the project's comes from one. Without a TPU it
refuses, unless --tpu-backend interpret runs the same kernels in TPU interpret mode (a smoke run
of this code on tiny shapes, whose times say nothing of a TPU's)."""

import json
import statistics
import time

import jax
import jax.numpy as jnp

import flat.jax as fj

# The paper's rows (its variant names) and flat.jax's functions; retnet runs mamba2's kernels.
ROWS = (("Linear Attention", "la"), ("Mamba-2", "mamba2"), ("GLA", "gla"))
# The paper's v6e times in us at its shape, where it gives them: the forwards (its Throughput
# paragraph) and GLA's forward and backward.
PAPER_US = {("la", "forward"): 384.9, ("mamba2", "forward"): 438.0, ("gla", "forward"): 549.8,
            ("gla", "forward+backward"): 1982.0}


def _inputs(variant: str, B: int, S: int, N: int, K: int, V: int, dtype):
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    # [B, S, N*K] as a projection writes it; the reshape to [B, S, N, K] is free.
    q, k = (jax.random.normal(key, (B, S, N * K), dtype).reshape(B, S, N, K) for key in keys[:2])
    v = jax.random.normal(keys[2], (B, S, N * V), dtype).reshape(B, S, N, V)
    gate_shape = {"la": None, "mamba2": (B, S, N), "gla": (B, S, N, K)}[variant]
    g = None if gate_shape is None else jax.nn.log_sigmoid(jax.random.normal(keys[3], gate_shape)) / 16
    return (q, k, v) + (() if g is None else (g,))


def _median_us(f, args, repeats: int) -> float:
    jax.block_until_ready(f(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def tpu_bench(args) -> list:
    """The rows (variant, pass, us, the paper's us or None), printed as a table."""
    backend = args.tpu_backend
    if backend == "tpu" and jax.default_backend() != "tpu":
        raise SystemExit(f"flat.bench --tpu: no TPU here (JAX's default backend is {jax.default_backend()}); "
                         "--tpu-backend interpret runs the kernels in TPU interpret mode, for a smoke run only")
    B, S, N, K, V = (int(x) for x in args.tpu_shape.split(","))
    dtype = jnp.bfloat16 if args.dtype == "bf16" else jnp.float32
    options = dict(chunk_size=args.chunk, precision=args.precision, check_values=False, backend=backend)
    print(f"flat.jax TPU kernels ({backend}{', NOT a TPU timing' if backend != 'tpu' else ''}): "
          f"B={B} S={S} N={N} K={K} V={V} {args.dtype}, chunk {args.chunk}, precision {args.precision}, "
          f"median of {args.repeats} on {jax.devices()[0].device_kind}")
    chosen = args.variants.split(",") if args.variants else [variant for _, variant in ROWS]
    unknown = set(chosen) - {variant for _, variant in ROWS}
    if unknown:
        raise SystemExit(f"flat.bench --tpu: --variants: expected some of la,mamba2,gla, got {args.variants}")
    rows = []
    for name, variant in (row for row in ROWS if row[1] in chosen):
        inputs = _inputs(variant, B, S, N, K, V, dtype)
        call = getattr(fj, variant)
        forward = jax.jit(lambda *x, call=call: call(*x, **options)[0])
        loss = lambda *x, call=call: jnp.sum(call(*x, **options)[0].astype(jnp.float32))  # noqa: E731
        both = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(inputs)))))
        for label, f in (("forward", forward), ("forward+backward", both)):
            us = _median_us(f, inputs, args.repeats)
            paper = PAPER_US.get((variant, label)) if backend == "tpu" else None
            rows.append(dict(variant=variant, row=name, pass_=label, us=us, paper_v6e_us=paper))
            print(f"  {name:17s} {label:17s} {us:12.1f} us" + (f"   (paper, v6e: {paper:.1f} us)" if paper else ""))
    return rows


def write_json(args, rows: list, path: str) -> None:
    with open(path, "w") as f:
        json.dump(dict(backend=args.tpu_backend, shape=args.tpu_shape, dtype=args.dtype, chunk=args.chunk,
                       device=jax.devices()[0].device_kind,
                       rows=[{("pass" if k == "pass_" else k): v for k, v in row.items()} for row in rows]), f,
                  indent=2)

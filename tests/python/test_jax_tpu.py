"""flat.jax's Pallas TPU kernels (flat.jax.tpu) on a CPU: forward and gradients in TPU interpret mode
(backend="interpret") against the float64 oracle at the library's bounds, on tiny shapes that cross
chunk and sub-block edges; lowered and exported for the TPU platform (backend="tpu") at the seed
paper's shape and an awkward one; bad input refused with the CPU path's messages."""

import json
import re
import subprocess
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import flat.jax as fj
from flat.bench.__main__ import main
from oracle import BOUNDS, Problem, bound, expect_close, reference, round_to

VARIANTS = ("la", "retnet", "mamba2", "gla", "deltanet", "gated_deltanet", "kda", "gdn2")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
NAMES_IN = ("q", "k", "v", "g", "beta", "b", "w", "initial_state")
# The interpreter's XLA program is compiled without LLVM's optimisations: compiling it is most of a
# test's time (about 2.5 times less so), running it milliseconds.
QUICK_COMPILE = dict(compiler_options={"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True})


def arrays(p: Problem) -> dict:
    """The problem's inputs as JAX arrays (gates and states float32), by argument name."""
    q, k, v, g, beta, b, w, h0 = p.inputs()
    values = dict(q=(q, p.dtype), k=(k, p.dtype), v=(v, p.dtype), g=(g, "float32"), beta=(beta, p.dtype),
                  b=(b, p.dtype), w=(w, p.dtype), initial_state=(h0, "float32"))
    return {name: jnp.asarray(x, DTYPES[dtype]) for name, (x, dtype) in values.items() if x is not None}


def forward_and_gradients(p: Problem, inputs: dict, **options):
    """o, the final state and the gradients of every input for the problem's dy and dht, in one jit."""
    dy, dht = jnp.asarray(p.dy, DTYPES[p.dtype]), jnp.asarray(p.dht, jnp.float32)

    @partial(jax.jit, **QUICK_COMPILE)
    def run(inputs):
        (o, final_state), pullback = jax.vjp(
            lambda x: getattr(fj, p.variant)(**x, output_final_state=True, backend="interpret", **options), inputs)
        return o, final_state, pullback((dy.astype(o.dtype), dht))[0]

    return run(inputs)


def expect_oracle(p: Problem, got, precision="exact", l2norm=False):
    o, final_state, grads = got
    (y, ht), want = p.reference(l2norm=l2norm)
    expect_close("o", np.asarray(o.astype(jnp.float32)), y, bound("o", p.dtype, precision))
    expect_close("final_state", np.asarray(final_state), ht, bound("final_state", p.dtype, precision))
    for name, expected in zip(NAMES_IN, want):
        if name in grads:
            expect_close("d" + name, np.asarray(grads[name].astype(jnp.float32)), expected,
                         bound("d" + name, p.dtype, precision))


# Chunks of 16 rows; a per-channel gate's chunk of 32 (gla, kda, gdn2) holds two sub-blocks of 16 (its
# pairwise decays).
CHUNK = {"la": 16, "retnet": 16, "mamba2": 16, "gla": 32, "deltanet": 16, "gated_deltanet": 16, "kda": 32,
         "gdn2": 32}


# retnet runs mamba2's kernels (its constant gate broadcast over S): float32 alone checks the wiring.
CASES = [(variant, dtype) for variant in VARIANTS for dtype in ("float32", "bfloat16")
         if (variant, dtype) != ("retnet", "bfloat16")]


@pytest.mark.parametrize("variant, dtype", CASES)
def test_matches_the_oracle(variant, dtype):
    """float32 with an initial state, S = 40: two whole chunks of 16 and a partial one (chunks of 32:
    S ends inside the second chunk's first sub-block); bfloat16 without one, S = chunk + 1: a whole
    chunk, then a chunk of one row."""
    initial = dtype == "float32"
    p = Problem(variant, dtype, B=2, S=40 if initial else CHUNK[variant] + 1, H=2, K=16, V=8, h0=initial)
    expect_oracle(p, forward_and_gradients(p, arrays(p), chunk_size=CHUNK[variant]))


@pytest.mark.parametrize("variant", ["gla", "kda"])
def test_strong_gates(variant):
    """Per-channel gates down to Kimi Linear's -1,736 per token (docs/variants.md: no NaN or Inf for
    any finite gate <= 0), on half the channels: no decay is inverted, so the oracle's bounds hold."""
    p = Problem(variant, "float32", B=1, S=40, H=2, K=16, V=8)
    rng = np.random.default_rng(7)
    p.g = round_to(-1736.0 * rng.random(p.g.shape) * (rng.random(p.g.shape) < 0.5), "float32")
    expect_oracle(p, forward_and_gradients(p, arrays(p), chunk_size=32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sla_matches_the_oracle(dtype):
    """sla: kda with one gate value per group of channels (4 of K = 16 here) on its packed heads:
    float32 with an initial state, S = 40 (a partial second chunk of 32), one key head's q, k, g,
    beta shared by R = 4 value heads; bfloat16 without one, S = 33, two key heads of R = 2 and q
    shared by both (repeated to the two key heads, R = 2 packed)."""
    initial = dtype == "float32"
    heads = {"q": 1, "k": 1, "g": 1, "b": 1} if initial else {"q": 1, "k": 2, "g": 2, "b": 2}
    p = Problem("sla", dtype, B=1 if initial else 2, S=40 if initial else 33, H=4, K=16, V=8, G=4, heads=heads,
                h0=initial)
    expect_oracle(p, forward_and_gradients(p, arrays(p), chunk_size=32, gate_group=4))


def test_shared_heads_l2norm_and_fast_precision():
    """kda (a per-channel gate and the delta rule) with q and k shared by both heads (GQA), q and k
    L2-normalised in the kernel, precision="fast" (dot operands rounded to bf16 once, as a TPU's
    one-pass bf16 dot does): FLA's bounds."""
    p = Problem("kda", "float32", B=1, S=40, H=2, K=16, V=8, heads={"q": 1, "k": 1})
    got = forward_and_gradients(p, arrays(p), chunk_size=32, use_qk_l2norm_in_kernel=True, precision="fast")
    expect_oracle(p, got, precision="fast", l2norm=True)


def test_la_normalize_matches_float64():
    """la's normalize (a second run with values of ones: V = 1, a block as wide as the array), on
    positive q and k (feature maps', so the normalizer is well away from 0) against float64."""
    rng = np.random.default_rng(0)
    q, k = (rng.random((1, 24, 2, 16)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((1, 24, 2, 8)).astype(np.float32)
    scores = np.tril(np.einsum("bthk,bshk->bhts", q.astype(np.float64), k.astype(np.float64))) / 4.0
    want = np.einsum("bhts,bshv->bthv", scores, v) / (np.swapaxes(scores.sum(-1), 1, 2)[..., None] + 1e-10)
    o, _ = fj.la(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), normalize=True, chunk_size=16, backend="interpret")
    expect_close("o", np.asarray(o), want, BOUNDS["float32"][0])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv_matches_the_oracle(dtype):
    """The short convolution across chunks: S = 600 in chunks of 256 (the last partial), each
    chunk's window reaching into the one before and its gradient into the one after; float32 with
    a bias and an initial state, bfloat16 without either (W = 3)."""
    rng = np.random.default_rng(3)
    B, T, C, W = 2, 600, 24, 4 if dtype == "float32" else 3
    full = dtype == "float32"
    x, dy = (round_to(rng.standard_normal((B, T, C)), dtype) for _ in range(2))
    weight = round_to(rng.standard_normal((C, W)), "float32")
    bias = round_to(rng.standard_normal(C), "float32") if full else np.zeros(C)
    state0 = round_to(rng.standard_normal((B, C, W - 1)), "float32") if full else np.zeros((B, C, W - 1))
    dstate = round_to(rng.standard_normal((B, C, W - 1)), "float32")
    want = reference.reference_conv(B, T, C, W, "silu", x, weight, bias, state0, dy, dstate)
    arguments = dict(x=jnp.asarray(x, DTYPES[dtype]), weight=jnp.asarray(weight, jnp.float32))
    if full:
        arguments.update(bias=jnp.asarray(bias, jnp.float32), initial_state=jnp.asarray(state0, jnp.float32))

    @partial(jax.jit, **QUICK_COMPILE)
    def run(arguments):
        (y, state), pullback = jax.vjp(lambda a: fj.conv(**a, output_final_state=True, activation="silu",
                                                         backend="interpret"), arguments)
        return y, state, pullback((jnp.asarray(dy, DTYPES[dtype]), jnp.asarray(dstate, jnp.float32)))[0]

    y, state, grads = run(arguments)
    out_bound, grad_bound = (1e-5, 1e-5) if full else BOUNDS[dtype]
    got = dict(y=y, state=state, dx=grads["x"], dweight=grads["weight"], dbias=grads.get("bias"),
               dstate0=grads.get("initial_state"))
    for name, expected in zip(("y", "state", "dx", "dweight", "dbias", "dstate0"), want):
        if got[name] is not None:
            expect_close(name, np.asarray(got[name].astype(jnp.float32)), expected,
                         out_bound if name in ("y", "state") else grad_bound)


# ---- Lowered for the TPU ----------------------------------------------------------------------

SHAPES = {"paper": (8, 4096, 16, 128, 128, 64), "awkward": (3, 1000, 6, 64, 96, 48)}


def _specs(variant, B, S, N, K, V) -> dict:
    """The arguments of a call as ShapeDtypeStructs by name (q, k, v in bf16)."""
    q = jax.ShapeDtypeStruct((B, S, N, K), jnp.bfloat16)
    specs = dict(q=q, k=q, v=jax.ShapeDtypeStruct((B, S, N, V), jnp.bfloat16),
                 initial_state=jax.ShapeDtypeStruct((B, N, K, V), jnp.float32))
    gate = {"retnet": (N,), "mamba2": (B, S, N), "gated_deltanet": (B, S, N), "gla": (B, S, N, K),
            "kda": (B, S, N, K), "gdn2": (B, S, N, K)}.get(variant)
    if gate is not None:
        specs["g"] = jax.ShapeDtypeStruct(gate, jnp.float32)
    if variant in ("deltanet", "gated_deltanet", "kda"):
        specs["beta"] = jax.ShapeDtypeStruct((B, S, N), jnp.bfloat16)
    if variant == "gdn2":
        specs.update(b=specs["q"], w=specs["v"])
    if variant == "sla":  # q, k, g, beta shared by R = 4 value heads (2 where N is not a multiple of 4)
        Nk = N // 4 if N % 4 == 0 else N // 2
        shared = jax.ShapeDtypeStruct((B, S, Nk, K), jnp.bfloat16)
        specs.update(q=shared, k=shared, g=jax.ShapeDtypeStruct((B, S, Nk, K // 64), jnp.float32),
                     beta=jax.ShapeDtypeStruct((B, S, Nk), jnp.bfloat16))
    return specs


def _exported(variant, specs, chunk) -> dict:
    """The StableHLO text of the forward, and of the forward with backward, exported for the TPU
    platform, each checked to hold its Mosaic calls (the forward's one; three with the backward: the
    forward, state passing, gradients)."""
    def forward(arguments):
        return getattr(fj, variant)(**arguments, output_final_state=True, chunk_size=chunk, check_values=False,
                                    backend="tpu")

    def backward(arguments):
        (o, state), pullback = jax.vjp(forward, arguments)
        return o, state, pullback((jnp.ones_like(o), jnp.ones_like(state)))

    texts = {}
    for f, calls in ((forward, 1), (backward, 3)):
        texts[f.__name__] = text = jax.export.export(jax.jit(f), platforms=["tpu"])(specs).mlir_module()
        assert text.count("tpu_custom_call") == calls, f"{f.__name__}: {text.count('tpu_custom_call')} Mosaic calls"
    return texts


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_exports_for_the_tpu(variant, shape):
    """Lowered to Mosaic for the TPU platform without one (check_values, a host callback, is off: an
    exported module carries none)."""
    B, S, N, K, V, chunk = SHAPES[shape]
    _exported(variant, _specs(variant, B, S, N, K, V), chunk)


# sla's: the seed's (keys 256 wide shared by R = 4 value heads of 128, bf16) and an awkward one (three
# 64-channel gate tiles, R = 2 of 96, chunks of 48 over S = 1000): B, S, value heads N, K, V, chunk, R.
SLA_SHAPES = {"seed": (8, 4096, 16, 256, 128, 64, 4), "awkward": (3, 1000, 6, 192, 96, 48, 2)}


@pytest.mark.parametrize("shape", SLA_SHAPES)
def test_sla_exports_packed(shape):
    """sla's own path lowered for the TPU: each key head's R value heads are one head of the kernels,
    whose final state (the forward kernel's output before XLA unpacks it) is [B, N / R, K, R*V]."""
    B, S, N, K, V, chunk, R = SLA_SHAPES[shape]
    specs = _specs("sla", B, S, N, K, V)
    assert specs["q"].shape[2] == N // R
    packed = f"tensor<{B}x{N // R}x{K}x{R * V}xf32>"
    for name, text in _exported("sla", specs, chunk).items():
        assert packed in text, f"{name}: no packed state {packed}"


@pytest.mark.parametrize("shape", [(8, 4096, 2048, 4), (3, 1000, 200, 3)])
def test_conv_exports_for_the_tpu(shape):
    """The convolution at the paper's shape (B=8, S=4096, 2048 channels, W=4, bf16) and an awkward
    one: forward (one Mosaic call) and with backward (two)."""
    B, T, C, W = shape
    specs = dict(x=jax.ShapeDtypeStruct((B, T, C), jnp.bfloat16), weight=jax.ShapeDtypeStruct((C, W), jnp.float32),
                 bias=jax.ShapeDtypeStruct((C,), jnp.float32),
                 initial_state=jax.ShapeDtypeStruct((B, C, W - 1), jnp.float32))

    def forward(arguments):
        return fj.conv(**arguments, output_final_state=True, activation="silu", backend="tpu")

    def backward(arguments):
        (y, state), pullback = jax.vjp(forward, arguments)
        return y, pullback((jnp.ones_like(y), jnp.ones_like(state)))

    for f, calls in ((forward, 1), (backward, 2)):
        text = jax.export.export(jax.jit(f), platforms=["tpu"])(specs).mlir_module()
        assert text.count("tpu_custom_call") == calls, f"{f.__name__}: {text.count('tpu_custom_call')} Mosaic calls"


def test_vmap_lowers_for_the_tpu():
    """jax.vmap over a leading axis: Pallas's batching adds a grid axis, which Mosaic's lowering
    takes (TPU interpret mode does not: it is checked lowered, not run)."""
    specs = _specs("mamba2", 2, 256, 4, 128, 128)
    stacked = {name: jax.ShapeDtypeStruct((3,) + x.shape, x.dtype) for name, x in specs.items() if name != "initial_state"}

    def batched(arguments):
        return jax.vmap(lambda x: fj.mamba2(**x, check_values=False, backend="tpu")[0])(arguments)

    text = jax.export.export(jax.jit(batched), platforms=["tpu"])(stacked).mlir_module()
    assert text.count("tpu_custom_call") == 1


# ---- Refusals -----------------------------------------------------------------------------------


def _refusal(call) -> str:
    """The flat message a call raises (when it runs, for a value refused on the device)."""
    with pytest.raises(Exception) as caught:
        jax.block_until_ready(call())
    found = re.search(r"flat: [^\n]*", str(caught.value))
    assert found, str(caught.value)
    return found.group(0)


Q = jnp.zeros((2, 30, 2, 16))
G = -jnp.ones((2, 30, 2, 16))
BAD = {
    "rank": lambda backend: fj.gla(Q[0], Q, Q, G, backend=backend),
    "dtype": lambda backend: fj.gla(Q.astype(jnp.float16), Q, Q, G, backend=backend),
    "heads": lambda backend: fj.gla(Q, Q[:, :, :1], jnp.zeros((2, 30, 3, 16)), G, backend=backend),
    "chunk": lambda backend: fj.mamba2(Q, Q, Q, G[..., 0], chunk_size=24, backend=backend),
    "precision": lambda backend: fj.la(Q, Q, Q, precision="slow", backend=backend),
    "gate above 0": lambda backend: fj.gla(Q, Q, Q, G.at[1, 3, 0, 5].set(0.5), backend=backend),
    "nan state": lambda backend: fj.la(Q, Q, Q, initial_state=jnp.zeros((2, 2, 16, 16)).at[0, 1, 2, 3].set(jnp.nan),
                                       backend=backend),
    "retnet gate": lambda backend: fj.retnet(Q, Q, Q, jnp.array([-0.1, jnp.inf]), backend=backend),
    "gate under jit": lambda backend: jax.jit(lambda g: fj.mamba2(Q, Q, Q, g, backend=backend)[0], **QUICK_COMPILE)(
        G[..., 0].at[0, 1].set(2.0)),
    "gate and state": lambda backend: fj.mamba2(Q, Q, Q, G[..., 0].at[0, 2, 1].set(jnp.nan),
                                                initial_state=jnp.full((2, 2, 16, 16), jnp.inf), backend=backend),
    "gdn2 write gate": lambda backend: fj.gdn2(Q, Q, Q, G, Q, Q.at[1, 2, 0, 3].set(jnp.inf), backend=backend),
    "beta": lambda backend: fj.deltanet(Q, Q, Q, jnp.zeros((2, 30, 2)).at[0, 7, 1].set(jnp.nan), backend=backend),
    "kda gate group": lambda backend: fj.kda(Q, Q, Q, G[..., :3], jnp.zeros((2, 30, 2)), backend=backend),
    "conv weight": lambda backend: fj.conv(Q[:, :, 0], jnp.zeros((16, 4), jnp.bfloat16), backend=backend),
    "conv state": lambda backend: fj.conv(Q[:, :, 0], jnp.zeros((16, 4)), initial_state=jnp.zeros((2, 16, 4)),
                                          backend=backend),
    "conv activation": lambda backend: fj.conv(Q[:, :, 0], jnp.zeros((16, 4)), activation="relu", backend=backend),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_refused_as_on_the_cpu(case):
    cpu = _refusal(lambda: BAD[case]("cpu"))
    assert _refusal(lambda: BAD[case]("interpret")) == cpu


def test_what_the_tpu_kernels_do_not_take():
    with pytest.raises(ValueError, match="flat: backend: the TPU kernels run dense batches, got cu_seqlens; "
                                         "backend='cpu' runs it"):
        fj.gla(Q[:1], Q[:1], Q[:1], G[:1], cu_seqlens=jnp.array([0, 10, 30]), backend="interpret")
    with pytest.raises(ValueError, match="flat: backend: the TPU kernels run dense batches, got "
                                         "initial_state_indices"):
        fj.conv(Q[:, :, 0], jnp.zeros((16, 4)), initial_state=jnp.zeros((3, 16, 3)),
                initial_state_indices=jnp.array([2, 0]), backend="interpret")
    q, g = jax.ShapeDtypeStruct((1, 256, 4, 128), jnp.bfloat16), jax.ShapeDtypeStruct((1, 256, 4), jnp.float32)
    with pytest.raises(Exception):  # check_values' host callback: exported with check_values=False only
        jax.export.export(jax.jit(lambda q, g: fj.mamba2(q, q, q, g, backend="tpu")[0]), platforms=["tpu"])(q, g)
    with pytest.raises(ValueError, match="flat: backend: expected one of None, 'cpu', 'tpu', 'interpret'"):
        fj.gla(Q, Q, Q, G, backend="gpu")
    with pytest.raises(ValueError, match="flat: backend: 'tpu' runs the Pallas kernels compiled for a TPU, got "
                                         "arrays on cpu"):
        fj.gla(Q, Q, Q, G, backend="tpu")


def test_context_parallel_takes_the_tpu_path():
    """flat.jax.context_parallel(axis, backend=...) under jax.shard_map (one device here: the run
    widened by the exchange's K columns and started from [h0, 0], as on every shard) against the
    float64 oracle on the whole sequence."""
    p = Problem("gla", "float32", B=1, S=40, H=2, K=16, V=16)
    inputs = arrays(p)
    cp = fj.context_parallel("seq", backend="interpret")
    tokens = P(None, "seq")

    def step(q, k, v, g, h0):
        return cp.gla(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=32)

    run = jax.jit(jax.shard_map(step, mesh=Mesh(np.array(jax.devices()[:1]), ("seq",)),
                                in_specs=(tokens,) * 4 + (P(),), out_specs=(tokens, P()), check_vma=False),
                  **QUICK_COMPILE)
    o, final_state = run(*(inputs[name] for name in ("q", "k", "v", "g", "initial_state")))
    (y, ht), _ = p.reference()
    expect_close("o", np.asarray(o), y, BOUNDS["float32"][0])
    expect_close("final_state", np.asarray(final_state), ht, BOUNDS["float32"][0])


def test_the_tpu_bench_runs_in_interpret_mode(tmp_path):
    """python -m flat.bench --tpu's code, on a tiny shape in interpret mode (its times say nothing
    of a TPU's); without a TPU, --tpu-backend tpu refuses."""
    out = tmp_path / "tpu.json"
    main(["--tpu", "--tpu-shape", "1,16,2,16,16", "--variants", "la", "--chunk", "16", "--tpu-backend", "interpret",
          "--repeats", "1", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(row["variant"], row["pass"]) for row in rows] == [("la", "forward"), ("la", "forward+backward")]
    assert all(row["us"] > 0 and row["paper_v6e_us"] is None for row in rows)
    with pytest.raises(SystemExit, match="no TPU here"):
        main(["--tpu"])


def test_the_tpu_bench_needs_no_pytorch():
    """A TPU machine may have JAX alone: python -m flat.bench --tpu runs where torch cannot be
    imported, and every other mode says it needs PyTorch."""
    script = ("import runpy, sys\n"
              "sys.modules['torch'] = None  # import torch raises ImportError\n"
              "sys.argv = ['flat.bench'] + sys.argv[1:]\n"
              "runpy.run_module('flat.bench', run_name='__main__')\n")
    tpu = subprocess.run([sys.executable, "-c", script, "--tpu", "--tpu-shape", "1,16,2,16,16", "--variants", "la",
                          "--chunk", "16", "--tpu-backend", "interpret", "--repeats", "1"],
                         capture_output=True, text=True, timeout=300)
    assert tpu.returncode == 0, tpu.stderr
    cpu = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert cpu.returncode == 2 and "every mode but --tpu needs PyTorch" in cpu.stderr, cpu.stderr

"""flat.jax.context_parallel under jax.shard_map on 2 and 3 host devices: every variant's share of o,
the final state and every gradient (float32 and bfloat16), and the short convolution's (W = 1, 2,
4), against the float64 oracle on the whole sequence at the oracle tests' bounds, under jax.jit;
shares longer and shorter than a chunk, and shorter than the convolution's window (shard_map's
shares are equal, T a multiple of the device count: no uneven or empty share); one all-gather per
call of a size independent of T, its transpose the backward's one reduce-scatter; refused arguments.

XLA's device count (--xla_force_host_platform_device_count) is read when JAX starts, so each count
runs in a subprocess: this file, run as a script with the count as its argument."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import flat.jax as fj
from oracle import NAMES, Problem, bound, expect_close, reference

# Tokens per shard of each device count's sequence: longer than a chunk (64) on 2, shorter on 3.
LENGTHS = {2: 140, 3: 15}
# The convolution's: a share longer than the window, and one shorter (its window reaches back past
# its predecessor).
CONV_LENGTHS = {2: (140, 4), 3: (15, 3)}


def _check_variant(mesh, cp, variant, dtype, T):
    shared = {"q": 1, "k": 1, "g": 1, "b": 1} if variant == "sla" else {"q": 1, "k": 1}
    p = Problem(variant, dtype, S=T, G=4 if variant == "sla" else None, heads=shared)
    (y, ht), want = p.reference()
    narrow = jnp.dtype(dtype)
    names = ("q", "k", "v", "g", "beta", "b", "w", "initial_state")
    dtypes = dict(q=narrow, k=narrow, v=narrow, g=jnp.float32, beta=narrow, b=narrow, w=narrow,
                  initial_state=jnp.float32)
    inputs = {name: jnp.asarray(x, dtypes[name]) for name, x in zip(names, p.inputs()) if x is not None}
    # T sharded; the initial state and a per-head gate (retnet's g [H]) replicated.
    tokens = P(None, "seq")
    specs = {name: P() if name == "initial_state" or x.ndim == 1 else tokens for name, x in inputs.items()}
    options = {"gate_group": p.G} if variant in ("kda", "gdn2", "sla") else {}
    split = jax.shard_map(lambda inputs: getattr(cp, variant)(**inputs, output_final_state=True, **options),
                          mesh=mesh, in_specs=(specs,), out_specs=(tokens, P()), check_vma=False)
    dy, dht = jnp.asarray(p.dy, narrow).astype(jnp.float32), jnp.asarray(p.dht, jnp.float32)

    def loss(inputs):
        o, final_state = split(inputs)
        return jnp.sum(o.astype(jnp.float32) * dy) + jnp.sum(final_state * dht), (o, final_state)

    (_, (o, final_state)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(inputs)
    what = f"{variant} {dtype} T={T}"
    assert o.dtype == narrow and o.shape == y.shape, what
    expect_close(f"{what}: o", np.asarray(o.astype(jnp.float32)), y, bound("o", dtype))
    expect_close(f"{what}: final_state", np.asarray(final_state), ht, bound("final_state", dtype))
    for name, expected in zip(names, want):
        if expected is not None:
            got = np.asarray(grads[name].astype(jnp.float32))
            expect_close(f"{what}: d{name}", got, expected, bound("d" + name, dtype))


def _check_conv(mesh, cp, T, W):
    """The short convolution (W taps) against the oracle on the whole sequence; the weight's and
    bias's gradients whole (shard_map's transpose sums a replicated argument's)."""
    rng = np.random.default_rng(3)
    B, C = 2, 24
    arrays = (rng.standard_normal((B, T, C)), rng.standard_normal((C, W)), rng.standard_normal(C),
              rng.standard_normal((B, C, W - 1)), rng.standard_normal((B, T, C)), rng.standard_normal((B, C, W - 1)))
    x, weight, bias, state0, dy, dstate = [np.asarray(a, np.float32).astype(np.float64) for a in arrays]
    want = reference.reference_conv(B, T, C, W, "silu", x, weight, bias, state0, dy, dstate)
    inputs = dict(x=x, weight=weight, bias=bias, initial_state=state0)
    if W == 1:  # no state
        del inputs["initial_state"]
    inputs = {name: jnp.asarray(a, jnp.float32) for name, a in inputs.items()}
    tokens = P(None, "seq")
    specs = {name: tokens if name == "x" else P() for name in inputs}
    split = jax.shard_map(lambda inputs: cp.conv(**inputs, output_final_state=True, activation="silu"), mesh=mesh,
                          in_specs=(specs,), out_specs=(tokens, P()), check_vma=False)

    def loss(inputs):
        y, state = split(inputs)
        return jnp.sum(y * dy) + (0.0 if state is None else jnp.sum(state * dstate)), (y, state)

    (_, (y, state)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(inputs)
    got = dict(y=y, state=state, dx=grads["x"], dweight=grads["weight"], dbias=grads["bias"],
               dstate0=grads.get("initial_state"))
    assert (state is None) == (W == 1)
    for name, expected in zip(("y", "state", "dx", "dweight", "dbias", "dstate0"), want):
        if W > 1 or name not in ("state", "dstate0"):
            expect_close(f"conv W={W} T={T}: {name}", np.asarray(got[name]), expected, 1e-5)


_COLLECTIVE = re.compile(r'"stablehlo\.(all_gather|reduce_scatter|all_reduce|all_to_all|collective_permute|'
                         r'collective_broadcast)"')
_SIGNATURE = re.compile(r"\(tensor<([0-9x]+)xf32>\) -> tensor<([0-9x]+)xf32>")


def _collectives(lowered) -> list:
    """The collectives of a lowered program, each (name, operand shape, result shape): the first
    signature after the op's name is its own (after its reduction's region, if it has one)."""
    text = lowered.as_text()
    found = []
    for op in _COLLECTIVE.finditer(text):
        shapes = _SIGNATURE.search(text, op.end())
        found.append((op.group(1), shapes.group(1), shapes.group(2)))
    return found


def _one_gather_per_call_whatever_the_length(mesh, cp, devices):
    """The forward is one all-gather per shard of its [S, M] ([B, H, K, V + K], flattened) and one
    flag (whether its g holds a refused value), the backward one reduce-scatter of the gathered
    [N, B H K (V + K) + 1] (its transpose), whatever T."""
    B, H, K, V = 2, 2, 16, 8
    tokens = P(None, "seq")
    split = jax.shard_map(lambda q, k, v, g: cp.gla(q, k, v, g)[0], mesh=mesh, in_specs=(tokens,) * 4,
                          out_specs=tokens, check_vma=False)
    size = B * H * K * (V + K) + 1
    shard, gathered = f"1x{size}", f"{devices}x{size}"
    for T in (8 * devices, 200 * devices):
        q, k, g = (jnp.zeros((B, T, H, K)) for _ in range(3))
        v = jnp.zeros((B, T, H, V))
        forward = _collectives(jax.jit(split).lower(q, k, v, g))
        assert forward == [("all_gather", shard, gathered)], (T, forward)
        backward = _collectives(jax.jit(jax.grad(lambda *a: jnp.sum(split(*a)), argnums=(0, 1, 2, 3)))
                                .lower(q, k, v, g))
        assert backward == [("all_gather", shard, gathered), ("reduce_scatter", gathered, shard)], (T, backward)


def _refused_values_raise_on_every_shard(mesh, cp, devices):
    """A gate above 0, a non-finite strength or initial state on one shard: every shard raises the
    same error, naming the argument and the shard, forward alone and with its backward (a collective
    follows there), under jax.jit and op by op; none waits for the others. check_values=False runs."""
    B, T, H, K, V = 1, 8 * devices, 2, 16, 8
    rng = np.random.default_rng(5)
    q, k = (jnp.asarray(rng.standard_normal((B, T, H, K)), jnp.float32) for _ in range(2))
    v = jnp.asarray(rng.standard_normal((B, T, H, V)), jnp.float32)
    g = -jnp.ones((B, T, H))
    beta = jnp.full((B, T, H), 0.5)
    h0 = jnp.zeros((B, H, K, V))
    last = T - 1  # on the last shard
    cases = [("g", dict(g=g.at[0, last, 1].set(0.5)), r"g: expected finite values <= 0 \(log-space gates\), got "
              f"another on shard {devices - 1} of {devices}"),
             ("beta", dict(beta=beta.at[0, last, 0].set(jnp.nan)), f"beta: expected finite values, got another on "
              f"shard {devices - 1} of {devices}"),
             ("initial_state", dict(h0=h0.at[0, 1, 2, 3].set(jnp.inf)), "initial_state: expected finite values, got "
              f"another on shard 0 of {devices}")]
    tokens = P(None, "seq")
    for name, changed, message in cases:
        args = {**dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0), **changed}
        specs = {arg: P() if arg == "h0" else tokens for arg in args}

        def split(args, check_values=True):
            return jax.shard_map(lambda a: cp.gated_deltanet(a["q"], a["k"], a["v"], a["g"], a["beta"],
                                                             initial_state=a["h0"], output_final_state=True,
                                                             check_values=check_values),
                                 mesh=mesh, in_specs=(specs,), out_specs=(tokens, P()), check_vma=False)(args)

        for how, run in (("forward, jit", jax.jit(split)), ("forward, op by op", split),
                         ("backward, jit", jax.jit(jax.grad(lambda a: jnp.sum(split(a)[0]) + jnp.sum(split(a)[1]))))):
            with pytest.raises(Exception, match=message):
                jax.block_until_ready(run(args))
        o, _ = jax.jit(lambda a: split(a, check_values=False))(args)
        assert o.shape == (B, T, H, V), name


def _refused_arguments(mesh, cp):
    """Shapes are static: each refusal is raised while tracing, before any collective."""
    B, T, H, K, V = 2, 8 * len(mesh.devices), 2, 16, 8
    q = jnp.zeros((B, T, H, K))
    v = jnp.zeros((B, T, H, V))
    tokens = P(None, "seq")
    cases = [
        ("initial_state: expected [B, H, K, V] = [2, 2, 16, 8], got [2, 2, 8, 16]",
         lambda q, v: cp.la(q, q, v, initial_state=jnp.zeros((B, H, V, K)))),
        ("la: normalize", lambda q, v: cp.la(q, q, v, normalize=True)),
        ("cu_seqlens and state pools are not supported", lambda q, v: cp.la(q, q, v, cu_seqlens=jnp.array([0, 4]))),
        ("k: expected [B, T, H, D], got rank 3", lambda q, v: cp.la(q, q[0], v)),
        ("conv: cu_seqlens and state pools", lambda q, v: cp.conv(q[:, :, 0], jnp.ones((K, 4)),
                                                                 cu_seqlens=jnp.array([0, 4]))),
        ("x: expected [B, T, C], got rank 4", lambda q, v: cp.conv(q, jnp.ones((K, 4)))),
    ]
    for message, call in cases:
        split = jax.shard_map(call, mesh=mesh, in_specs=(tokens, tokens), out_specs=tokens, check_vma=False)
        with pytest.raises(ValueError, match=re.escape(message)):
            jax.jit(split)(q, v)


def _checks(devices: int) -> None:
    assert len(jax.devices()) == devices, jax.devices()
    mesh = Mesh(jax.devices(), ("seq",))
    cp = fj.context_parallel("seq")
    for variant in NAMES:
        for dtype in ("float32", "bfloat16"):
            _check_variant(mesh, cp, variant, dtype, LENGTHS[devices])
    for T in CONV_LENGTHS[devices]:
        for W in (1, 2, 4):
            _check_conv(mesh, cp, T, W)
    _one_gather_per_call_whatever_the_length(mesh, cp, devices)
    _refused_values_raise_on_every_shard(mesh, cp, devices)
    _refused_arguments(mesh, cp)


@pytest.mark.parametrize("devices", [2, 3])
def test_every_variant_split_across_devices_matches_the_oracle(devices):
    # XLA's own optimisations off: its part of these programs is the glue around the kernels' custom
    # calls, whose compilation is most of this test's time.
    flags = (f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices} "
             "--xla_backend_optimization_level=0").strip()
    done = subprocess.run([sys.executable, __file__, str(devices)], env={**os.environ, "XLA_FLAGS": flags},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


if __name__ == "__main__":
    _checks(int(sys.argv[1]))

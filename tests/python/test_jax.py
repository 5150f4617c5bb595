"""flat.jax: every operation forward and backward (jax.grad, jax.jit) against the float64 oracle at
the library's bounds; bitwise the PyTorch binding's results; eval_shape; vmap; bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flat.jax as fj
from oracle import BOUNDS, NAMES, Problem, expect_close, reference

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
NAMES_IN = ("q", "k", "v", "g", "beta", "b", "w", "initial_state")


def arrays(p: Problem):
    """The problem's inputs as JAX arrays (gates and states float32), by argument name."""
    q, k, v, g, beta, b, w, h0 = p.inputs()
    values = dict(q=(q, p.dtype), k=(k, p.dtype), v=(v, p.dtype), g=(g, "float32"), beta=(beta, p.dtype),
                  b=(b, p.dtype), w=(w, p.dtype), initial_state=(h0, "float32"))
    return {name: jnp.asarray(x, DTYPES[dtype]) for name, (x, dtype) in values.items() if x is not None}


def run(p: Problem, **inputs):
    kwargs = dict(inputs)
    if p.variant in ("kda", "gdn2", "sla"):
        kwargs["gate_group"] = p.G
    return getattr(fj, p.variant)(**kwargs, output_final_state=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", NAMES)
def test_grad_under_jit_matches_the_oracle(variant, dtype):
    shared = {"q": 1, "k": 1, "g": 1, "b": 1} if variant == "sla" else {"q": 1, "k": 1}
    p = Problem(variant, dtype, G=4 if variant == "sla" else None, heads=shared)
    inputs = arrays(p)
    dy, dht = jnp.asarray(p.dy, DTYPES[dtype]), jnp.asarray(p.dht, jnp.float32)

    def loss(inputs):
        o, final_state = run(p, **inputs)
        return jnp.sum(o.astype(jnp.float32) * dy.astype(jnp.float32)) + jnp.sum(final_state * dht)

    (o, final_state) = run(p, **inputs)
    grads = jax.jit(jax.grad(loss))(inputs)
    (y, ht), want = p.reference()
    out_bound, grad_bound = BOUNDS[dtype]
    expect_close("o", np.asarray(o.astype(jnp.float32)), y, out_bound)
    expect_close("final_state", np.asarray(final_state), ht, out_bound)
    for name, expected in zip(NAMES_IN, want):
        if expected is not None:
            expect_close("d" + name, np.asarray(grads[name].astype(jnp.float32)), expected, grad_bound)


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_the_same_bits_as_pytorch(precision):
    torch = pytest.importorskip("torch")
    import flat.torch as ft

    p = Problem("gated_deltanet", "bfloat16", B=2, S=90, H=4, K=32, V=16)
    o_jax, s_jax = run(p, **arrays(p), precision=precision)
    q, k, v, g, beta, _, _, h0 = p.inputs()
    t = lambda x, dt=torch.bfloat16: torch.tensor(x, dtype=dt)  # noqa: E731
    o_torch, s_torch = ft.gated_deltanet(t(q), t(k), t(v), t(g, torch.float32), t(beta), precision=precision,
                                         initial_state=t(h0, torch.float32), output_final_state=True)
    assert np.array_equal(np.asarray(o_jax.astype(jnp.float32)), o_torch.float().numpy())
    assert np.array_equal(np.asarray(s_jax), s_torch.numpy())


def test_eval_shape():
    q = jax.ShapeDtypeStruct((2, 70, 4, 32), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((2, 70, 4, 16), jnp.bfloat16)
    g = jax.ShapeDtypeStruct((2, 70, 4, 32), jnp.float32)
    o, state = jax.eval_shape(lambda q, k, v, g: fj.gla(q, k, v, g, output_final_state=True), q, q, v, g)
    assert (o.shape, o.dtype) == ((2, 70, 4, 16), jnp.bfloat16)
    assert (state.shape, state.dtype) == ((2, 4, 32, 16), jnp.float32)


def test_vmap_over_a_leading_axis():
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.standard_normal((3, 1, 40, 2, 16)), jnp.float32) for _ in range(2))
    v = jnp.asarray(rng.standard_normal((3, 1, 40, 2, 8)), jnp.float32)
    g = jnp.asarray(-rng.random((3, 1, 40, 2)), jnp.float32)
    batched = jax.vmap(lambda q, k, v, g: fj.mamba2(q, k, v, g)[0])(q, k, v, g)
    for i in range(3):
        assert np.array_equal(np.asarray(batched[i]), np.asarray(fj.mamba2(q[i], k[i], v[i], g[i])[0]))
    grad = jax.grad(lambda q: jnp.sum(jax.vmap(lambda q, k, v, g: fj.mamba2(q, k, v, g)[0])(q, k, v, g)))(q)
    assert grad.shape == q.shape and np.all(np.isfinite(np.asarray(grad)))


def test_conv_matches_the_oracle():
    rng = np.random.default_rng(3)
    B, T, C, W = 2, 40, 24, 4
    xs = [np.asarray(a, np.float32).astype(np.float64)
          for a in (rng.standard_normal((B, T, C)), rng.standard_normal((C, W)), rng.standard_normal(C),
                    rng.standard_normal((B, C, W - 1)), rng.standard_normal((B, T, C)),
                    rng.standard_normal((B, C, W - 1)))]
    want = reference.reference_conv(B, T, C, W, "silu", *xs)
    x, weight, bias, state0, dy, dstate = (jnp.asarray(a, jnp.float32) for a in xs)

    def loss(x, weight, bias, state0):
        y, state = fj.conv(x, weight, bias, initial_state=state0, output_final_state=True, activation="silu")
        return jnp.sum(y * dy) + jnp.sum(state * dstate)

    y, state = fj.conv(x, weight, bias, initial_state=state0, output_final_state=True, activation="silu")
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(x, weight, bias, state0)
    for name, got, expected in zip(("y", "state", "dx", "dweight", "dbias", "dstate0"), (y, state, *grads), want):
        expect_close(name, np.asarray(got), expected, 1e-5)


@pytest.mark.parametrize("activation, norm_before_gate", [("silu", True), ("sigmoid", False)])
def test_rms_norm_gated_matches_the_oracle(activation, norm_before_gate):
    rng = np.random.default_rng(5)
    B, T, H, D = 2, 17, 3, 20
    xs = [np.asarray(a, np.float32).astype(np.float64) for a in (
        rng.standard_normal((B, T, H, D)), 2 * rng.standard_normal((B, T, H, D)), 1 + rng.standard_normal(D),
        rng.standard_normal((B, T, H, D)))]
    rows = B * T * H
    want = reference.reference_norm_gate(rows, H, D, activation, norm_before_gate, 1e-5, xs[0].reshape(rows, D),
                                     xs[1].reshape(rows, D), xs[2], xs[3].reshape(rows, D))
    x, g, weight, dy = (jnp.asarray(a, jnp.float32) for a in xs)

    def loss(x, g, weight):
        return jnp.sum(fj.rms_norm_gated(x, g, weight, activation=activation, eps=1e-5,
                                         norm_before_gate=norm_before_gate) * dy)

    y = fj.rms_norm_gated(x, g, weight, activation=activation, eps=1e-5, norm_before_gate=norm_before_gate)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, g, weight)
    for name, got, expected in zip(("y", "dx", "dg", "dweight"), (y, *grads), want):
        expect_close(name, np.asarray(got).reshape(expected.shape), expected, 1e-5)


def test_bad_input_raises_with_the_librarys_message():
    q = jnp.zeros((2, 30, 2, 16))
    with pytest.raises(Exception, match="flat: g: expected finite values <= 0"):
        fj.gla(q, q, q, jnp.ones((2, 30, 2, 16)))[0].block_until_ready()
    with pytest.raises(Exception, match="flat: g: expected finite values <= 0"):  # None: the default, checked
        fj.gla(q, q, q, jnp.ones((2, 30, 2, 16)), check_values=None)[0].block_until_ready()
    with pytest.raises(ValueError, match="flat: q: expected rank 4"):
        fj.gla(q[0], q, q, q)

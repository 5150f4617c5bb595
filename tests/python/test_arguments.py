"""Arguments at their edges, in flat.torch and flat.jax alike: an empty batch (B = 0 or T = 0) runs
as any framework op does; a scale that is not a finite number, an initial_state whose shape is not a
state's, an empty cu_seqlens, index values that JAX would narrow, an unknown solve name reaching the
FFI directly, and bad accepted_state_indices arguments are refused by name, nothing written."""

import re

import numpy as np
import pytest
import torch

import flat.torch as ft
from flat import _core

H, K, V = 2, 16, 8


def recurrence_inputs(variant, B, T, seed=0):
    """float32 inputs of a variant (numpy), by argument name: q, k, v and its gate and strengths."""
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) for _ in range(2))
    inputs = dict(q=q, k=k, v=rng.standard_normal((B, T, H, V)).astype(np.float32))
    if variant == "retnet":
        inputs["g"] = np.full((H,), -0.1, np.float32)
    if variant in ("gla", "kda"):
        inputs["g"] = np.full((B, T, H, K), -0.1, np.float32)
    if variant == "gated_deltanet":
        inputs["g"] = np.full((B, T, H), -0.1, np.float32)
    if variant in ("gated_deltanet", "kda", "deltanet"):
        inputs["beta"] = np.full((B, T, H), 0.5, np.float32)
    return inputs


def states(rows, seed=1):
    return np.random.default_rng(seed).standard_normal((rows, H, K, V)).astype(np.float32)


def jax_modules():
    jax = pytest.importorskip("jax")
    fj = pytest.importorskip("flat.jax")
    return jax, jax.numpy, fj


# ---- An empty batch ------------------------------------------------------------------------------

EMPTY = [(0, 5), (3, 0)]


@pytest.mark.parametrize("B, T", EMPTY)
@pytest.mark.parametrize("variant", ["la", "retnet", "gated_deltanet", "kda"])
def test_torch_empty_batch(variant, B, T):
    inputs = {name: torch.tensor(x, requires_grad=True) for name, x in recurrence_inputs(variant, B, T).items()}
    h0 = torch.tensor(states(B), requires_grad=True)
    o, ht = getattr(ft, variant)(**inputs, initial_state=h0, output_final_state=True)
    assert o.shape == (B, T, H, V) and torch.equal(ht, h0)
    dht = torch.tensor(states(B, seed=2))
    (ht * dht).sum().backward()
    assert torch.equal(h0.grad, dht)
    for name, x in inputs.items():  # retnet's g [H] is summed over no token
        assert x.grad.shape == x.shape and not x.grad.any(), name
    _, zero = getattr(ft, variant)(**{n: x.detach() for n, x in inputs.items()}, output_final_state=True)
    assert zero.shape == (B, H, K, V) and not zero.any()


@pytest.mark.parametrize("B, T", EMPTY)
@pytest.mark.parametrize("variant", ["retnet", "kda"])
def test_jax_empty_batch(variant, B, T):
    jax, jnp, fj = jax_modules()
    inputs = {name: jnp.asarray(x) for name, x in recurrence_inputs(variant, B, T).items()}
    h0, dht = jnp.asarray(states(B)), jnp.asarray(states(B, seed=2))
    run = jax.jit(lambda inputs, h0: getattr(fj, variant)(**inputs, initial_state=h0, output_final_state=True))
    (o, ht), pullback = jax.vjp(run, inputs, h0)
    assert o.shape == (B, T, H, V) and np.array_equal(np.asarray(ht), np.asarray(h0))
    grads, dh0 = pullback((jnp.zeros_like(o), dht))
    assert np.array_equal(np.asarray(dh0), np.asarray(dht))
    for name, grad in grads.items():
        assert grad.shape == inputs[name].shape and not np.asarray(grad).any(), name
    _, zero = getattr(fj, variant)(**inputs, output_final_state=True)
    assert zero.shape == (B, H, K, V) and not np.asarray(zero).any()


@pytest.mark.parametrize("B, T", EMPTY)
def test_conv_and_norm_empty_batch(B, T):
    x, dy = (torch.randn(B, T, 6, requires_grad=True) for _ in range(2))
    weight, bias = torch.randn(6, 4, requires_grad=True), torch.randn(6, requires_grad=True)
    state0 = torch.randn(B, 6, 3, requires_grad=True)
    y, state = ft.conv(x, weight, bias, state0, output_final_state=True)
    assert y.shape == x.shape and torch.equal(state, state0)
    dstate = torch.randn(B, 6, 3)
    (y * dy).sum().add((state * dstate).sum()).backward()
    assert torch.equal(state0.grad, dstate) and not weight.grad.any() and not bias.grad.any()
    _, zero = ft.conv(x.detach(), weight.detach(), output_final_state=True)
    assert zero.shape == (B, 6, 3) and not zero.any()

    norm_weight = torch.randn(8, requires_grad=True)
    xs = torch.randn(B, T, 8, requires_grad=True)
    ft.rms_norm_gated(xs, torch.randn(B, T, 8), norm_weight).sum().backward()
    assert not norm_weight.grad.any() and xs.grad.shape == xs.shape

    jax, jnp, fj = jax_modules()
    yj, statej = fj.conv(jnp.asarray(x.detach().numpy()), jnp.asarray(weight.detach().numpy()),
                         initial_state=jnp.asarray(state0.detach().numpy()), output_final_state=True)
    assert yj.shape == (B, T, 6) and np.array_equal(np.asarray(statej), state0.detach().numpy())
    dweight = jax.grad(lambda w: fj.rms_norm_gated(jnp.zeros((B, T, 8)), None, w).sum())(jnp.ones(8))
    assert not np.asarray(dweight).any()


# ---- Refused arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_a_scale_that_is_not_finite_is_refused(scale):
    inputs = recurrence_inputs("la", 1, 4)
    message = re.escape(f"flat: scale: expected a finite number, or None for K^-1/2, got {float(scale)}")
    with pytest.raises(ValueError, match=message):
        ft.la(**{n: torch.tensor(x) for n, x in inputs.items()}, scale=scale)
    _, jnp, fj = jax_modules()
    with pytest.raises(ValueError, match=message):
        fj.la(**{n: jnp.asarray(x) for n, x in inputs.items()}, scale=scale)


def test_the_default_scale_is_none():
    inputs = recurrence_inputs("gla", 2, 9)
    torch_inputs = {n: torch.tensor(x) for n, x in inputs.items()}
    assert torch.equal(ft.gla(**torch_inputs)[0], ft.gla(**torch_inputs, scale=K ** -0.5)[0])
    _, jnp, fj = jax_modules()
    jax_inputs = {n: jnp.asarray(x) for n, x in inputs.items()}
    assert np.array_equal(np.asarray(fj.gla(**jax_inputs)[0]), ft.gla(**torch_inputs)[0].numpy())
    assert np.array_equal(np.asarray(fj.gla(**jax_inputs, scale=0.5)[0]), ft.gla(**torch_inputs, scale=0.5)[0].numpy())


def test_an_initial_state_of_the_wrong_rank_is_refused():
    inputs = {n: torch.tensor(x) for n, x in recurrence_inputs("la", 1, 4).items()}
    with pytest.raises(ValueError, match=re.escape("flat: initial_state: expected a tensor of rank 1 to 4, got rank 0")):
        ft.la(**inputs, initial_state=torch.tensor(3.0))
    with pytest.raises(ValueError, match=re.escape("flat: initial_state: expected a tensor of rank 1 to 4, got rank 0")):
        ft.conv(torch.randn(1, 4, 6), torch.randn(6, 4), initial_state=torch.tensor(3.0))
    with pytest.raises(ValueError, match=re.escape("flat: h0: expected rank 4 [B=1, N=2, K=16, V=8], got rank 1 [1]")):
        ft.la(**inputs, initial_state=torch.tensor([3.0]))
    _, jnp, fj = jax_modules()
    with pytest.raises(Exception, match=re.escape("flat: initial_state: expected an array of rank 1 to 4, got rank 0")):
        fj.la(**{n: jnp.asarray(x.numpy()) for n, x in inputs.items()}, initial_state=jnp.float32(3.0))[0]\
            .block_until_ready()


def test_an_empty_cu_seqlens_is_refused():
    inputs = recurrence_inputs("gla", 2, 4)
    message = re.escape("flat: cu_seqlens: expected num_seqs + 1 offsets from 0 to T (None for one sequence per batch "
                        "row), got an empty array")
    empty = np.zeros(0, np.int64)
    with pytest.raises(ValueError, match=message):
        ft.gla(**{n: torch.tensor(x) for n, x in inputs.items()}, cu_seqlens=torch.tensor(empty),
               output_final_state=True)
    with pytest.raises(ValueError, match=message):
        ft.conv(torch.randn(2, 4, 6), torch.randn(6, 4), cu_seqlens=torch.tensor(empty), output_final_state=True)
    pool = torch.tensor(states(3))
    before = pool.clone()
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        ft.gla(**{n: torch.tensor(x[:1]) for n, x in inputs.items()}, initial_state=pool,
               cu_seqlens=torch.tensor(empty), final_state_indices=torch.tensor([0]))
    assert torch.equal(pool, before)
    _, jnp, fj = jax_modules()
    with pytest.raises(ValueError, match=message):
        fj.gla(**{n: jnp.asarray(x) for n, x in inputs.items()}, cu_seqlens=empty, output_final_state=True)
    with pytest.raises(ValueError, match=message):
        fj.conv(jnp.zeros((2, 4, 6)), jnp.zeros((6, 4)), cu_seqlens=jnp.asarray(empty), output_final_state=True)


@pytest.mark.parametrize("indices, message", [
    (dict(initial_state_indices=[2 ** 32 + 1, 0]), "initial_state_indices: expected values that fit int32 "
                                                   "(jax_enable_x64 is off, so JAX would narrow them), got 4294967297 "
                                                   "at [0]"),
    (dict(final_state_indices=[0, 2 ** 32 + 3]), "final_state_indices: expected values that fit int32 (jax_enable_x64 "
                                                 "is off, so JAX would narrow them), got 4294967299 at [1]"),
    (dict(final_state_indices=[0, 2 ** 32 - 1]), "final_state_indices: expected values that fit int32"),
    (dict(cu_seqlens=[0, 2, 2 ** 32 + 10]), "cu_seqlens: expected values that fit int32"),
    (dict(token_state_indices=[-1] * 9 + [-2 ** 40]), "token_state_indices: expected values that fit int32"),
])
def test_jax_refuses_index_values_it_would_narrow(indices, message):
    jax, jnp, fj = jax_modules()
    inputs = {n: jnp.asarray(x) for n, x in recurrence_inputs("gla", 1, 10).items()}
    pool = jnp.asarray(states(4))
    before = np.asarray(pool).copy()
    arrays = dict(cu_seqlens=[0, 4, 10], final_state_indices=[0, 1])
    arrays.update(indices)
    with pytest.raises(ValueError, match=re.escape(message)):
        fj.gla(**inputs, initial_state=pool, **{n: np.asarray(x, np.int64) for n, x in arrays.items()})
    assert np.array_equal(np.asarray(pool), before)
    with pytest.raises(ValueError, match="fit int32"):
        fj.accepted_state_indices(np.asarray([0, 2 ** 33], np.int64), np.asarray([0, 2]), np.asarray([1]))
    with jax.enable_x64(True):  # no narrowing: the library sees the values, and refuses them as rows
        with pytest.raises(Exception, match="expected|offsets"):
            fj.gla(**inputs, initial_state=jnp.asarray(states(4)),
                   **{n: np.asarray(x, np.int64) for n, x in arrays.items()})[0].block_until_ready()


def test_unknown_solve_names_are_refused_by_both_bindings():
    jax, jnp, fj = jax_modules()
    message = re.escape("flat: solve: expected auto, subst, blocked or doubling, got 'neumann'")
    q = jnp.zeros((1, 4, H, K))
    none = jnp.zeros((0,), jnp.float32)
    ints = jnp.zeros((0,), jnp.int32)
    call = jax.ffi.ffi_call("flat_forward", (jax.ShapeDtypeStruct((1, 4, H, K), jnp.float32),
                                             jax.ShapeDtypeStruct((0,), jnp.float32)))
    with pytest.raises(Exception, match=message):
        call(q, q, q, none, jnp.full((1, 4, H), 0.5), none, none, none, ints, ints, ints, ints, variant="deltanet",
             scale=np.float32(0), default_scale=np.int64(1), chunk=np.int64(16), l2norm=np.int64(0), solve="neumann",
             gate_group=np.int64(0), check_values=np.int64(1))[0].block_until_ready()
    x = torch.zeros(1, 4, H, K)
    view = (x.data_ptr(), "f32", tuple(x.shape), tuple(x.stride()))
    beta = torch.full((1, 4, H), 0.5)
    with pytest.raises(ValueError, match=message):
        _core.forward("deltanet", view, view, view, None, (beta.data_ptr(), "f32", (1, 4, H), beta.stride()), None,
                      None, None, view, None, ([], [], [], []), None, 16, False, "neumann", 0, True, 1, "flat")


# ---- accepted_state_indices ---------------------------------------------------------------------


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_accepted_state_indices_edges(framework):
    if framework == "torch":
        def call(tokens, cu, accepted):
            return ft.accepted_state_indices(*(torch.tensor(x, dtype=torch.int64) for x in (tokens, cu, accepted)))
    else:
        _, jnp, fj = jax_modules()

        def call(tokens, cu, accepted):
            return fj.accepted_state_indices(*(jnp.asarray(x, jnp.int32) for x in (tokens, cu, accepted)))

    # An empty sequence takes 0 accepted and gets -1: it kept no state this step.
    assert np.asarray(call([4, 5, 6], [0, 2, 2, 3], [2, 0, 1])).tolist() == [5, -1, 6]
    with pytest.raises(ValueError, match=re.escape("flat: cu_seqlens: expected non-decreasing offsets from 0, got "
                                                   "[-2, 3]")):
        call([4, 5, 6, 7, 8], [-2, 3], [1])
    with pytest.raises(ValueError, match=re.escape("flat: cu_seqlens: expected num_seqs + 1 offsets")):
        call([4, 5], [], [])
    with pytest.raises(ValueError, match=re.escape("flat: token_state_indices: sequence 1's last accepted token, "
                                                   "token_state_indices[3], kept no state (-1)")):
        call([4, 5, 6, -1], [0, 2, 4], [2, 2])
    with pytest.raises(ValueError, match=re.escape("flat: num_accepted: expected a count per sequence from 1 to its "
                                                   "length [2, 0, 1] (0 for an empty sequence), got [0, 0, 1]")):
        call([4, 5, 6], [0, 2, 2, 3], [0, 0, 1])


def test_jax_accepted_state_indices_traced_gives_minus_one_for_an_empty_sequence():
    jax, jnp, fj = jax_modules()
    rows = jax.jit(fj.accepted_state_indices)(jnp.asarray([4, 5, 6]), jnp.asarray([0, 2, 2, 3]),
                                              jnp.asarray([2, 0, 1]))
    assert np.asarray(rows).tolist() == [5, -1, 6]
    rows = jax.jit(fj.accepted_state_indices)(jnp.zeros((0,), jnp.int32), jnp.asarray([0, 0]), jnp.asarray([0]))
    assert np.asarray(rows).tolist() == [-1]

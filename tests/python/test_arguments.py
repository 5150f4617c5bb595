"""Arguments at their edges, in flat.torch and flat.jax alike: an empty batch (B = 0 or T = 0) runs
as any framework op does, over a pool too; a scale that is not a finite number, an initial_state
whose shape is not a state's, an empty cu_seqlens, index values that JAX would narrow, an unknown
solve or precision name reaching the FFI directly, None for either, and bad accepted_state_indices
arguments are refused by name (the library's refusals naming the initial_state as passed), nothing
written. FLA 0.6's arguments (a bfloat16 initial_state, state_v_first, the gate and beta formed
around the kernel, g_gamma, la's normalize with FLA's state pair, conv's and rms_norm_gated's
activation, bias, residual and defaults) against plain PyTorch formulas, and refused by name where
they do not fit; FLA's positional order of each function flat shares."""

import inspect
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

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


@pytest.mark.parametrize("B, T", EMPTY)
def test_empty_batch_over_a_pool(B, T):
    """An empty batch over a pool, each sequence reading and writing its own row: the rows read
    come back as the final states, and the pool as it was from a write; with B = 0 (empty index
    arrays, no row) as with T = 0. The recurrence and the convolution, flat.torch and flat.jax."""
    rows = torch.tensor([2, 0, 3][:B], dtype=torch.int64)
    inputs = {name: torch.tensor(x) for name, x in recurrence_inputs("la", B, T).items()}
    pool, conv_pool = torch.tensor(states(4)), torch.randn(4, 6, 3)
    x, weight = torch.randn(B, T, 6), torch.randn(6, 4)
    o, finals = ft.la(**inputs, initial_state=pool, output_final_state=True, initial_state_indices=rows)
    assert o.shape == (B, T, H, V) and torch.equal(finals, pool[rows])
    y, conv_finals = ft.conv(x, weight, None, conv_pool, True, initial_state_indices=rows)
    assert y.shape == (B, T, 6) and torch.equal(conv_finals, conv_pool[rows])
    before = pool.clone(), conv_pool.clone()
    o, written = ft.la(**inputs, initial_state=pool, initial_state_indices=rows, final_state_indices=rows)
    y, conv_written = ft.conv(x, weight, None, conv_pool, initial_state_indices=rows, final_state_indices=rows)
    assert o.shape == (B, T, H, V) and y.shape == (B, T, 6) and written is pool and conv_written is conv_pool
    assert torch.equal(pool, before[0]) and torch.equal(conv_pool, before[1])

    _, jnp, fj = jax_modules()
    j = {name: jnp.asarray(t.numpy()) for name, t in dict(**inputs, pool=pool, conv_pool=conv_pool, x=x, weight=weight,
                                                          rows=rows).items()}
    la = {name: j[name] for name in inputs}
    o, finals = fj.la(**la, initial_state=j["pool"], output_final_state=True, initial_state_indices=j["rows"])
    assert o.shape == (B, T, H, V) and np.array_equal(np.asarray(finals), pool[rows].numpy())
    _, written = fj.la(**la, initial_state=j["pool"], initial_state_indices=j["rows"], final_state_indices=j["rows"])
    assert np.array_equal(np.asarray(written), pool.numpy())
    y, conv_finals = fj.conv(j["x"], j["weight"], None, j["conv_pool"], True, initial_state_indices=j["rows"])
    assert y.shape == (B, T, 6) and np.array_equal(np.asarray(conv_finals), conv_pool[rows].numpy())
    _, conv_written = fj.conv(j["x"], j["weight"], None, j["conv_pool"], initial_state_indices=j["rows"],
                              final_state_indices=j["rows"])
    assert np.array_equal(np.asarray(conv_written), conv_pool.numpy())


# ---- Refused arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_a_scale_that_is_not_finite_is_refused(scale):
    inputs = recurrence_inputs("la", 1, 4)
    message = re.escape(f"flat: scale: expected a finite number, or none for K^-1/2, got {float(scale)}")
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
    with pytest.raises(ValueError, match=re.escape("flat: initial_state: expected rank 4 [B=1, N=2, K=16, V=8], got "
                                                   "rank 1 [1]")):
        ft.la(**inputs, initial_state=torch.tensor([3.0]))
    _, jnp, fj = jax_modules()
    with pytest.raises(Exception, match=re.escape("flat: initial_state: expected an array of rank 1 to 4, got rank 0")):
        fj.la(**{n: jnp.asarray(x.numpy()) for n, x in inputs.items()}, initial_state=jnp.float32(3.0))[0]\
            .block_until_ready()


def test_the_librarys_refusals_name_the_initial_state_as_passed():
    """The library's h0 (the recurrence's) and state0 (the convolution's) are the caller's
    initial_state: its refusals name them so, a non-finite state, a pool row read (initial_state[2]),
    a wrong shape, in flat.torch and flat.jax (there at run time, under jax.jit)."""
    inputs = recurrence_inputs("la", 1, 4)
    nan_state, nan_pool = states(1), states(4)
    nan_state[0, 1, 2, 3] = nan_pool[2, 0, 0, 0] = np.nan
    nan = re.escape("flat: initial_state: expected finite values, got nan at [0, 1, 2, 3]")
    nan_row = re.escape("flat: initial_state[2]: expected finite values, got nan at [0, 0, 0]")
    conv_shape = re.escape("flat: initial_state: expected shape [B=1, C=6, W-1=3], got [2, 6, 3]")
    t = {n: torch.tensor(x) for n, x in inputs.items()}
    with pytest.raises(ValueError, match=nan):
        ft.la(**t, initial_state=torch.tensor(nan_state))
    with pytest.raises(ValueError, match=nan_row):
        ft.la(**t, initial_state=torch.tensor(nan_pool), initial_state_indices=torch.tensor([2]))
    with pytest.raises(ValueError, match=conv_shape):
        ft.conv(torch.randn(1, 4, 6), torch.randn(6, 4), None, torch.zeros(2, 6, 3))
    jax, jnp, fj = jax_modules()
    j = {n: jnp.asarray(x) for n, x in inputs.items()}
    run = jax.jit(lambda state: fj.la(**j, initial_state=state)[0])
    with pytest.raises(Exception, match=nan):
        run(jnp.asarray(nan_state)).block_until_ready()
    with pytest.raises(ValueError, match=conv_shape):
        fj.conv(jnp.zeros((1, 4, 6)), jnp.zeros((6, 4)), None, jnp.zeros((2, 6, 3)))


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


@pytest.mark.parametrize("option, value, expected", [
    ("solve", "neumann", "auto, subst, blocked or doubling"),
    ("precision", "high", "exact or fast"),
])
def test_unknown_option_names_are_refused_by_both_bindings(option, value, expected):
    jax, jnp, fj = jax_modules()
    message = re.escape(f"flat: {option}: expected {expected}, got '{value}'")
    q = jnp.zeros((1, 4, H, K))
    none = jnp.zeros((0,), jnp.float32)
    ints = jnp.zeros((0,), jnp.int32)
    call = jax.ffi.ffi_call("flat_call", (jax.ShapeDtypeStruct((1, 4, H, K), jnp.float32),
                                          jax.ShapeDtypeStruct((0,), jnp.float32)))
    with pytest.raises(Exception, match=message):
        call(q, q, q, none, jnp.full((1, 4, H), 0.5), none, none, none, ints, ints, ints, ints, operation="forward",
             variant="deltanet", chunk=np.int64(16), **{option: value})[0].block_until_ready()
    x = torch.zeros(1, 4, H, K)
    view = (x.data_ptr(), "f32", tuple(x.shape), tuple(x.stride()))
    beta = torch.full((1, 4, H), 0.5)
    with pytest.raises(ValueError, match=message):
        _core.call("forward", "deltanet", dict(q=view, k=view, v=view, beta=(beta.data_ptr(), "f32", (1, 4, H),
                                                                           beta.stride()), y=view),
                   ([], [], [], []), _core.options("forward", dict(chunk=16, **{option: value})), 1, "flat")

def test_none_is_no_solve_or_precision_name_anywhere():
    """solve=None and precision=None are refused by name in flat.torch, flat.jax and flat.nn's
    layers (with the layer's name): None is none of the names, and leaving the argument out gives
    the default."""
    inputs = recurrence_inputs("deltanet", 1, 4)
    _, jnp, fj = jax_modules()
    for option in ("solve", "precision"):
        message = re.escape(f"flat: {option}: expected a name, got None (leave the argument out for its default)")
        with pytest.raises(ValueError, match=message):
            ft.deltanet(**{n: torch.tensor(x) for n, x in inputs.items()}, **{option: None})
        with pytest.raises(ValueError, match=message):
            fj.deltanet(**{n: jnp.asarray(x) for n, x in inputs.items()}, **{option: None})
    from flat.nn import LAYERS
    for option in ("solve", "precision"):
        message = re.escape(f"flat.nn.DeltaNet: {option}: expected a name, got None (leave the argument out for "
                            "its default)")
        with pytest.raises(ValueError, match=message):
            LAYERS["deltanet"](hidden_size=32, num_heads=2, **{option: None})


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


# ---- FLA 0.6's arguments (python/flat/_api.py), each against a plain PyTorch formula ------------


def fla_inputs(B=2, T=40, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    q, k = (F.normalize(torch.randn(B, T, H, K), dim=-1).to(dtype) for _ in range(2))
    return dict(q=q, k=k, v=torch.randn(B, T, H, V).to(dtype), g=-torch.rand(B, T, H, K) / 4,
                beta=torch.rand(B, T, H), h0=torch.randn(B, H, K, V))


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def grads(outputs, inputs):
    loss = sum((o * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in outputs)
    return torch.autograd.grad(loss, inputs, allow_unused=True)


def assert_close(got, want, rtol=1e-5, atol=1e-6):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def test_bf16_initial_state_is_widened_and_its_gradient_comes_back_in_bf16():
    """FLA's docstrings pass a bfloat16 h0: the kernel reads it widened, exactly as a float32 h0
    holding the same values; its gradient is the float32 one rounded to bfloat16."""
    a = fla_inputs()
    for variant, extra in (("kda", (a["g"], a["beta"])), ("gla", (a["g"],)), ("deltanet", (a["beta"],))):
        h16 = a["h0"].bfloat16().requires_grad_()
        h32 = h16.detach().float().requires_grad_()
        o16, s16 = getattr(ft, variant)(a["q"], a["k"], a["v"], *extra, initial_state=h16, output_final_state=True)
        o32, s32 = getattr(ft, variant)(a["q"], a["k"], a["v"], *extra, initial_state=h32, output_final_state=True)
        assert torch.equal(o16, o32) and torch.equal(s16, s32) and s16.dtype == torch.float32
        (d16,), (d32,) = grads([o16, s16], [h16]), grads([o32, s32], [h32])
        assert d16.dtype == torch.bfloat16 and torch.equal(d16, d32.bfloat16()), variant


def test_state_v_first_transposes_the_states_and_nothing_else():
    a = fla_inputs()
    h0 = leaves(a["h0"])[0]
    hv = leaves(a["h0"].transpose(-1, -2).contiguous())[0]
    o, s = ft.kda(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=h0, output_final_state=True)
    ov, sv = ft.kda(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=hv, output_final_state=True,
                    state_v_first=True)
    assert sv.shape == (2, H, V, K) and torch.equal(o, ov) and torch.equal(s, sv.transpose(-1, -2))
    (dh,), (dhv,) = grads([o, s], [h0]), grads([ov, sv.transpose(-1, -2)], [hv])
    assert torch.equal(dh, dhv.transpose(-1, -2))
    with torch.no_grad(), pytest.raises(ValueError, match="flat: state_v_first: a pool written in place"):
        ft.kda(a["q"][:1], a["k"][:1], a["v"][:1], a["g"][:1], a["beta"][:1], initial_state=torch.zeros(3, H, V, K),
               state_v_first=True, final_state_indices=torch.tensor([0]))


def test_a_state_of_one_value_column_is_read_whatever_its_last_stride():
    """V = 1: a V-first state [N, H, 1, K] transposed to flat's [N, H, K, 1] has a last axis of one
    element whose stride PyTorch leaves at K; it is read as it is."""
    a = fla_inputs()
    v = a["v"][..., :1].contiguous()
    h0 = a["h0"][..., :1].contiguous()
    o, s = ft.kda(a["q"], a["k"], v, a["g"], a["beta"], initial_state=h0, output_final_state=True)
    hv = torch.empty(h0.shape[0], H, 1, K).copy_(h0.transpose(-1, -2))  # strides (H K, K, K, 1)
    ov, sv = ft.kda(a["q"], a["k"], v, a["g"], a["beta"], initial_state=hv, output_final_state=True,
                    state_v_first=True)
    assert torch.equal(o, ov) and torch.equal(s, sv.transpose(-1, -2))


def kda_gate(g, A_log, dt_bias, lower_bound=None):
    """FLA's naive_kda_gate and naive_kda_lowerbound_gate."""
    Hg, D = g.shape[-2:]
    g = g.float() + dt_bias.float().view(Hg, D)
    if lower_bound is None:
        return -A_log.float().view(Hg, 1).exp() * F.softplus(g)
    return lower_bound * torch.sigmoid(A_log.float().view(Hg, 1).exp() * g)


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_kda_and_gdn2_gate_in_kernel_is_the_formula(lower_bound):
    a = fla_inputs()
    raw, A_log, dt_bias = torch.randn(2, 40, H, K), torch.randn(H) / 2, torch.randn(H * K) / 2
    b, w = torch.rand(2, 40, H, K), torch.rand(2, 40, H, V)
    for variant, rest in (("kda", (a["beta"],)), ("gdn2", (b, w))):
        l1 = leaves(raw, A_log, dt_bias)
        o1, _ = getattr(ft, variant)(a["q"], a["k"], a["v"], l1[0], *rest, use_gate_in_kernel=True, A_log=l1[1],
                                     dt_bias=l1[2], lower_bound=lower_bound, safe_gate=lower_bound is not None)
        l2 = leaves(raw, A_log, dt_bias)
        o2, _ = getattr(ft, variant)(a["q"], a["k"], a["v"], kda_gate(*l2, lower_bound), *rest)
        assert torch.equal(o1, o2), variant
        assert_close(grads([o1], l1), grads([o2], l2))


def test_gated_deltanet_gate_and_beta_in_kernel_are_the_formulas():
    a = fla_inputs()
    raw, A_log, dt_bias, braw = torch.randn(2, 40, H), torch.randn(H) / 2, torch.randn(H) / 2, torch.randn(2, 40, H)
    for neg in (False, True):
        l1 = leaves(raw, A_log, dt_bias, braw)
        o1, _ = ft.gated_deltanet(a["q"], a["k"], a["v"], l1[0], l1[3], use_gate_in_kernel=True, A_log=l1[1],
                                  dt_bias=l1[2], use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg)
        l2 = leaves(raw, A_log, dt_bias, braw)
        g = -l2[1].exp() * F.softplus(l2[0] + l2[2])
        beta = torch.sigmoid(l2[3]) * (2 if neg else 1)
        o2, _ = ft.gated_deltanet(a["q"], a["k"], a["v"], g, beta)
        assert torch.equal(o1, o2)
        assert_close(grads([o1], l1), grads([o2], l2))
    l1, l2 = leaves(braw), leaves(braw)
    o1, _ = ft.deltanet(a["q"], a["k"], a["v"], l1[0], use_beta_sigmoid_in_kernel=True)
    o2, _ = ft.deltanet(a["q"], a["k"], a["v"], torch.sigmoid(l2[0]))
    assert torch.equal(o1, o2)
    assert_close(grads([o1], l1), grads([o2], l2))


@pytest.mark.parametrize("call, message", [
    (lambda a: ft.kda(*a, use_gate_in_kernel=True), r"flat: A_log: use_gate_in_kernel=True forms the gate from "
     r"A_log \[2\], got None"),
    (lambda a: ft.kda(*a, use_gate_in_kernel=True, A_log=torch.zeros(3)), r"flat: A_log: expected one value per "
     r"head of g, \[2\], got \[3\]"),
    (lambda a: ft.kda(*a, use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(2)),
     r"flat: dt_bias: expected \[32\] \(H \* D of g \[2, 40, 2, 16\]\), got \[2\]"),
    (lambda a: ft.kda(*a, A_log=torch.zeros(2)), "flat: A_log: forms the gate with use_gate_in_kernel=True"),
    (lambda a: ft.kda(*a, lower_bound=-5.0), "flat: lower_bound: bounds the gate formed with use_gate_in_kernel"),
    (lambda a: ft.kda(*a, use_gate_in_kernel=True, A_log=torch.zeros(2), safe_gate=True),
     r"flat: lower_bound: safe_gate=True with use_gate_in_kernel=True takes a lower_bound in \[-5, 0\)"),
    (lambda a: ft.kda(*a, use_gate_in_kernel=True, A_log=torch.zeros(2), safe_gate=True, lower_bound=-6),
     r"flat: lower_bound: expected a number in \[-5, 0\) with safe_gate=True, got -6"),
    (lambda a: ft.kda(*a, allow_neg_eigval=True), "flat: allow_neg_eigval: doubles sigmoid\\(beta\\), so it takes "
     "use_beta_sigmoid_in_kernel=True"),
])
def test_fla_gate_arguments_refused_by_name(call, message):
    a = fla_inputs()
    with pytest.raises(ValueError, match=message):
        call((a["q"], a["k"], a["v"], a["g"], a["beta"]))


def test_g_gamma_is_retnet_s_gate_and_adds_to_simple_gla_s():
    a = fla_inputs()
    gamma, g = -torch.rand(H) / 4, -torch.rand(2, 40, H) / 4
    want, _ = ft.retnet(a["q"], a["k"], a["v"], gamma)
    assert torch.equal(ft.retnet(a["q"], a["k"], a["v"], g_gamma=gamma)[0], want)
    assert torch.equal(ft.mamba2(a["q"], a["k"], a["v"], g_gamma=gamma)[0], want)
    l1, l2 = leaves(g, gamma), leaves(g, gamma)
    o1, _ = ft.mamba2(a["q"], a["k"], a["v"], l1[0], g_gamma=l1[1])
    o2, _ = ft.mamba2(a["q"], a["k"], a["v"], l2[0] + l2[1])
    assert torch.equal(o1, o2)
    assert_close(grads([o1], l1), grads([o2], l2))
    with pytest.raises(ValueError, match="flat: g, g_gamma: expected the log-decay per head \\[H\\] as g or as "
                                         "g_gamma \\(one of them\\), got both"):
        ft.retnet(a["q"], a["k"], a["v"], gamma, g_gamma=gamma)
    with pytest.raises(ValueError, match="flat: g: expected the log-decay \\[B, T, H\\], or g_gamma \\[H\\]"):
        ft.mamba2(a["q"], a["k"], a["v"])
    with pytest.raises(ValueError, match=r"flat: g_gamma: expected \[H\] beside g \[B, T, H\], got g_gamma \[3\]"):
        ft.mamba2(a["q"], a["k"], a["v"], g, g_gamma=torch.zeros(3))


def normalized_la(q, k, v, kv0, z0, scale=K ** -0.5):
    """FLA's chunk_linear_attn with normalize=True written out: o_t = <scale q_t, kv0 + sum_{s<=t}
    k_s v_s^T> / (<scale q_t, z0 + sum_{s<=t} k_s> + 1e-10); returns o and the final pair (kv, z)."""
    kv = kv0[:, None] + torch.einsum("bthk,bthv->bthkv", k, v).cumsum(1)
    z = z0 + k.cumsum(1)
    o = torch.einsum("bthk,bthkv->bthv", q * scale, kv) / ((q * scale * z).sum(-1, keepdim=True) + 1e-10)
    return o, (kv[:, -1], z[:, -1:])


def positive_features(B=2, T=40, seed=0):
    """q and k through elu + 1 (normalize's use, a positive feature map, so no denominator nears 0),
    v, and FLA's state pair (kv [B, H, K, V], z [B, 1, H, K]) of 7 earlier tokens."""
    torch.manual_seed(seed)
    q, k, k0 = (F.elu(torch.randn(B, n, H, K)) + 1 for n in (T, T, 7))
    v, v0 = torch.randn(B, T, H, V), torch.randn(B, 7, H, V)
    return q, k, v, (torch.einsum("bthk,bthv->bhkv", k0, v0), k0.sum(1, keepdim=True))


def test_la_normalize_is_fla_s_chunk_linear_attn_normalize():
    """FLA 0.6's normalize with its state pair (kv, z), z the key sum: o, the final pair and every
    gradient against the formula in float64; a tensor alone is kv with the key sum from zero."""
    q, k, v, (kv0, z0) = positive_features()
    l1 = leaves(q, k, v, kv0, z0)
    o1, (kv1, z1) = ft.la(*l1[:3], initial_state=(l1[3], l1[4]), output_final_state=True, normalize=True)
    l2 = leaves(*(t.double() for t in (q, k, v, kv0, z0)))
    o2, (kv2, z2) = normalized_la(*l2)
    assert kv1.dtype == z1.dtype == torch.float32 and z1.shape == (2, 1, H, K)
    assert_close([o1.double(), kv1.double(), z1.double()], [o2, kv2, z2])
    assert_close([d.double() for d in grads([o1, kv1, z1], l1)], grads([o2, kv2, z2], l2), rtol=1e-4, atol=1e-5)
    o3, (_, z3) = ft.la(q, k, v, initial_state=kv0, output_final_state=True, normalize=True)
    o4, (_, z4) = normalized_la(*(t.double() for t in (q, k, v, kv0, torch.zeros_like(z0))))
    assert_close([o3.double(), z3.double()], [o4, z4])
    assert ft.la(q, k, v, normalize=True)[1] is None


def test_la_normalize_chains_calls_and_packs_sequences():
    """The pair passed from one call to the next gives the one call's output and state; packed with
    cu_seqlens (FLA's eighth positional argument), each sequence has its own key sum: bitwise each
    sequence alone."""
    q, k, v, state = positive_features()
    o, (kv, z) = ft.la(q, k, v, None, state, True, True)
    o1, s1 = ft.la(q[:, :17], k[:, :17], v[:, :17], initial_state=state, output_final_state=True, normalize=True)
    o2, (kv2, z2) = ft.la(q[:, 17:], k[:, 17:], v[:, 17:], initial_state=s1, output_final_state=True, normalize=True)
    assert_close([torch.cat([o1, o2], 1), kv2, z2], [o, kv, z])
    packed = [t.reshape(1, 80, H, -1) for t in (q, k, v)]
    op, (kvp, zp) = ft.la(*packed, None, state, True, True, torch.tensor([0, 40, 80]))
    assert torch.equal(op, o.reshape(1, 80, H, V)) and torch.equal(kvp, kv) and torch.equal(zp, z)


@pytest.mark.parametrize("call, message", [
    (lambda q, k, v, s: ft.la(q, k, v, initial_state=s), r"flat: initial_state: expected a state \[B, H, K, V\] "
     r"\(the pair \(kv, z\) is la's state with normalize=True\), got a tuple with normalize=False"),
    (lambda q, k, v, s: ft.la(q, k, v, initial_state=(s[0], s[1][:, :, :1]), normalize=True),
     r"flat: initial_state: expected the pair's key sum z \[N, 1, H, K\] = \[2, 1, 2, 16\] with normalize=True, "
     r"got \[2, 1, 1, 16\]"),
    (lambda q, k, v, s: ft.la(q, k, v, initial_state=s + s, normalize=True),
     "flat: initial_state: expected a tensor or the pair \\(kv, z\\) with normalize=True, got a tuple of 4"),
    (lambda q, k, v, s: ft.la(q, k, v, initial_state=torch.zeros(4, H, K, V), normalize=True,
                              initial_state_indices=torch.tensor([0, 1])),
     "flat: normalize: divides by the sum of the keys seen, which a pool's rows do not hold, so it takes no pool, "
     "got initial_state_indices"),
])
def test_la_normalize_refusals(call, message):
    q, k, v, state = positive_features()
    with pytest.raises(ValueError, match=message):
        call(q, k, v, state)


def test_jax_la_normalize_takes_the_pair_as_flat_torch():
    jax, jnp, fj = jax_modules()
    q, k, v, (kv0, z0) = positive_features()
    J = lambda t: jnp.asarray(t.numpy())  # noqa: E731
    o, (kv, z) = ft.la(q, k, v, initial_state=(kv0, z0), output_final_state=True, normalize=True)
    oj, (kvj, zj) = jax.jit(lambda *x: fj.la(*x[:3], None, (x[3], x[4]), True, True))(*map(J, (q, k, v, kv0, z0)))
    for got, want in ((oj, o), (kvj, kv), (zj, z)):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-6, atol=1e-6)


# FLA 0.6's positional order of each function flat has (FLA's signatures, written out): flat takes it
# up to the first argument it lacks, the rest keyword-only.
FLA_POSITIONAL = {
    "la": ["q", "k", "v", "scale", "initial_state", "output_final_state", "normalize", "cu_seqlens"],
    "mamba2": ["q", "k", "v", "g", "g_gamma", "scale", "initial_state", "output_final_state", "state_v_first",
               "cu_seqlens", "cu_seqlens_cpu"],
    "gla": ["q", "k", "v", "g", "scale", "initial_state", "output_final_state", "state_v_first", "cu_seqlens",
            "cu_seqlens_cpu"],
    "deltanet": ["q", "k", "v", "beta", "scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel",
                 "cu_seqlens", "cu_seqlens_cpu"],
    "gated_deltanet": ["q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
                       "use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "state_v_first",
                       "cu_seqlens", "cu_seqlens_cpu", "chunk_indices", "cp_context"],
    "kda": ["q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel",
            "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "safe_gate", "lower_bound",
            "disable_recompute", "return_intermediate_states", "state_v_first", "cu_seqlens"],
    "gdn2": ["q", "k", "v", "g", "b", "w", "scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel",
             "use_gate_in_kernel", "cu_seqlens", "cu_seqlens_cpu", "safe_gate", "lower_bound"],
}


@pytest.mark.parametrize("variant", sorted(FLA_POSITIONAL))
def test_functions_take_fla_s_positional_order(variant):
    fla = FLA_POSITIONAL[variant]
    parameters = inspect.signature(getattr(ft, variant)).parameters
    positional = [n for n, p in parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    shared = next((i for i, name in enumerate(fla) if name not in parameters), len(fla))
    assert positional == fla[:shared]
    assert all(parameters[name].kind == inspect.Parameter.KEYWORD_ONLY for name in fla[shared:] if name in parameters)


def test_a_positional_call_in_fla_s_order_is_the_keyword_call():
    a = fla_inputs(B=1, T=20)
    g, beta, cu = a["g"][..., 0], a["beta"], torch.tensor([0, 7, 20])
    h0 = torch.randn(2, H, K, V)
    o, ht = ft.gated_deltanet(a["q"], a["k"], a["v"], g, beta, 0.3, h0, True, True, True, True, False, cu)
    o2, ht2 = ft.gated_deltanet(a["q"], a["k"], a["v"], g, beta, scale=0.3, initial_state=h0, output_final_state=True,
                                use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                                cu_seqlens=cu)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


def test_conv_activation_is_fla_s():
    """FLA's causal_conv1d default (None: no activation), "swish" as "silu", anything else refused."""
    torch.manual_seed(0)
    x, weight = torch.randn(2, 9, 6), torch.randn(6, 4)
    plain = F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), weight.unsqueeze(1), groups=6).transpose(1, 2)
    for activation, want in ((None, plain), ("none", plain), ("silu", F.silu(plain)), ("swish", F.silu(plain))):
        torch.testing.assert_close(ft.conv(x, weight, activation=activation)[0], want)
    assert torch.equal(ft.conv(x, weight)[0], ft.conv(x, weight, activation=None)[0])
    with pytest.raises(ValueError, match="flat: activation: expected None \\(or 'none'\\) for no activation, or "
                                         "'silu' \\(or 'swish'\\), got 'sigmoid'"):
        ft.conv(x, weight, activation="sigmoid")


def fla_rms_norm_gated(x, g, weight, bias, activation="swish", eps=1e-6):
    """FLA's layer_norm_gated_fwd_kernel with IS_RMS_NORM: (x / rms(x) * weight + bias) * act(g); FLA
    has no activation None, which is flat's act(g) = g."""
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight
    if bias is not None:
        y = y + bias
    if g is None:
        return y
    return y * {"swish": F.silu, "silu": F.silu, "sigmoid": torch.sigmoid, None: lambda z: z}[activation](g)


@pytest.mark.parametrize("activation", ["swish", "silu", "sigmoid", None])
@pytest.mark.parametrize("gate", [True, False])
def test_rms_norm_gated_takes_fla_s_arguments(activation, gate):
    """FLA's positional order (x, g, weight, bias, activation, residual, prenorm, residual_in_fp32,
    eps) and defaults (activation "swish", eps 1e-6), bias and its gradient included."""
    torch.manual_seed(1)
    x, g, weight, bias = torch.randn(2, 5, 3, 16), 2 * torch.randn(2, 5, 3, 16), 1 + torch.randn(16), torch.randn(16)
    l1 = leaves(x, g, weight, bias)
    y1 = ft.rms_norm_gated(l1[0], l1[1] if gate else None, l1[2], l1[3], activation)
    l2 = leaves(*(t.double() for t in (x, g, weight, bias)))
    y2 = fla_rms_norm_gated(l2[0], l2[1] if gate else None, l2[2], l2[3], activation)
    assert_close([y1.double()], [y2], rtol=1e-5, atol=1e-5)
    got, want = grads([y1], l1 if gate else [l1[0], l1[2], l1[3]]), grads([y2], l2 if gate else [l2[0], l2[2], l2[3]])
    assert_close([t.double() for t in got], want, rtol=1e-4, atol=1e-4)


def test_rms_norm_gated_residual_prenorm_and_eps_default():
    torch.manual_seed(2)
    x, g, r, weight = torch.randn(4, 16).bfloat16(), torch.randn(4, 16).bfloat16(), torch.randn(4, 16), torch.ones(16)
    y, summed = ft.rms_norm_gated(x, g, weight, None, "swish", r, True)
    want_sum = x.float() + r
    assert summed.dtype == torch.float32 and torch.equal(summed, want_sum) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), fla_rms_norm_gated(want_sum, g.float(), weight, None), rtol=1e-2, atol=1e-2)
    tiny = torch.full((1, 16), 1e-4)
    torch.testing.assert_close(ft.rms_norm_gated(tiny, None, weight), fla_rms_norm_gated(tiny, None, weight, None))
    with pytest.raises(ValueError, match=r"flat: bias: expected weight's shape \[16\], got \[8\]"):
        ft.rms_norm_gated(x, g, weight, torch.zeros(8))
    with pytest.raises(ValueError, match="flat: activation: expected 'swish' \\(or 'silu'\\), 'sigmoid', or None"):
        ft.rms_norm_gated(x, g, weight, activation="gelu")


def test_jax_takes_fla_s_arguments_as_flat_torch():
    jax, jnp, fj = jax_modules()
    a = fla_inputs()
    J = lambda t: jnp.asarray(t.detach().numpy())  # noqa: E731
    raw, A_log, dt_bias = torch.randn(2, 40, H, K), torch.randn(H) / 2, torch.randn(H * K) / 2
    hv = a["h0"].transpose(-1, -2).contiguous().bfloat16()
    options = dict(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, lower_bound=-5.0, safe_gate=True,
                   use_beta_sigmoid_in_kernel=True, output_final_state=True, state_v_first=True)
    o, s = ft.kda(a["q"], a["k"], a["v"], raw, a["beta"], initial_state=hv, **options)
    oj, sj = fj.kda(*(J(t) for t in (a["q"], a["k"], a["v"], raw, a["beta"])),
                    initial_state=jnp.asarray(hv.float().numpy()).astype(jnp.bfloat16),
                    **{n: J(t) if isinstance(t, torch.Tensor) else t for n, t in options.items()})
    np.testing.assert_allclose(np.asarray(oj), o.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(sj), s.numpy(), rtol=1e-5, atol=1e-6)
    dh = jax.grad(lambda h: fj.kda(*(J(t) for t in (a["q"], a["k"], a["v"], a["g"], a["beta"])),
                                   initial_state=h, state_v_first=True)[0].sum())(J(hv.float()).astype(jnp.bfloat16))
    assert dh.dtype == jnp.bfloat16 and dh.shape == (2, H, V, K)
    x, g, weight, bias = torch.randn(3, 16), torch.randn(3, 16), torch.randn(16), torch.randn(16)
    np.testing.assert_allclose(np.asarray(fj.rms_norm_gated(J(x), J(g), J(weight), J(bias), "sigmoid")),
                               ft.rms_norm_gated(x, g, weight, bias, "sigmoid").numpy(), rtol=1e-6, atol=1e-6)
    xc, wc = torch.randn(1, 7, 6), torch.randn(6, 4)
    np.testing.assert_array_equal(np.asarray(fj.conv(J(xc), J(wc))[0]), ft.conv(xc, wc)[0].numpy())
    np.testing.assert_array_equal(np.asarray(fj.mamba2(J(a["q"]), J(a["k"]), J(a["v"]), g_gamma=J(-torch.rand(H)))[0]
                                             ).shape, (2, 40, H, V))
    with pytest.raises(ValueError, match="flat: allow_neg_eigval"):
        fj.gated_deltanet(J(a["q"]), J(a["k"]), J(a["v"]), J(a["g"][..., 0]), J(a["beta"]), allow_neg_eigval=True)


def test_flat_isa_naming_no_target_is_refused_by_every_call():
    """FLAT_ISA set to a name no target has is refused when a call runs, naming FLAT_ISA and the
    name, never silently running the default target (the C++ tests check every name)."""
    script = ("import torch, flat.torch as ft\n"
              "q = torch.randn(1, 4, 1, 8)\n"
              "try:\n"
              "    ft.la(q, q, q)\n"
              "except ValueError as e:\n"
              "    print(e)\n")
    run = subprocess.run([sys.executable, "-c", script], env={**os.environ, "FLAT_ISA": "avx1024"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "FLAT_ISA" in run.stdout and "'avx1024'" in run.stdout, run.stdout


def test_a_process_that_called_flat_exits_without_nanobind_reporting_leaks():
    """The options flat keeps between calls (_args.checked_options) are freed before the interpreter
    ends, so nanobind's check at exit finds no instance of the extension's types alive."""
    script = ("import torch, flat.torch as ft\n"
              "q = torch.randn(1, 4, 1, 8)\n"
              "ft.la(q, q, q, chunk_size=16)\n"
              "ft.gla(q, q, q, -torch.rand(1, 4, 1, 8))\n"
              "import jax.numpy as jnp, flat.jax as fj\n"
              "x = jnp.ones((1, 4, 1, 8))\n"
              "fj.la(x, x, x)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "leaked" not in run.stderr, run.stderr
